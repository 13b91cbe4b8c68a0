package apiserver

import (
	"context"
	"mime"
	"net/http"
	"reflect"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/storage"
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
