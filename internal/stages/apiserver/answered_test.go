package apiserver

import (
	"bytes"
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	api "k8s.io/kubernetes/pkg/apis/core"

	_ "k8s.io/kubernetes/pkg/apis/core/install" // the core group in legacyscheme
)

// TestFromAnswer: a get's replay takes the object from the apiserver's
// answer only when the answer is the whole object itself, as the store
// would have read it; any doubt reads storage instead.
func TestFromAnswer(t *testing.T) {
	cm := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: "cm", Namespace: "ns", ResourceVersion: "42"}, Data: map[string]string{"k": "v"}}
	asJSON, err := runtime.Encode(legacyscheme.Codecs.LegacyCodec(corev1.SchemeGroupVersion), cm)
	if err != nil {
		t.Fatal(err)
	}
	var pb bytes.Buffer
	if err := protobuf.NewSerializer(legacyscheme.Scheme, legacyscheme.Scheme).Encode(cm, &pb); err != nil {
		t.Fatal(err)
	}
	status := []byte(`{"kind":"Status","apiVersion":"v1","status":"Success"}`)
	const jsonCT, pbCT = "application/json", "application/vnd.kubernetes.protobuf"
	cases := []struct {
		name        string
		verb, sub   string
		rv          string
		key         string
		answer      Answer
		noAnswer    bool
		wantRV      string
		wantDecoded bool
	}{
		{name: "json", answer: Answer{Status: 200, Body: asJSON, ContentType: jsonCT}, wantRV: "42", wantDecoded: true},
		{name: "json with a charset", answer: Answer{Status: 200, Body: asJSON, ContentType: "application/json; charset=utf-8"}, wantRV: "42", wantDecoded: true},
		{name: "protobuf", answer: Answer{Status: 200, Body: pb.Bytes(), ContentType: pbCT}, wantRV: "42", wantDecoded: true},
		{name: "a Table", answer: Answer{Status: 200, Body: asJSON, ContentType: "application/json;as=Table;v=v1;g=meta.k8s.io"}},
		{name: "compressed", answer: Answer{Status: 200, Body: asJSON, ContentType: jsonCT, ContentEncoding: "gzip"}},
		{name: "not kept whole", answer: Answer{Status: 200, ContentType: jsonCT}},
		{name: "404", answer: Answer{Status: 404, Body: asJSON, ContentType: jsonCT}},
		{name: "another object", key: "/configmaps/ns/other", answer: Answer{Status: 200, Body: asJSON, ContentType: jsonCT}},
		{name: "another namespace", key: "/configmaps/elsewhere/cm", answer: Answer{Status: 200, Body: asJSON, ContentType: jsonCT}},
		{name: "a Status, not the object", answer: Answer{Status: 200, Body: status, ContentType: jsonCT}},
		{name: "undecodable", answer: Answer{Status: 200, Body: []byte("{"), ContentType: jsonCT}},
		{name: "yaml", answer: Answer{Status: 200, Body: asJSON, ContentType: "application/yaml"}},
		{name: "at a resourceVersion", rv: "0", answer: Answer{Status: 200, Body: asJSON, ContentType: jsonCT}},
		{name: "a subresource", sub: "status", answer: Answer{Status: 200, Body: asJSON, ContentType: jsonCT}},
		{name: "a write's read", verb: "update", answer: Answer{Status: 200, Body: asJSON, ContentType: jsonCT}},
		{name: "no answer (kproxy explain)", noAnswer: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := &snapshotStorage{decoder: legacyscheme.Codecs.UniversalDecoder(), gr: schema.GroupResource{Resource: "configmaps"},
				gv: corev1.SchemeGroupVersion, prefix: "/configmaps"}
			run := &Run{Verb: "get", Subresource: c.sub, Read: true}
			if c.verb != "" {
				run.Verb = c.verb
			}
			if !c.noAnswer {
				run.actual = func(context.Context) (Answer, bool) { return c.answer, true }
			}
			key := c.key
			if key == "" {
				key = "/configmaps/ns/cm"
			}
			out := &api.ConfigMap{}
			rv, ok := s.fromAnswer(context.Background(), run, key, storage.GetOptions{ResourceVersion: c.rv}, out)
			if ok != c.wantDecoded || rv != c.wantRV {
				t.Fatalf("fromAnswer = %q, %v; want %q, %v", rv, ok, c.wantRV, c.wantDecoded)
			}
			switch {
			case ok && (out.Name != "cm" || out.Data["k"] != "v"):
				t.Errorf("decoded %+v, want the answer's ConfigMap", out)
			case !ok && out.Name != "":
				t.Errorf("out was touched although the answer was not taken: %+v", out)
			}
		})
	}
}
