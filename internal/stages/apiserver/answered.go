package apiserver

import (
	"context"
	"mime"
	"net/http"
	"reflect"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/storage"

	"github.com/kproxy/kproxy/internal/decode"
)

// A get of the latest state that the apiserver answered with 200 carries
// the object the request met: the apiserver read it for this very
// request. The replay of such a get takes the object from the answer
// instead of reading it again. It is the state on arrival, which a later
// read can miss (a write in between), and it spares a read of etcd that
// was a fifth of kproxy's CPU per get. What the answer cannot say, the
// object's etcd key, revisions, encoding and encryption, the storage stage
// then leaves out: a get as kubectl get sends it (a Table), a get at a
// resourceVersion, a 404, and a re-run of the flow still read etcd.
//
// The answer's status decides nothing here: a get answered otherwise is
// read from storage as before, and a refusal is predicted by the stages
// before storage, never taken from the answer.

// fromAnswer puts into out the object a get's 200 answer carries (its
// head only, when answeredHead can read it), and returns its
// resourceVersion. ok is false, and out untouched, unless the
// run is a get of the latest state of the object itself (no
// subresource), answered 200 with the whole body, not compressed, in
// JSON or protobuf, holding the object itself (or its metadata alone,
// as=PartialObjectMetadata; not a Table) of out's type, in the version this store reads, named as key
// names it.
func (s *snapshotStorage) fromAnswer(ctx context.Context, run *Run, key string, opts storage.GetOptions, out runtime.Object) (rv string, ok bool) {
	if run.actual == nil || run.Verb != "get" || run.Subresource != "" || opts.ResourceVersion != "" {
		return "", false
	}
	a, ok := run.actual(ctx)
	if !ok || a.Status != http.StatusOK || a.Body == nil || a.ContentEncoding != "" {
		return "", false
	}
	mt, params, err := mime.ParseMediaType(a.ContentType)
	if err != nil || params["as"] != "" || (mt != "application/json" && mt != "application/vnd.kubernetes.protobuf") {
		return "", false
	}
	if obj, rv, ok := s.answeredHead(ctx, key, a.Body, out); ok {
		reflect.ValueOf(out).Elem().Set(reflect.ValueOf(obj).Elem())
		return rv, true
	}
	obj, err := runtime.Decode(s.decoder, a.Body)
	if err != nil || reflect.TypeOf(obj) != reflect.TypeOf(out) {
		return "", false
	}
	if k := obj.GetObjectKind().GroupVersionKind(); !k.Empty() && k.GroupVersion() != s.gv {
		// A custom resource in another version than this store's (the
		// typed decoder converts to the internal version, no kind left).
		return "", false
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return "", false
	}
	if _, ns, name, err := s.apiPath(key, false); err != nil || m.GetName() != name || m.GetNamespace() != ns {
		return "", false
	}
	reflect.ValueOf(out).Elem().Set(reflect.ValueOf(obj).Elem())
	return m.GetResourceVersion(), true
}

// answeredHead is the object the answer carries, as the replay needs it:
// of out's type, named as the answer names it, nothing else. The replay
// of a get never looks at the object's content: the store's decorators
// (defaults on read for Services and PersistentVolumeClaims) cannot fail,
// and the handler's encoder drops a read's object unencoded
// (unencoded.go); only which object it is matters. Reading just the
// answer's head spares the decode of the whole object, defaulting and
// conversion included (in a paired profile the get's read went from 87
// to 30 µs, of a replay of about 330 µs). ok is false, for the
// universal decoder to decide, unless the answer's head is the
// object key names, of out's kind in the request's version (a built-in
// kind the scheme knows, or this store's custom resource), or the
// built-in object's metadata alone.
func (s *snapshotStorage) answeredHead(ctx context.Context, key string, body []byte, out runtime.Object) (runtime.Object, string, bool) {
	info, ok := genericapirequest.RequestInfoFrom(ctx)
	if !ok {
		return nil, "", false
	}
	head, ok := decode.ReadObjectHead(body)
	if !ok {
		return nil, "", false
	}
	if _, ns, name, err := s.apiPath(key, false); err != nil || head.Name != name || head.Namespace != ns {
		return nil, "", false
	}
	if head.Kind == "PartialObjectMetadata" && (head.APIVersion == "meta.k8s.io/v1" || head.APIVersion == "meta.k8s.io/v1beta1") {
		// The object's metadata alone, as a get with Accept
		// as=PartialObjectMetadata is answered (the garbage collector's,
		// the namespace controller's, metadata informers'; the answer's
		// Content-Type does not say so, its kind does): which object, at
		// which resourceVersion, is all the replay needs of it too, and
		// the handler makes the same PartialObjectMetadata of it from its
		// ObjectMeta alone. Not for a custom resource: its unstructured
		// object needs a kind, which this answer does not name.
		if _, custom := out.(*unstructured.Unstructured); custom {
			return nil, "", false
		}
		return headObject(out, head)
	}
	gv := schema.GroupVersion{Group: info.APIGroup, Version: info.APIVersion}
	if head.APIVersion != gv.String() {
		return nil, "", false
	}
	if _, custom := out.(*unstructured.Unstructured); custom {
		if gv != s.gv {
			return nil, "", false
		}
		u := &unstructured.Unstructured{}
		u.SetAPIVersion(head.APIVersion)
		u.SetKind(head.Kind)
		u.SetName(head.Name)
		u.SetNamespace(head.Namespace)
		u.SetResourceVersion(head.ResourceVersion)
		return u, head.ResourceVersion, true
	}
	if s.scheme == nil {
		return nil, "", false
	}
	kinds, _, err := s.scheme.ObjectKinds(out)
	if err != nil || len(kinds) == 0 || head.Kind != kinds[0].Kind || !s.scheme.Recognizes(gv.WithKind(head.Kind)) {
		return nil, "", false
	}
	return headObject(out, head)
}

// headObject is a new object of out's type named as head names it, at
// its resourceVersion.
func headObject(out runtime.Object, head decode.ObjectHead) (runtime.Object, string, bool) {
	obj, ok := reflect.New(reflect.TypeOf(out).Elem()).Interface().(runtime.Object)
	if !ok {
		return nil, "", false
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, "", false
	}
	m.SetName(head.Name)
	m.SetNamespace(head.Namespace)
	m.SetResourceVersion(head.ResourceVersion)
	return obj, head.ResourceVersion, true
}
