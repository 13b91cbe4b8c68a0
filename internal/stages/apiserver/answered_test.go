package apiserver

import (
	"bytes"
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	api "k8s.io/kubernetes/pkg/apis/core"

	_ "k8s.io/kubernetes/pkg/apis/apps/install"  // the apps group in legacyscheme
	_ "k8s.io/kubernetes/pkg/apis/batch/install" // the batch group in legacyscheme
	_ "k8s.io/kubernetes/pkg/apis/core/install"  // the core group in legacyscheme
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
			s := &snapshotStorage{decoder: legacyscheme.Codecs.UniversalDecoder(), scheme: legacyscheme.Scheme, gr: schema.GroupResource{Resource: "configmaps"},
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
			ctx := genericapirequest.WithRequestInfo(context.Background(), &genericapirequest.RequestInfo{APIVersion: "v1", Resource: "configmaps", Verb: run.Verb})
			rv, ok := s.fromAnswer(ctx, run, key, storage.GetOptions{ResourceVersion: c.rv}, out)
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

// TestDecodeJSONAnswer: the fast decode of a JSON answer gives what the
// apiserver's universal decoder gives (defaulted, in the internal
// version), for objects of several groups as the apiserver encodes them,
// and leaves to the universal decoder what it is not sure of.
func TestDecodeJSONAnswer(t *testing.T) {
	replicas := int32(2)
	objects := []runtime.Object{
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", ResourceVersion: "7", Labels: map[string]string{"a": "b"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause", Ports: []corev1.ContainerPort{{ContainerPort: 80}}}}}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ns"}, Data: map[string][]byte{"k": []byte("v")}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "svc", Namespace: "ns"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "ns"}, Spec: appsv1.DeploymentSpec{Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"a": "b"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause"}}}}}},
		&batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "cj", Namespace: "ns"}, Spec: batchv1.CronJobSpec{Schedule: "* * * * *"}},
	}
	for _, obj := range objects {
		gvks, _, err := legacyscheme.Scheme.ObjectKinds(obj)
		if err != nil {
			t.Fatal(err)
		}
		gvk := gvks[0]
		t.Run(gvk.Kind, func(t *testing.T) {
			body, err := runtime.Encode(legacyscheme.Codecs.LegacyCodec(gvk.GroupVersion()), obj)
			if err != nil {
				t.Fatal(err)
			}
			want, err := runtime.Decode(legacyscheme.Codecs.UniversalDecoder(), body)
			if err != nil {
				t.Fatal(err)
			}
			s := &snapshotStorage{scheme: legacyscheme.Scheme}
			ctx := genericapirequest.WithRequestInfo(context.Background(),
				&genericapirequest.RequestInfo{APIGroup: gvk.Group, APIVersion: gvk.Version, Verb: "get"})
			out, err := legacyscheme.Scheme.New(gvk.GroupKind().WithVersion(runtime.APIVersionInternal))
			if err != nil {
				t.Fatal(err)
			}
			got, ok := s.decodeJSONAnswer(ctx, runtime.ContentTypeJSON, body, out)
			if !ok {
				t.Fatal("the fast decode declined an answer the apiserver would write")
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("the fast decode differs from the universal decoder's (-universal +fast):\n%s", diff)
			}
			// Not sure: another version than the request's, another kind,
			// protobuf, a custom resource's store.
			other := &genericapirequest.RequestInfo{APIGroup: gvk.Group, APIVersion: "v9", Verb: "get"}
			for name, c := range map[string]struct {
				ctx context.Context
				mt  string
				s   *snapshotStorage
				out runtime.Object
			}{
				"another version": {ctx: genericapirequest.WithRequestInfo(context.Background(), other), mt: runtime.ContentTypeJSON, s: s, out: out},
				"another kind":    {ctx: ctx, mt: runtime.ContentTypeJSON, s: s, out: &api.Namespace{}},
				"protobuf":        {ctx: ctx, mt: runtime.ContentTypeProtobuf, s: s, out: out},
				"no scheme":       {ctx: ctx, mt: runtime.ContentTypeJSON, s: &snapshotStorage{}, out: out},
				"no request info": {ctx: context.Background(), mt: runtime.ContentTypeJSON, s: s, out: out},
			} {
				if _, ok := c.s.decodeJSONAnswer(c.ctx, c.mt, body, c.out); ok {
					t.Errorf("%s: the fast decode took an answer it should leave to the universal decoder", name)
				}
			}
		})
	}
}
