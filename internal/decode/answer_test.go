package decode

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/base64"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"
)

// TestObjectResourceVersion: a write's answer as the client got it, large
// (gzip, as the apiserver compresses answers over 128 KiB for a client
// that asks) and cut to what kproxy keeps (256 KiB). Before, only a whole
// uncompressed answer was read: a large create whose replay found its own
// write in etcd was predicted 409 AlreadyExists (seen with kubectl create
// of a 500 KB ConfigMap).
func TestObjectResourceVersion(t *testing.T) {
	const kept = 256 << 10
	cm := func(size int) *corev1.ConfigMap {
		// Random data compresses badly: a gzip answer longer than kept.
		b := make([]byte, size*3/4)
		_, _ = rand.Read(b)
		return &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{Kind: "ConfigMap", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: "default", UID: "u-1", ResourceVersion: "1015",
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl-create", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1"}}},
			Data: map[string]string{"blob": base64.StdEncoding.EncodeToString(b)}}
	}
	js := func(obj runtime.Object) []byte {
		b, err := runtime.Encode(scheme.Codecs.LegacyCodec(corev1.SchemeGroupVersion), obj)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	pb := func(obj runtime.Object) []byte {
		b, err := runtime.Encode(protobuf.NewSerializer(scheme.Scheme, scheme.Scheme), obj)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cut := func(b []byte, n int) []byte { return b[:min(len(b), n)] }
	small, big := cm(1000), cm(900_000)
	pbSmall := pb(small)
	rvAt := bytes.Index(pbSmall, []byte("1015"))
	cr := []byte(`{"apiVersion":"probe.example.com/v1","kind":"Widget","metadata":{"annotations":{"a":"{\"b\":[1,2]}"},"name":"w1","namespace":"default","resourceVersion":"77"},"spec":{"size":3}}`)
	for _, tc := range []struct {
		name, encoding string
		body           []byte
		want           string
	}{
		{"JSON", "", js(small), "1015"},
		{"JSON, large, gzip, cut", "gzip", cut(gzipped(js(big)), kept), "1015"},
		{"JSON, large, cut", "", cut(js(big), kept), "1015"},
		{"protobuf", "", pbSmall, "1015"},
		{"protobuf, large, gzip, cut", "gzip", cut(gzipped(pb(big)), kept), "1015"},
		{"protobuf cut inside the resourceVersion", "", pbSmall[:rvAt+2], ""},
		{"a custom resource (keys in order: metadata after apiVersion and kind)", "GZIP", gzipped(cr), "77"},
		{"YAML", "", []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n  resourceVersion: \"9\"\n"), "9"},
		{"no metadata", "", []byte(`{"kind":"ConfigMap","apiVersion":"v1","data":{}}`), ""},
		{"JSON cut before the resourceVersion", "", []byte(`{"kind":"ConfigMap","metadata":{"name":"x","resour`), ""},
		{"not gzip", "gzip", js(small), ""},
		{"an encoding kproxy does not read", "br", js(small), ""},
		{"empty", "", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ObjectResourceVersion(tc.body, tc.encoding); got != tc.want {
				t.Errorf("resourceVersion %q, want %q (%d bytes)", got, tc.want, len(tc.body))
			}
		})
	}
	// A whole answer reads as the full decode reads it.
	for _, b := range [][]byte{js(small), pbSmall, js(big)} {
		if got, want := ObjectResourceVersion(b, ""), ResourceVersion(b); got != want {
			t.Errorf("streamed %q, decoded %q", got, want)
		}
	}
}

