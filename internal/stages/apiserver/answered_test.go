package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
	// The object's metadata alone, as the apiserver answers
	// as=PartialObjectMetadata (the garbage collector's gets).
	partial := meta.AsPartialObjectMetadata(cm)
	partial.SetGroupVersionKind(metav1.SchemeGroupVersion.WithKind("PartialObjectMetadata"))
	metaScheme := runtime.NewScheme()
	if err := metav1.AddMetaToScheme(metaScheme); err != nil {
		t.Fatal(err)
	}
	metaJSON, err := json.Marshal(partial)
	if err != nil {
		t.Fatal(err)
	}
	var metaPB bytes.Buffer
	if err := protobuf.NewSerializer(metaScheme, metaScheme).Encode(partial, &metaPB); err != nil {
		t.Fatal(err)
	}
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
		// The apiserver's Content-Type for it is the encoding's alone
		// (application/json, not as=PartialObjectMetadata;...).
		{name: "metadata, json", answer: Answer{Status: 200, Body: metaJSON, ContentType: jsonCT}, wantRV: "42", wantDecoded: true},
		{name: "metadata, protobuf", answer: Answer{Status: 200, Body: metaPB.Bytes(), ContentType: pbCT}, wantRV: "42", wantDecoded: true},
		{name: "metadata, v1beta1", answer: Answer{Status: 200, Body: bytes.Replace(metaJSON, []byte(`"meta.k8s.io/v1"`), []byte(`"meta.k8s.io/v1beta1"`), 1),
			ContentType: jsonCT}, wantRV: "42", wantDecoded: true},
		{name: "metadata of another object", key: "/configmaps/ns/other", answer: Answer{Status: 200, Body: metaJSON, ContentType: jsonCT}},
		{name: "metadata in another group", answer: Answer{Status: 200, Body: bytes.Replace(metaJSON, []byte(`"meta.k8s.io/v1"`), []byte(`"example.com/v1"`), 1),
			ContentType: jsonCT}},
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
			case ok && (out.Name != "cm" || out.Namespace != "ns" || out.ResourceVersion != "42"):
				t.Errorf("decoded %+v, want the answer's ConfigMap (its head)", out)
			case !ok && out.Name != "":
				t.Errorf("out was touched although the answer was not taken: %+v", out)
			}
		})
	}
}

