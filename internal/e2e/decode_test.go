package e2e

import (
	"encoding/json"
	"net/http"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"

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

// TestDecodeRealWatchStreams reads real watch streams in JSON and protobuf
// framing and decodes every event.
func TestDecodeRealWatchStreams(t *testing.T) {
	cmState("t-decode-watch", true)(t)
	path := "/api/v1/namespaces/" + testNS + "/configmaps?watch=1&resourceVersion=0&timeoutSeconds=1&labelSelector=case%3Dt-decode-watch"
	r := directRoute()
	for _, accept := range []string{"application/json", "application/vnd.kubernetes.protobuf;stream=watch"} {
		t.Run(accept, func(t *testing.T) {
			req, _ := http.NewRequest("GET", r.base+path, nil)
			req.Header.Set("Authorization", "Bearer "+tokenOf("admin"))
			req.Header.Set("Accept", accept)
			resp, err := r.client(nil).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var events []decode.Event
			if err := decode.WatchStream(resp.Body, resp.Header.Get("Content-Type"), func(e decode.Event) error {
				events = append(events, e)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if len(events) != 1 || events[0].Type != "ADDED" || events[0].Object.GVK.Kind != "ConfigMap" {
				t.Fatalf("events %+v, want one ADDED ConfigMap", events)
			}
			if cm, ok := events[0].Object.Object.(*corev1.ConfigMap); !ok || cm.Name != "t-decode-watch" {
				t.Errorf("event object %#v", events[0].Object.Object)
			}
		})
	}
}