// TestReadObjectHead: the head of an object as the apiserver encodes it,
// in JSON and protobuf, for namespaced and cluster-scoped objects of
// several groups and a custom resource, agrees with a whole decode; a
// body that is not a whole object's head is not read.
func TestReadObjectHead(t *testing.T) {
	objects := []runtime.Object{
		&corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u", ResourceVersion: "7", Labels: map[string]string{"a": "b"},
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m", Operation: metav1.ManagedFieldsOperationApply}}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause"}}}},
		&corev1.Namespace{TypeMeta: metav1.TypeMeta{Kind: "Namespace", APIVersion: "v1"}, ObjectMeta: metav1.ObjectMeta{Name: "ns", ResourceVersion: "9"}},
		&appsv1.Deployment{TypeMeta: metav1.TypeMeta{Kind: "Deployment", APIVersion: "apps/v1"}, ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "ns", GenerateName: "d-", ResourceVersion: "11"}},
	}
	for _, obj := range objects {
		m, err := meta.Accessor(obj)
		if err != nil {
			t.Fatal(err)
		}
		gvk := obj.GetObjectKind().GroupVersionKind()
		want := ObjectHead{APIVersion: gvk.GroupVersion().String(), Kind: gvk.Kind, Name: m.GetName(), Namespace: m.GetNamespace(), ResourceVersion: m.GetResourceVersion()}
		for enc, body := range map[string][]byte{
			"json":     mustEncode(t, scheme.Codecs.LegacyCodec(gvk.GroupVersion()), obj),
			"protobuf": mustEncode(t, protobuf.NewSerializer(scheme.Scheme, scheme.Scheme), obj),
		} {
			if got, ok := ReadObjectHead(body); !ok || got != want {
				t.Errorf("%s %s: ReadObjectHead = %+v, %v; want %+v", gvk.Kind, enc, got, ok, want)
			}
		}
	}
	cr := `{"apiVersion":"probe.example.com/v1","kind":"Widget","metadata":{"annotations":{"a":"{\"b\":[1,2]}"},"name":"w1","namespace":"default","resourceVersion":"77"},"spec":{"size":3}}`
	if got, ok := ReadObjectHead([]byte(cr)); !ok || got != (ObjectHead{"probe.example.com/v1", "Widget", "w1", "default", "77"}) {
		t.Errorf("custom resource: ReadObjectHead = %+v, %v", got, ok)
	}
	for name, body := range map[string]string{
		"empty":                     ``,
		"an array":                  `[{"kind":"Pod"}]`,
		"no metadata":               `{"kind":"Status","apiVersion":"v1","status":"Failure"}`,
		"kind after metadata":       `{"metadata":{"name":"p","resourceVersion":"1"},"kind":"Pod","apiVersion":"v1"}`,
		"no name":                   `{"kind":"Pod","apiVersion":"v1","metadata":{"generateName":"p-"}}`,
		"a name that is not string": `{"kind":"Pod","apiVersion":"v1","metadata":{"name":7}}`,
		"cut in metadata":           `{"kind":"Pod","apiVersion":"v1","metadata":{"na`,
		"protobuf cut":              "k8s\x00\x0a\x05\x0a\x02v1",
		"yaml":                      "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n",
	} {
		if got, ok := ReadObjectHead([]byte(body)); ok {
			t.Errorf("%s: ReadObjectHead = %+v, true; want not read", name, got)
		}
	}
}

func mustEncode(t *testing.T, e runtime.Encoder, obj runtime.Object) []byte {
	t.Helper()
	b, err := runtime.Encode(e, obj)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestObjectEmptiedFinalizers: an update's answer for an object being
// deleted whose last finalizers it removed (the apiserver deleted it),
// as JSON, protobuf and gzip; an object still held by a finalizer, one
// not being deleted, or a cut answer is not.
func TestObjectEmptiedFinalizers(t *testing.T) {
	now := metav1.Now()
	cm := func(deleting bool, finalizers ...string) *corev1.ConfigMap {
		c := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{Kind: "ConfigMap", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: "cm", Namespace: "ns", ResourceVersion: "598", Finalizers: finalizers,
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl-patch", Operation: metav1.ManagedFieldsOperationUpdate}}},
			Data: map[string]string{"k": "v"}}
		if deleting {
			c.DeletionTimestamp = &now
		}
		return c
	}
	js := func(c *corev1.ConfigMap) []byte {
		return mustEncode(t, scheme.Codecs.LegacyCodec(corev1.SchemeGroupVersion), c)
	}
	pb := func(c *corev1.ConfigMap) []byte {
		return mustEncode(t, protobuf.NewSerializer(scheme.Scheme, scheme.Scheme), c)
	}
	emptied, held, alive := cm(true), cm(true, "foregroundDeletion"), cm(false)
	for _, tc := range []struct {
		name     string
		body     []byte
		encoding string
		want     bool
	}{
		{"json, emptied", js(emptied), "", true},
		{"protobuf, emptied", pb(emptied), "", true},
		{"gzip, emptied", gzipped(js(emptied)), "gzip", true},
		{"json, a finalizer left", js(held), "", false},
		{"protobuf, a finalizer left", pb(held), "", false},
		{"json, not being deleted", js(alive), "", false},
		{"protobuf, not being deleted", pb(alive), "", false},
		{"json, cut inside metadata", js(emptied)[:60], "", false},
		{"protobuf, cut", pb(emptied)[:40], "", false},
		{"json, deletionTimestamp null", []byte(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"cm","deletionTimestamp":null}}`), "", false},
		{"a Status", []byte(`{"kind":"Status","apiVersion":"v1","status":"Success"}`), "", false},
		{"another encoding", js(emptied), "br", false},
	} {
		if got := ObjectEmptiedFinalizers(tc.body, tc.encoding); got != tc.want {
			t.Errorf("%s: ObjectEmptiedFinalizers = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// gzipped is b compressed as the apiserver compresses a large answer.
func gzipped(b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	_, _ = w.Write(b)
	_ = w.Close()
	return buf.Bytes()
}
