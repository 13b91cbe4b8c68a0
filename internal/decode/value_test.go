package decode

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor"
)

// TestValueKeepsUnknownFields: a body is recorded as it says itself, the
// fields the apiserver's schema does not know included (a Strict 400's
// record names them), in JSON, YAML and CBOR alike.
func TestValueKeepsUnknownFields(t *testing.T) {
	obj := map[string]any{"apiVersion": "v1", "kind": "Secret", "bogus": "x",
		"metadata": map[string]any{"name": "s", "bogusMeta": "meta"}, "stringdata": map[string]any{"k": "v"}}
	cborBody, err := runtime.Encode(cbor.NewSerializer(payloadScheme, payloadScheme), &unstructured.Unstructured{Object: obj})
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string][]byte{
		"json": []byte(`{"apiVersion":"v1","kind":"Secret","bogus":"x","metadata":{"name":"s","bogusMeta":"meta"},"stringdata":{"k":"v"}}`),
		"yaml": []byte("apiVersion: v1\nkind: Secret\nbogus: x\nmetadata:\n  name: s\n  bogusMeta: meta\nstringdata:\n  k: v\n"),
		"cbor": cborBody,
	} {
		got, err := Value(body)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if d := cmp.Diff(obj, got); d != "" {
			t.Errorf("%s: (-want +got)\n%s", name, d)
		}
	}
}
