package stages

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/registry/generic"
	serverstorage "k8s.io/apiserver/pkg/server/storage"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/storage/storagebackend/factory"
	"k8s.io/client-go/tools/cache"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
)

// snapshotOptions gives every registry store of the write path the
// apiserver's own REST options (key prefix, storage version, garbage
// collection) with snapshotStorage underneath instead of etcd.
type snapshotOptions struct {
	inner     generic.RESTOptionsGetter
	state     *ClusterState
	resources serverstorage.APIResourceConfigSource
}

func (o *snapshotOptions) GetRESTOptions(resource schema.GroupResource, example runtime.Object) (generic.RESTOptions, error) {
	opts, err := o.inner.GetRESTOptions(resource, example)
	if err != nil {
		return opts, err
	}
	opts.CountMetricPollPeriod = 0 // no background polling of the storage
	opts.Decorator = func(config *storagebackend.ConfigForResource, resourcePrefix string, _ func(runtime.Object) (string, error),
		newFunc, newListFunc func() runtime.Object, _ storage.AttrFunc, _ storage.IndexerFuncs, _ *cache.Indexers) (storage.Interface, factory.DestroyFunc, error) {
		s := &snapshotStorage{state: o.state, gr: config.GroupResource, prefix: "/" + strings.Trim(resourcePrefix, "/")}
		s.gv, err = servedVersion(config.GroupResource, newFunc(), o.resources)
		return s, func() {}, err
	}
	return opts, nil
}

// servedVersion is the version the replay reads a resource in: the
// group's preferred version that serves the resource's kind.
func servedVersion(gr schema.GroupResource, example runtime.Object, rc serverstorage.APIResourceConfigSource) (schema.GroupVersion, error) {
	kinds, _, err := legacyscheme.Scheme.ObjectKinds(example)
	if err != nil || len(kinds) == 0 {
		return schema.GroupVersion{}, fmt.Errorf("%s: no kind for %T", gr, example)
	}
	for _, gv := range legacyscheme.Scheme.PrioritizedVersionsForGroup(gr.Group) {
		if rc.ResourceEnabled(gv.WithResource(gr.Resource)) && legacyscheme.Scheme.Recognizes(gv.WithKind(kinds[0].Kind)) {
			return gv, nil
		}
	}
	return schema.GroupVersion{}, fmt.Errorf("%s: no served version", gr)
}

// snapshotStorage is the storage.Interface under the write path's registry
// stores. It reads the cluster through the apiserver with kproxy's
// read-only client, as the object was when the request arrived (see
// writeRun.snapshot), and refuses to write: the replay runs every write in
// dry run, where the registry only reads (DryRunnableStorage).
type snapshotStorage struct {
	state  *ClusterState
	gr     schema.GroupResource
	gv     schema.GroupVersion
	prefix string
}

var errReplayWrite = errors.New("the kproxy replay never writes to the cluster")

// apiPath turns a storage key (/<prefix>/<namespace>/<name>, or
// /<prefix>/<name> for cluster-scoped resources) into the REST path of the
// object, or of the collection for a list key.
func (s *snapshotStorage) apiPath(key string, list bool) (p, ns, name string, err error) {
	rest, ok := strings.CutPrefix(key, s.prefix)
	if !ok {
		return "", "", "", fmt.Errorf("storage key %q is not under %q", key, s.prefix)
	}
	parts := strings.Split(strings.Trim(rest, "/"), "/")
	if len(parts) == 1 && parts[0] == "" {
		parts = nil
	}
	base := "/apis/" + s.gv.Group + "/" + s.gv.Version
	if s.gv.Group == "" {
		base = "/api/" + s.gv.Version
	}
	switch {
	case list && len(parts) == 0:
		return path.Join(base, s.gr.Resource), "", "", nil
	case list && len(parts) == 1:
		return path.Join(base, "namespaces", parts[0], s.gr.Resource), parts[0], "", nil
	case !list && len(parts) == 1:
		return path.Join(base, s.gr.Resource, parts[0]), "", parts[0], nil
	case !list && len(parts) == 2:
		return path.Join(base, "namespaces", parts[0], s.gr.Resource, parts[1]), parts[0], parts[1], nil
	}
	return "", "", "", fmt.Errorf("storage key %q: unexpected shape", key)
}