// TestAnsweredHead: the head of an answer, as the apiserver encodes it in
// JSON and protobuf for objects of several groups, gives an object of the
// store's type that is the one the universal decoder gives as far as the
// replay looks (which object, at which resourceVersion); any doubt is left
// to the universal decoder.
func TestAnsweredHead(t *testing.T) {
	replicas := int32(2)
	objects := []runtime.Object{
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", ResourceVersion: "7", Labels: map[string]string{"a": "b"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause", Ports: []corev1.ContainerPort{{ContainerPort: 80}}}}}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ns", ResourceVersion: "8"}, Data: map[string][]byte{"k": []byte("v")}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns", ResourceVersion: "9"}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "ns", ResourceVersion: "10"}, Spec: appsv1.DeploymentSpec{Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"a": "b"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause"}}}}}},
		&batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "cj", Namespace: "ns", ResourceVersion: "11"}, Spec: batchv1.CronJobSpec{Schedule: "* * * * *"}},
	}
	for _, obj := range objects {
		gvks, _, err := legacyscheme.Scheme.ObjectKinds(obj)
		if err != nil {
			t.Fatal(err)
		}
		gvk := gvks[0]
		m, err := meta.Accessor(obj)
		if err != nil {
			t.Fatal(err)
		}
		key := "/" + strings.ToLower(gvk.Kind) + "s/" + m.GetName()
		if m.GetNamespace() != "" {
			key = "/" + strings.ToLower(gvk.Kind) + "s/" + m.GetNamespace() + "/" + m.GetName()
		}
		// As the apiserver encodes it: a versioning encoder, which
		// writes the kind.
		pb, err := runtime.Encode(legacyscheme.Codecs.EncoderForVersion(protobuf.NewSerializer(legacyscheme.Scheme, legacyscheme.Scheme), gvk.GroupVersion()), obj)
		if err != nil {
			t.Fatal(err)
		}
		asJSON, err := runtime.Encode(legacyscheme.Codecs.LegacyCodec(gvk.GroupVersion()), obj)
		if err != nil {
			t.Fatal(err)
		}
		for enc, body := range map[string][]byte{"json": asJSON, "protobuf": pb} {
			t.Run(gvk.Kind+"/"+enc, func(t *testing.T) {
				want, err := runtime.Decode(legacyscheme.Codecs.UniversalDecoder(), body)
				if err != nil {
					t.Fatal(err)
				}
				wm, err := meta.Accessor(want)
				if err != nil {
					t.Fatal(err)
				}
				s := &snapshotStorage{scheme: legacyscheme.Scheme, gr: schema.GroupResource{Group: gvk.Group, Resource: strings.ToLower(gvk.Kind) + "s"},
					gv: gvk.GroupVersion(), prefix: "/" + strings.ToLower(gvk.Kind) + "s"}
				ctx := genericapirequest.WithRequestInfo(context.Background(),
					&genericapirequest.RequestInfo{APIGroup: gvk.Group, APIVersion: gvk.Version, Verb: "get"})
				out, err := legacyscheme.Scheme.New(gvk.GroupKind().WithVersion(runtime.APIVersionInternal))
				if err != nil {
					t.Fatal(err)
				}
				got, rv, ok := s.answeredHead(ctx, key, body, out)
				if !ok {
					t.Fatal("answeredHead declined an answer the apiserver would write")
				}
				gm, err := meta.Accessor(got)
				if err != nil {
					t.Fatal(err)
				}
				if reflect.TypeOf(got) != reflect.TypeOf(want) || rv != wm.GetResourceVersion() ||
					gm.GetName() != wm.GetName() || gm.GetNamespace() != wm.GetNamespace() || gm.GetResourceVersion() != rv {
					t.Errorf("answeredHead = %T %s/%s@%s (%q); the universal decoder: %T %s/%s@%s",
						got, gm.GetNamespace(), gm.GetName(), gm.GetResourceVersion(), rv, want, wm.GetNamespace(), wm.GetName(), wm.GetResourceVersion())
				}
				// Not sure: another version than the request's, another
				// kind, another object, no scheme, no request info.
				other := &genericapirequest.RequestInfo{APIGroup: gvk.Group, APIVersion: "v9", Verb: "get"}
				for name, c := range map[string]struct {
					ctx context.Context
					key string
					s   *snapshotStorage
					out runtime.Object
				}{
					"another version": {ctx: genericapirequest.WithRequestInfo(context.Background(), other), key: key, s: s, out: out},
					"another kind":    {ctx: ctx, key: key, s: s, out: &api.ConfigMap{}},
					"another object":  {ctx: ctx, key: key + "x", s: s, out: out},
					"no scheme":       {ctx: ctx, key: key, s: &snapshotStorage{prefix: s.prefix, gr: s.gr}, out: out},
					"no request info": {ctx: context.Background(), key: key, s: s, out: out},
				} {
					if _, _, ok := c.s.answeredHead(c.ctx, c.key, body, c.out); ok {
						t.Errorf("%s: answeredHead took an answer it should leave to the universal decoder", name)
					}
				}
			})
		}
	}
	t.Run("custom resource", func(t *testing.T) {
		gv := schema.GroupVersion{Group: "probe.example.com", Version: "v1"}
		body := []byte(`{"apiVersion":"probe.example.com/v1","kind":"Widget","metadata":{"name":"w1","namespace":"default","resourceVersion":"77"},"spec":{"size":3}}`)
		s := &snapshotStorage{gr: schema.GroupResource{Group: gv.Group, Resource: "widgets"}, gv: gv, prefix: "/probe.example.com/widgets"}
		info := &genericapirequest.RequestInfo{APIGroup: gv.Group, APIVersion: gv.Version, Verb: "get"}
		got, rv, ok := s.answeredHead(genericapirequest.WithRequestInfo(context.Background(), info), "/probe.example.com/widgets/default/w1", body, &unstructured.Unstructured{})
		u, isU := got.(*unstructured.Unstructured)
		if !ok || !isU || rv != "77" || u.GetName() != "w1" || u.GetNamespace() != "default" || u.GetKind() != "Widget" || u.GetAPIVersion() != gv.String() {
			t.Fatalf("answeredHead = %#v, %q, %v; want the Widget w1 at 77", got, rv, ok)
		}
		info.APIVersion = "v2"
		if _, _, ok := s.answeredHead(genericapirequest.WithRequestInfo(context.Background(), info), "/probe.example.com/widgets/default/w1", body, &unstructured.Unstructured{}); ok {
			t.Error("answeredHead took a custom resource in another version than its store's")
		}
	})
}
