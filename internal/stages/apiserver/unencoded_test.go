package apiserver

import (
	"bytes"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	api "k8s.io/kubernetes/pkg/apis/core"
)

// TestUnencoded: an object a read's run holds is not encoded (the
// placeholder stands in for it) until the run releases it; any other
// object, and every object of a write's run, is encoded as the
// apiserver's codec encodes it.
func TestUnencoded(t *testing.T) {
	u := &unencoded{}
	ns := u.wrap(legacyscheme.Codecs)
	info, ok := runtime.SerializerInfoForMediaType(ns.SupportedMediaTypes(), runtime.ContentTypeJSON)
	if !ok {
		t.Fatal("no JSON serializer")
	}
	enc := ns.EncoderForVersion(info.Serializer, schema.GroupVersion{Version: "v1"})
	encode := func(obj runtime.Object) string {
		t.Helper()
		var b bytes.Buffer
		if err := enc.Encode(obj, &b); err != nil {
			t.Fatal(err)
		}
		var a bytes.Buffer
		if err := enc.(runtime.EncoderWithAllocator).EncodeWithAllocator(obj, &a, &runtime.Allocator{}); err != nil {
			t.Fatal(err)
		}
		if a.String() != b.String() {
			t.Errorf("Encode %q, EncodeWithAllocator %q", b.String(), a.String())
		}
		return b.String()
	}
	pod := func(name string) *api.Pod {
		return &api.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}}
	}

	read, write := &Run{Read: true}, &Run{}
	held, other, written := pod("held"), pod("other"), pod("written")
	u.hold(read, held)
	u.hold(write, written)
	if got := encode(held); got != string(unencodedPlaceholder) {
		t.Errorf("a held object encoded as %q", got)
	}
	for _, obj := range []*api.Pod{other, written} {
		if got := encode(obj); !bytes.Contains([]byte(got), []byte(`"name":"`+obj.Name+`"`)) {
			t.Errorf("%s encoded as %q, want the object", obj.Name, got)
		}
	}
	u.release(read)
	u.release(write)
	if got := encode(held); !bytes.Contains([]byte(got), []byte(`"kind":"Pod"`)) {
		t.Errorf("a released object encoded as %q, want the object", got)
	}
	n := 0
	u.m.Range(func(any, any) bool { n++; return true })
	if n != 0 || read.unencoded != nil {
		t.Errorf("%d objects still held after release (run keeps %d)", n, len(read.unencoded))
	}
}