func (s *snapshotStorage) Get(ctx context.Context, key string, opts storage.GetOptions, out runtime.Object) error {
	p, _, _, err := s.apiPath(key, false)
	if err != nil {
		return err
	}
	run := runFrom(ctx)
	start := time.Now()
	raw, err := s.state.Client.Discovery().RESTClient().Get().AbsPath(p).SetHeader("Accept", "application/json").Do(ctx).Raw()
	read := storageRead{Key: key, Path: p, Duration: time.Since(start)}
	defer func() {
		if run != nil {
			run.addRead(read)
		}
	}()
	if apierrors.IsNotFound(err) {
		if opts.IgnoreNotFound {
			return runtime.SetZeroValue(out)
		}
		return storage.NewKeyNotFoundError(key, 0)
	}
	if err != nil {
		read.Err = err
		return fmt.Errorf("kproxy could not read %s from the apiserver: %w", p, err)
	}
	if err := runtime.DecodeInto(legacyscheme.Codecs.UniversalDecoder(), raw, out); err != nil {
		read.Err = err
		return fmt.Errorf("decoding %s: %w", p, err)
	}
	read.Found = true
	if m, err := meta.Accessor(out); err == nil {
		read.ResourceVersion = m.GetResourceVersion()
	}
	return nil
}

func (s *snapshotStorage) GetList(ctx context.Context, key string, opts storage.ListOptions, listObj runtime.Object) error {
	p, _, _, err := s.apiPath(key, true)
	if err != nil {
		return err
	}
	q := url.Values{}
	if opts.Predicate.Label != nil && !opts.Predicate.Label.Empty() {
		q.Set("labelSelector", opts.Predicate.Label.String())
	}
	if opts.Predicate.Field != nil && !opts.Predicate.Field.Empty() {
		q.Set("fieldSelector", opts.Predicate.Field.String())
	}
	req := s.state.Client.Discovery().RESTClient().Get().AbsPath(p).SetHeader("Accept", "application/json")
	for k, v := range q {
		req = req.Param(k, v[0])
	}
	raw, err := req.Do(ctx).Raw()
	if err != nil {
		return fmt.Errorf("kproxy could not list %s from the apiserver: %w", p, err)
	}
	return runtime.DecodeInto(legacyscheme.Codecs.UniversalDecoder(), raw, listObj)
}

func (s *snapshotStorage) Versioner() storage.Versioner { return storage.APIObjectVersioner{} }

func (s *snapshotStorage) Create(context.Context, string, runtime.Object, runtime.Object, uint64) error {
	return errReplayWrite
}

func (s *snapshotStorage) Delete(context.Context, string, runtime.Object, *storage.Preconditions, storage.ValidateObjectFunc, runtime.Object, storage.DeleteOptions) error {
	return errReplayWrite
}

func (s *snapshotStorage) GuaranteedUpdate(context.Context, string, runtime.Object, bool, *storage.Preconditions, storage.UpdateFunc, runtime.Object) error {
	return errReplayWrite
}

func (s *snapshotStorage) Watch(context.Context, string, storage.ListOptions) (watch.Interface, error) {
	return nil, errors.New("the kproxy replay does not watch through its storage")
}

func (s *snapshotStorage) Stats(context.Context) (storage.Stats, error) { return storage.Stats{}, nil }
func (s *snapshotStorage) ReadinessCheck() error                        { return nil }
func (s *snapshotStorage) RequestWatchProgress(context.Context) error   { return nil }
func (s *snapshotStorage) GetCurrentResourceVersion(context.Context) (uint64, error) {
	return 0, errors.New("not known to the kproxy replay")
}
func (s *snapshotStorage) EnableResourceSizeEstimation(storage.KeysFunc) error { return nil }
func (s *snapshotStorage) CompactRevision() int64                              { return 0 }
