package apiserver

import (
	"context"
	"mime"
	"net/http"
	"reflect"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/storage"
	kjson "sigs.k8s.io/json"
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

// fromAnswer decodes into out the object a get's 200 answer carries, and
// returns its resourceVersion. ok is false, and out untouched, unless the
// run is a get of the latest state of the object itself (no
// subresource), answered 200 with the whole body, not compressed, in
// JSON or protobuf, holding the object itself (not a Table or partial
// metadata) of out's type, in the version this store reads, named as key
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
	obj, ok := s.decodeJSONAnswer(ctx, mt, a.Body, out)
	if !ok {
		var err error
		if obj, err = runtime.Decode(s.decoder, a.Body); err != nil {
			return "", false
		}
	}
	if reflect.TypeOf(obj) != reflect.TypeOf(out) {
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

// decodeJSONAnswer decodes a built-in object's JSON answer as the
// universal decoder does (the JSON serializer's non-strict unmarshal,
// then defaulting and conversion to the internal version), less the
// serializer's first pass over the whole body for its apiVersion and kind
// (a quarter of the decode): the answer holds out's kind in the request's
// version, which the decoded object must then say it is. ok is false,
// for the universal decoder to decide, for anything else: a custom
// resource, protobuf, another kind or version, an object with nested
// objects to decode.
func (s *snapshotStorage) decodeJSONAnswer(ctx context.Context, mediaType string, body []byte, out runtime.Object) (runtime.Object, bool) {
	info, ok := genericapirequest.RequestInfoFrom(ctx)
	if !ok || s.scheme == nil || mediaType != runtime.ContentTypeJSON {
		return nil, false
	}
	kinds, _, err := s.scheme.ObjectKinds(out)
	if err != nil || len(kinds) == 0 {
		return nil, false
	}
	gvk := schema.GroupVersionKind{Group: info.APIGroup, Version: info.APIVersion, Kind: kinds[0].Kind}
	ext, err := s.scheme.New(gvk)
	if err != nil {
		return nil, false
	}
	if _, nested := ext.(runtime.NestedObjectDecoder); nested {
		return nil, false
	}
	if err := kjson.UnmarshalCaseSensitivePreserveInts(body, ext); err != nil || ext.GetObjectKind().GroupVersionKind() != gvk {
		return nil, false
	}
	s.scheme.Default(ext)
	obj, err := s.scheme.UnsafeConvertToVersion(ext, runtime.InternalGroupVersioner)
	return obj, err == nil
}
