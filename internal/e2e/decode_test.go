package e2e

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/kproxy/kproxy/internal/decode"
)

// TestDecodeRealPayloads decodes what the real apiserver answers in
// protobuf and YAML and compares it with its JSON answer for the same
// object. (CBOR serving is behind a feature gate that is off in v1.37:
// the unit tests cover CBOR with the apiserver's own serializer.)
func TestDecodeRealPayloads(t *testing.T) {
	cmState("t-decode", true)(t)
	path := "/api/v1/namespaces/" + testNS + "/configmaps/t-decode"
	r := directRoute()
	asJSON := do(t, r.client(nil), r.base, request{method: "GET", path: path, user: "admin", accept: "application/json"})
	var want map[string]any
	if err := json.Unmarshal(asJSON.body, &want); err != nil {
		t.Fatal(err)
	}
	for _, accept := range []string{"application/vnd.kubernetes.protobuf", "application/yaml"} {
		t.Run(accept, func(t *testing.T) {
			ex := do(t, r.client(nil), r.base, request{method: "GET", path: path, user: "admin", accept: accept})
			if ex.status != 200 {
				t.Fatalf("status %d", ex.status)
			}
			d, err := decode.Payload(ex.body)
			if err != nil {
				t.Fatalf("decode %s answer: %v", accept, err)
			}
			j, err := d.JSON()
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			if err := json.Unmarshal(j, &got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s decodes to\n%s\nwant (the JSON answer)\n%s", accept, j, asJSON.body)
			}
		})
	}
}
