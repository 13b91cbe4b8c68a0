package apiserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"path"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	serverstorage "k8s.io/apiserver/pkg/server/storage"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/storage/storagebackend/factory"
	"k8s.io/apiserver/pkg/storage/value"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/tools/cache"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/utils/clock"

	kdecode "github.com/kproxy/kproxy/internal/decode"
)

// snapshotOptions gives every registry store of the write path the
// apiserver's own REST options (key prefix, storage version, garbage
// collection) with snapshotStorage underneath instead of etcd.
type snapshotOptions struct {
	inner     generic.RESTOptionsGetter
	state     *ClusterState
	resources serverstorage.APIResourceConfigSource
	// scheme and decoder are the group's (kube's legacyscheme, the
	// apiextensions scheme); custom resources need neither.
	scheme  *runtime.Scheme
	decoder runtime.Decoder
	// etcd, when kproxy can read the apiserver's etcd, serves the reads
	// (of read requests and of writes' replays) through the apiserver's
	// own etcd3 store.
	etcd *etcdAccess
	// noEtcd says why etcd is not read (" (...)"), when it is not.
	noEtcd string
	// stores is shared by the replay's servers (kube, apiextensions,
	// custom resources); transformers encrypt at rest as the apiserver's.
	stores       *storeRegistry
	transformers map[schema.GroupResource]value.Transformer
	encErr       error // why the encryption configuration is not loaded
	// clock times the reads (the replay's injected clock).
	clock clock.PassiveClock
	// unencoded holds what read replays read, not to be encoded.
	unencoded *unencoded
}

// storeRegistry holds the storage under each resource's registry store.
type storeRegistry struct {
	mu sync.Mutex
	m  map[schema.GroupResource]*snapshotStorage
}

// add keeps a resource's first store (its own, not a subresource's).
func (r *storeRegistry) add(s *snapshotStorage) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[schema.GroupResource]*snapshotStorage{}
	}
	if _, ok := r.m[s.gr]; !ok {
		r.m[s.gr] = s
	}
}

// get is the storage under a resource's registry store, once built.
func (r *storeRegistry) get(gr schema.GroupResource) *snapshotStorage {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[gr]
}

func (o *snapshotOptions) GetRESTOptions(resource schema.GroupResource, example runtime.Object) (generic.RESTOptions, error) {
	opts, err := o.inner.GetRESTOptions(resource, example)
	if err != nil {
		return opts, err
	}
	opts.CountMetricPollPeriod = 0 // no background polling of the storage
	opts.Decorator = func(config *storagebackend.ConfigForResource, resourcePrefix string, _ func(runtime.Object) (string, error),
		newFunc, newListFunc func() runtime.Object, _ storage.AttrFunc, _ storage.IndexerFuncs, _ *cache.Indexers) (storage.Interface, factory.DestroyFunc, error) {
		s := &snapshotStorage{state: o.state, gr: config.GroupResource, prefix: "/" + strings.Trim(resourcePrefix, "/"), decoder: o.decoder, scheme: o.scheme,
			config: *config, access: o.etcd, transformer: o.transformers[config.GroupResource], noEtcd: o.noEtcd, clock: o.clock, unencoded: o.unencoded,
			newList: newListFunc}
		if s.clock == nil {
			s.clock = clock.RealClock{}
		}
		if o.etcd != nil {
			cfg := *config
			s.etcd = &lazyStore{open: func() (storage.Interface, error) { return o.etcd.store(cfg, newFunc, newListFunc, resourcePrefix) }}
		}
		o.stores.add(s)
		if u, ok := newFunc().(*unstructured.Unstructured); ok {
			// A custom resource's store serves one version of it.
			s.gv, s.decoder, s.scheme = u.GroupVersionKind().GroupVersion(), unstructured.UnstructuredJSONScheme, nil
			return s, func() {}, nil
		}
		s.gv, err = servedVersion(config.GroupResource, newFunc(), o.scheme, o.resources)
		return s, func() {}, err
	}
	return opts, nil
}

// servedVersion is the version the replay reads a resource in: the
// group's preferred version that serves the resource's kind.
func servedVersion(gr schema.GroupResource, example runtime.Object, scheme *runtime.Scheme, rc serverstorage.APIResourceConfigSource) (schema.GroupVersion, error) {
	kinds, _, err := scheme.ObjectKinds(example)
	if err != nil || len(kinds) == 0 {
		return schema.GroupVersion{}, fmt.Errorf("%s: no kind for %T", gr, example)
	}
	for _, gv := range scheme.PrioritizedVersionsForGroup(gr.Group) {
		if rc.ResourceEnabled(gv.WithResource(gr.Resource)) && scheme.Recognizes(gv.WithKind(kinds[0].Kind)) {
			return gv, nil
		}
	}
	return schema.GroupVersion{}, fmt.Errorf("%s: no served version", gr)
}

// snapshotStorage is the storage.Interface under the write path's registry
// stores. It reads the object as it was when the request arrived (see
// Run.snapshotRevision), from etcd through the apiserver's own etcd3
// store when kproxy can read etcd, else through the apiserver with
// kproxy's read-only client, and refuses to write: the replay runs every write in
// dry run, where the registry only reads (DryRunnableStorage).
type snapshotStorage struct {
	state   *ClusterState
	decoder runtime.Decoder
	scheme  *runtime.Scheme // nil for a custom resource
	gr      schema.GroupResource
	gv      schema.GroupVersion
	prefix  string
	// config is the apiserver's storage config for the resource (codec,
	// storage version); etcd its etcd3 store, read-only, when kproxy can
	// read etcd.
	config      storagebackend.ConfigForResource
	transformer value.Transformer // nil: stored as is
	access      *etcdAccess
	etcd        *lazyStore
	noEtcd      string
	clock       clock.PassiveClock
	unencoded   *unencoded
	newList     func() runtime.Object // the resource's list type
}

var errReplayWrite = errors.New("the kproxy replay never writes to the cluster")

// refuseWrite is every read-only store's answer to a write. A write
// reaching storage means the replay was not a dry run (a bug in kproxy, not
// the apiserver's answer), so the run becomes unknown, saying so: kproxy's
// own guard never surfaces as a prediction.
func refuseWrite(ctx context.Context, op, key string) error {
	if run := runFrom(ctx); run != nil {
		run.markUnknown(fmt.Sprintf("the replay tried to %s %s and kproxy refused (it never writes to the cluster): the request was not replayed in dry run, a kproxy bug", op, key))
	}
	return errReplayWrite
}

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

// writtenBefore reports that etcd had reached revision rv before t, as
// far as the compactions kproxy saw say.
func (s *snapshotStorage) writtenBefore(rv string, t time.Time) bool {
	r, err := strconv.ParseInt(rv, 10, 64)
	return err == nil && s.access != nil && s.access.compactions.reachedBefore(r, t)
}

// metBeforeEmptying reads into out the object as stored at rv, the
// resourceVersion an update's answer names when the update removed the
// last finalizers of an object being deleted: the apiserver then deletes
// the object without storing the update, and answers with the request's
// object at the resourceVersion it met. It reports that the state there
// is one the update emptied (being deleted, finalizers left); otherwise
// (a pod in graceful deletion, stored without finalizers: rv is the
// update's own write) out is untouched. An rv older than etcd's last
// compaction (an object left terminating for minutes, its finalizer
// removed at last: probe AL, said unknown, "too old") is the object's
// last stored version if that is what stood just before its delete.
func metBeforeEmptying(ctx context.Context, src objectSource, rv string, out runtime.Object) (bool, error) {
	obj := reflect.New(reflect.TypeOf(out).Elem()).Interface().(runtime.Object)
	found, err := src.at(ctx, rv, obj)
	if apierrors.IsResourceExpired(err) {
		found = lastStoredAt(ctx, src, rv, obj)
		if found {
			err = nil
		}
	}
	if err != nil || !found {
		return false, err
	}
	m, err := meta.Accessor(obj)
	if err != nil || m.GetDeletionTimestamp() == nil || len(m.GetFinalizers()) == 0 {
		return false, err
	}
	reflect.ValueOf(out).Elem().Set(reflect.ValueOf(obj).Elem())
	return true, nil
}

// lastStoredAt reads into obj the object as it stood just before its
// delete, and reports that it was stored at rv (unchanged from rv until
// the delete). What etcd compacted away is read from there: the delete
// is recent, and the object's last version stands until it.
func lastStoredAt(ctx context.Context, src objectSource, rv string, obj runtime.Object) bool {
	if _, err := src.lastExisting(ctx, obj); err != nil {
		return false
	}
	m, err := meta.Accessor(obj)
	return err == nil && m.GetResourceVersion() == rv
}

// listPath is the API path of the collection a list of key reads. A
// list whose field selector names one object (metadata.name=, as kubectl
// delete --field-selector sends it) is given that object's own key, not
// recursive (the registry's MatchesSingle): its collection is the one the
// object is in, and the selector, passed on, picks the object.
func (s *snapshotStorage) listPath(key string, opts storage.ListOptions) (string, error) {
	if opts.Recursive {
		p, _, _, err := s.apiPath(key, true)
		return p, err
	}
	p, _, _, err := s.apiPath(key, false)
	if err != nil {
		return "", err
	}
	return path.Dir(p), nil
}

func (s *snapshotStorage) Get(ctx context.Context, key string, opts storage.GetOptions, out runtime.Object) error {
	if run := runFrom(ctx); run != nil && run.Read {
		return s.readGet(ctx, run, key, opts, out)
	}
	p, ns, name, err := s.apiPath(key, false)
	if err != nil {
		return err
	}
	run := runFrom(ctx)
	read := StorageRead{Key: key, Path: p, Start: s.clock.Now()}
	defer func() {
		read.Duration = s.clock.Since(read.Start)
		if run != nil {
			run.addRead(read)
		}
	}()
	var src objectSource = apiObjects{s: s, path: p, ns: ns, name: name}
	if s.etcd != nil && run != nil {
		src = etcdObjects{s: s, key: key, read: &read}
	}
	if run != nil {
		// For a check after the answer (changedInFlight): the object as
		// it is then, read the same way, into an object of its own.
		typ := reflect.TypeOf(out).Elem()
		// again reads the key afresh, into an object of its own.
		again := func() (objectSource, runtime.Object, error) {
			obj, ok := reflect.New(typ).Interface().(runtime.Object)
			if !ok {
				return nil, nil, fmt.Errorf("%s: not an object", typ)
			}
			if s.etcd != nil {
				return etcdObjects{s: s, key: key, read: &StorageRead{}}, obj, nil
			}
			return apiObjects{s: s, path: p, ns: ns, name: name}, obj, nil
		}
		read.latest = func(ctx context.Context) (bool, string, error) {
			src, obj, err := again()
			if err != nil {
				return false, "", err
			}
			return src.latest(ctx, obj)
		}
		read.atRev = func(ctx context.Context, rev string) (bool, string, error) {
			src, obj, err := again()
			if err != nil {
				return false, "", err
			}
			found, err := src.at(ctx, rev, obj)
			if err != nil || !found {
				return false, "", err
			}
			m, err := meta.Accessor(obj)
			if err != nil {
				return false, "", err
			}
			return true, m.GetResourceVersion(), nil
		}
	}
	found, rv, err := src.latest(ctx, out)
	if found && err == nil && run != nil {
		read.lastWrite = lastWritten(out)
	}
	if err != nil {
		if !storage.IsCorruptObject(err) {
			read.Err = err
			return err
		}
		// An object the store cannot decrypt or decode, which the
		// apiserver's registry read fails on alike (a delete answers its
		// 500; conversionFailedOnlyHere holds it to the apiserver's answer).
		read.Found, read.Undecodable = true, err
		return err
	}
	if run != nil {
		// The request's own write may already be visible, or later ones:
		// read the object as the request met it.
		at, why := run.snapshotRevision(ctx, key, found, rv)
		if before, ok := run.createdOver(ctx, key, rv); ok && found && at == "" && why == "" {
			at = before
		}
		switch {
		case why != "":
			read.Err = errors.New(why)
			return read.Err
		case found && at == "" && run.dryRunCreated(ctx, key):
			read.DryRunCreated, found = rv, false
		case at == lastExisting:
			if at, err = src.lastExisting(ctx, out); err != nil {
				read.Err = err
				return err
			}
			read.Snapshot, found = at, true
			// The last state may be the request's own mark (grace period
			// 0), as below: here another delete (a kubelet's) removed the
			// object between the mark and the request's own deletion, and
			// the apiserver answered 200 with the marked object and no
			// resourceVersion (probe R: 409 had been predicted for it).
			if err = readBeforeOwnMark(ctx, src, run, &read, out); err != nil {
				return err
			}
		case at == beforeOwnMark:
			// The same, read before the other delete removed it. An
			// object of another uid was created after the request
			// deleted its own (probe AN: a delete with a uid or
			// resourceVersion precondition racing an apply that
			// re-created the name, predicted 409 for the 200).
			if err = run.sameDeleted(ctx, out); err != nil {
				// The object before the delete that came ahead of the
				// name's re-creation, where etcd's history says it was
				// the request's (its uid).
				e, isEtcd := src.(etcdObjects)
				if !isEtcd || read.Etcd == nil || !read.Etcd.Found {
					read.Err = err
					return err
				}
				again := read.Etcd.CreateRevision
				prev, perr := e.lastExistingBefore(ctx, again, out)
				if perr != nil || run.sameDeleted(ctx, out) != nil {
					read.Err = err
					return err
				}
				read.Snapshot, read.Recreated = prev, again
			}
			if err = readBeforeOwnMark(ctx, src, run, &read, out); err != nil {
				return err
			}
		case at == beforeOwnWrite:
			// The pod as the newest state that shows the request's
			// write: as it is now, or as it last was before a delete.
			// The first read may have come before the write (the replay
			// starts before the answer): once answered, read again.
			w := ownWriteOf(run)
			if found && !w.done(out) {
				if found, rv, err = src.latest(ctx, out); err != nil {
					read.Err = err
					return err
				}
			}
			if !found {
				if rv, err = src.lastExisting(ctx, out); err != nil {
					read.Err = err
					return err
				}
			}
			own, err := readBeforeOwnWrite(ctx, src, w, rv, run.arrival, run.podMarkedBefore(ns, name), out)
			if err != nil {
				read.Err = err
				return err
			}
			read.Snapshot, read.MarkedAt, found = own.at, own.markedAt, true
			if own.earlier {
				read.MarkedEarlier = fmt.Sprintf("the request met the pod already marked (%s at %s, %s before the request arrived: an earlier request's doing)",
					w.what, own.markedAt.UTC().Format(time.RFC3339), run.arrival.Sub(own.markedAt).Truncate(time.Second))
			} else {
				read.OwnWrite = w.what
			}
		case at != "" && run.createdHere(ctx):
			// Just before its own create the object was absent: no
			// second read for etcd (or the apiserver) to serve.
			read.Snapshot, read.Created, found = at, true, false
		case at != "":
			answered := run.answeredRV(ctx)
			if run.emptiedFinalizers(ctx) {
				met, err := metBeforeEmptying(ctx, src, answered, out)
				if err != nil {
					read.Err = err
					return err
				}
				if met {
					read.Snapshot, read.Emptied, found = answered, true, true
					break
				}
			}
			read.Snapshot = at
			if found && rv != answered {
				read.Later = rv // the replay runs after later writes
			} else if !found && run.Verb != "delete" {
				read.Later = "deleted" // by this request (its last finalizer gone) or a later one
			}
			latestFound, latestEtcd := found, read.Etcd
			if found && rv == answered && s.writtenBefore(answered, run.arrival) {
				// Unchanged since, and written before the request arrived
				// (a compaction kproxy saw before then is past it): the
				// request changed nothing, and kept the resourceVersion.
				// The state before it may be compacted away: out, as read
				// now, is the state the request met (found by a probe: a
				// no-op patch of an object older than the last compaction
				// said unknown, 'too old').
				read.Snapshot, read.NoOp = answered, true
				break
			}
			if found, err = src.at(ctx, at, out); err != nil {
				read.Err = err
				return err
			}
			switch {
			case !found && run.updatedExisting(ctx) && run.ownKey(s.gr, key):
				// The object did not exist before R, yet the request
				// updated it without creating it: R is not the request's
				// write but the object's creation, and the request was a
				// no-op (which keeps the resourceVersion). Another object
				// (a role an RBAC escalation check resolves) absent then
				// is absent, as the apiserver found it (probe AK: said
				// unknown, "not found as of resourceVersion N", 10 of 10).
				read.Snapshot, read.NoOp = answered, true
				if latestFound && rv == answered {
					// Still as the request left it: out holds it (a read
					// that finds nothing leaves out as it was).
					found, read.Etcd = true, latestEtcd
					break
				}
				if found, err = src.at(ctx, answered, out); err == nil && !found {
					err = fmt.Errorf("%s: not found as of resourceVersion %s, which the apiserver answered the request with", p, answered)
				}
				if err != nil {
					read.Err = err
					return err
				}
			case at == answered:
				read.NoOp = true // named in the body, kept by the apiserver
			case found && run.Verb == "delete":
				// The object just before the delete may show the request's
				// own first write: one deleted at once after a graceful
				// mark (a pod not scheduled or terminal, a grace period of
				// 0) is marked, then deleted, in one request; its
				// precondition holds against the state before the mark
				// (the registry moves it onto the mark's resourceVersion).
				if err = readBeforeOwnMark(ctx, src, run, &read, out); err != nil {
					return err
				}
			}
		}
	}
	if !found {
		if opts.IgnoreNotFound {
			return runtime.SetZeroValue(out)
		}
		return storage.NewKeyNotFoundError(key, 0)
	}
	read.Found = true
	if m, err := meta.Accessor(out); err == nil {
		read.ResourceVersion = m.GetResourceVersion()
	}
	return nil
}

// readBeforeOwnMark reads, into out, the object as it was before the
// request's own mark for deletion, where out is that mark
// (ownDeleteMark); otherwise it leaves out as it is.
func readBeforeOwnMark(ctx context.Context, src objectSource, run *Run, read *StorageRead, out runtime.Object) error {
	before, ok := ownDeleteMark(out, run.arrival)
	if !ok {
		return nil
	}
	found, err := src.at(ctx, before, out)
	if err == nil && !found {
		err = fmt.Errorf("absent as of resourceVersion %s, just before its mark for deletion", before)
	}
	if err != nil {
		read.Err = err
		return err
	}
	read.Snapshot, read.MarkedForDelete = before, true
	return nil
}

// ownDeleteMark reports whether obj, the object just before a delete's
// own deletion, is marked for deletion with a grace period of 0 at or
// after the request's arrival (its deletionTimestamp, to the second,
// not clearly earlier: markWindow), and returns the revision before
// that mark: the state the request met. A mark clearly earlier is an
// earlier request's (an object its finalizers kept).
func ownDeleteMark(obj runtime.Object, arrival time.Time) (string, bool) {
	m, err := meta.Accessor(obj)
	if err != nil || m.GetDeletionTimestamp() == nil || m.GetDeletionGracePeriodSeconds() == nil || *m.GetDeletionGracePeriodSeconds() != 0 {
		return "", false
	}
	if earlier, _ := markWindow(m.GetDeletionTimestamp().Time, arrival); earlier || arrival.IsZero() {
		return "", false
	}
	n, err := strconv.ParseUint(m.GetResourceVersion(), 10, 64)
	if err != nil || n < 2 {
		return "", false
	}
	return strconv.FormatUint(n-1, 10), true
}

// objectSource reads the object of a write's replay: as it is now, as it
// was at a resourceVersion, or as it last was before a delete.
type objectSource interface {
	latest(ctx context.Context, out runtime.Object) (found bool, rv string, err error)
	at(ctx context.Context, rv string, out runtime.Object) (found bool, err error)
	lastExisting(ctx context.Context, out runtime.Object) (rv string, err error)
}

// apiObjects reads through the apiserver, with kproxy's client (without
// etcd access): the latest is a GET, a past state a list at an exact
// resourceVersion selecting the name.
type apiObjects struct {
	s              *snapshotStorage
	path, ns, name string
}

func (a apiObjects) latest(ctx context.Context, out runtime.Object) (bool, string, error) {
	if err := a.s.state.admitRead(); err != nil {
		return false, "", err
	}
	raw, err := a.s.state.Client.Discovery().RESTClient().Get().AbsPath(a.path).SetHeader("Accept", "application/json").Do(ctx).Raw()
	switch {
	case apierrors.IsNotFound(err):
		return false, "", nil
	case err != nil:
		return false, "", fmt.Errorf("kproxy could not read %s from the apiserver: %w", a.path, err)
	}
	return true, kdecode.ObjectResourceVersion(raw, ""), a.decode(raw, out)
}

func (a apiObjects) at(ctx context.Context, rv string, out runtime.Object) (bool, error) {
	raw, found, err := a.s.getAt(ctx, a.ns, a.name, rv)
	if err != nil || !found {
		return false, err
	}
	return true, a.decode(raw, out)
}

func (a apiObjects) lastExisting(ctx context.Context, out runtime.Object) (string, error) {
	raw, rv, err := a.s.findLastExisting(ctx, a.ns, a.name)
	if err != nil {
		return "", err
	}
	return rv, a.decode(raw, out)
}

func (a apiObjects) decode(raw []byte, out runtime.Object) error {
	if err := runtime.DecodeInto(a.s.decoder, raw, out); err != nil {
		return fmt.Errorf("decoding %s: %w", a.path, err)
	}
	return nil
}

// etcdObjects reads through the apiserver's own etcd3 store on kproxy's
// etcd client, as the apiserver's registry reads: no load on the
// apiserver, the object decoded from its storage version as the
// apiserver decodes it, and a past state read at its etcd revision. What
// etcd answered (the key's revisions, encoding, encryption) is kept for
// the storage stage, which then need not read the key again.
type etcdObjects struct {
	s    *snapshotStorage
	key  string
	read *StorageRead
}

func (e etcdObjects) latest(ctx context.Context, out runtime.Object) (bool, string, error) {
	err := e.call(ctx, func(ctx context.Context, st storage.Interface) error {
		return st.Get(ctx, e.key, storage.GetOptions{}, out)
	})
	switch {
	case storage.IsNotFound(err):
		return false, "", nil
	case err != nil:
		return false, "", err
	}
	m, err := meta.Accessor(out)
	if err != nil {
		return false, "", err
	}
	return true, m.GetResourceVersion(), nil
}

func (e etcdObjects) at(ctx context.Context, rv string, out runtime.Object) (bool, error) {
	list := e.s.newList()
	err := e.call(ctx, func(ctx context.Context, st storage.Interface) error {
		return st.GetList(ctx, e.key, storage.ListOptions{ResourceVersion: rv, ResourceVersionMatch: metav1.ResourceVersionMatchExact,
			Predicate: storage.Everything}, list)
	})
	if err != nil {
		return false, fmt.Errorf("kproxy could not read %s as of resourceVersion %s from etcd: %w", e.key, rv, err)
	}
	items, err := meta.ExtractList(list)
	if err != nil || len(items) == 0 {
		return false, err
	}
	dst, src := reflect.ValueOf(out), reflect.ValueOf(items[0])
	if dst.Kind() != reflect.Pointer || src.Kind() != reflect.Pointer || dst.Type() != src.Type() {
		return false, fmt.Errorf("%s: the store lists %T, the registry reads into %T", e.key, items[0], out)
	}
	dst.Elem().Set(src.Elem())
	return true, nil
}

// lastExisting finds the request's own delete in etcd's history of the
// key (etcdAccess.deleteRevision) and reads the object just before it.
func (e etcdObjects) lastExisting(ctx context.Context, out runtime.Object) (string, error) {
	d, err := e.s.access.deleteRevision(ctx, e.s.access.key(e.key))
	if err != nil {
		return "", fmt.Errorf("kproxy could not find the object as it was before the request deleted it: %w", err)
	}
	return e.justBefore(ctx, d, out)
}

// justBefore reads the object as it stood just before its delete at
// revision d.
func (e etcdObjects) justBefore(ctx context.Context, d int64, out runtime.Object) (string, error) {
	at := strconv.FormatInt(d-1, 10)
	found, err := e.at(ctx, at, out)
	if err == nil && !found {
		err = fmt.Errorf("etcd %s: absent at revision %s, just before its delete at %d", e.key, at, d)
	}
	return at, err
}

// lastExistingBefore reads the object just before the last delete of its
// key ahead of revision rev (the key's re-creation), from etcd's history.
func (e etcdObjects) lastExistingBefore(ctx context.Context, rev int64, out runtime.Object) (string, error) {
	d, err := e.s.access.deleteBefore(ctx, e.s.access.key(e.key), rev)
	if err != nil {
		return "", err
	}
	return e.justBefore(ctx, d, out)
}

// call runs one read of the etcd3 store, bounded by --replay-etcd-qps,
// and keeps what etcd answered it.
func (e etcdObjects) call(ctx context.Context, read func(context.Context, storage.Interface) error) error {
	var r StorageRead
	c, ok, err := e.s.etcdRead(ctx, &r, read)
	if r.Err != nil {
		return r.Err // not read: shed or no store
	}
	e.read.FromEtcd = true
	if ok {
		kv := e.s.access.kvInfo(ctx, c.key, c.resp, c.latency)
		e.read.Etcd, e.read.EtcdStart = &kv, c.start
	}
	return err
}

// getAt reads one object as it was at resourceVersion rv: a list with an
// exact resourceVersion, selecting the name.
func (s *snapshotStorage) getAt(ctx context.Context, ns, name, rv string) ([]byte, bool, error) {
	p, _, _, err := s.apiPath(s.prefix+"/"+ns, true)
	if ns == "" {
		p, _, _, err = s.apiPath(s.prefix, true)
	}
	if err != nil {
		return nil, false, err
	}
	if err := s.state.admitRead(); err != nil {
		return nil, false, err
	}
	raw, err := s.state.Client.Discovery().RESTClient().Get().AbsPath(p).
		Param("fieldSelector", "metadata.name="+name).Param("resourceVersion", rv).Param("resourceVersionMatch", "Exact").
		SetHeader("Accept", "application/json").Do(ctx).Raw()
	if err != nil {
		return nil, false, fmt.Errorf("kproxy could not read %s/%s as of resourceVersion %s (before the request's own write): %w", p, name, rv, err)
	}
	var list struct {
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, false, fmt.Errorf("reading %s at %s: %w", p, rv, err)
	}
	if len(list.Items) == 0 {
		return nil, false, nil
	}
	// List items carry no kind: give the item its list's.
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	_ = json.Unmarshal(raw, &head)
	var item map[string]any
	if err := json.Unmarshal(list.Items[0], &item); err != nil {
		return nil, false, err
	}
	item["apiVersion"], item["kind"] = head.APIVersion, strings.TrimSuffix(head.Kind, "List")
	b, err := json.Marshal(item)
	return b, true, err
}

// findLastExisting finds the object as it was last stored before it was
// deleted, when the delete's answer (a Status) did not say its
// resourceVersion: exact-resourceVersion reads, going back from the
// current revision until the object appears, then bisecting.
func (s *snapshotStorage) findLastExisting(ctx context.Context, ns, name string) ([]byte, string, error) {
	p, _, _, err := s.apiPath(strings.TrimSuffix(s.prefix+"/"+ns, "/"), true)
	if err != nil {
		return nil, "", err
	}
	if err := s.state.admitRead(); err != nil {
		return nil, "", err
	}
	raw, err := s.state.Client.Discovery().RESTClient().Get().AbsPath(p).Param("limit", "1").
		SetHeader("Accept", "application/json").Do(ctx).Raw()
	if err != nil {
		return nil, "", fmt.Errorf("kproxy could not read the current resourceVersion of %s: %w", p, err)
	}
	var list struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	_ = json.Unmarshal(raw, &list)
	cur, err := strconv.ParseInt(list.Metadata.ResourceVersion, 10, 64)
	if err != nil {
		return nil, "", fmt.Errorf("%s: no current resourceVersion", p)
	}
	probe := func(rv int64) ([]byte, bool, error) { return s.getAt(ctx, ns, name, strconv.FormatInt(rv, 10)) }
	hi, step := cur, int64(1) // hi: not there
	var lo int64
	var obj []byte
	for {
		lo = cur - step
		if lo < 1 {
			return nil, "", fmt.Errorf("%s/%s: deleted by the request, and no earlier version was found", p, name)
		}
		b, ok, err := probe(lo)
		if err != nil {
			return nil, "", err
		}
		if ok {
			obj = b
			break
		}
		hi, step = lo, step*2
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		b, ok, err := probe(mid)
		if err != nil {
			return nil, "", err
		}
		if ok {
			lo, obj = mid, b
		} else {
			hi = mid
		}
	}
	return obj, strconv.FormatInt(lo, 10), nil
}

// bodyResourceVersion is the resourceVersion a request's body names, in
// whatever encoding it was sent (JSON, YAML, protobuf, CBOR): a no-op
// write that named it is told apart by it (Run.snapshotRevision). JSON
// and protobuf are read as far as metadata.resourceVersion, no further.
func bodyResourceVersion(body []byte) string {
	return kdecode.ObjectResourceVersion(body, "")
}

// bodyName is the name a body gives its object (JSON or protobuf), or "".
func bodyName(body []byte) string {
	head, _ := kdecode.ReadObjectHead(body)
	return head.Name
}

// GetList serves the lists of a read and of a deletecollection (the
// registry lists the collection, page by page, before it deletes each
// item) as the apiserver's store would: at the request's resourceVersion
// and continue token, whose errors (a garbled token, an expired or
// future resourceVersion) end the request before anything is deleted.
// Other lists (an admission plugin's) read the latest state.
func (s *snapshotStorage) GetList(ctx context.Context, key string, opts storage.ListOptions, listObj runtime.Object) error {
	if run := runFrom(ctx); run != nil && (run.Read || run.Verb == "deletecollection") {
		return s.readList(ctx, run, key, opts, listObj)
	}
	return s.listViaAPI(ctx, key, opts, listObj)
}

// listViaAPI lists through the apiserver (latest state, selectors and
// limit only).
func (s *snapshotStorage) listViaAPI(ctx context.Context, key string, opts storage.ListOptions, listObj runtime.Object) error {
	p, err := s.listPath(key, opts)
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
	if opts.Predicate.Limit > 0 {
		q.Set("limit", strconv.FormatInt(opts.Predicate.Limit, 10))
	}
	req := s.state.Client.Discovery().RESTClient().Get().AbsPath(p).SetHeader("Accept", "application/json")
	for k, v := range q {
		req = req.Param(k, v[0])
	}
	raw, err := req.Do(ctx).Raw()
	if err != nil {
		return fmt.Errorf("kproxy could not list %s from the apiserver: %w", p, err)
	}
	return runtime.DecodeInto(s.decoder, raw, listObj)
}

func (s *snapshotStorage) Versioner() storage.Versioner { return storage.APIObjectVersioner{} }

func (s *snapshotStorage) Create(ctx context.Context, key string, obj runtime.Object, out runtime.Object, ttl uint64) error {
	if allocationProbe(ctx) {
		return s.asDryRun().Create(ctx, key, obj, out, ttl, true)
	}
	return refuseWrite(ctx, "create", key)
}

// asDryRun answers a write as the registry's dry run does, writing
// nothing: a Service write whose allocations run for real, in memory
// (services.go), still stores nothing.
func (s *snapshotStorage) asDryRun() *genericregistry.DryRunnableStorage {
	return &genericregistry.DryRunnableStorage{Storage: s, Codec: legacyscheme.Codecs.LegacyCodec(legacyscheme.Scheme.PrioritizedVersionsAllGroups()...)}
}

func (s *snapshotStorage) Delete(ctx context.Context, key string, out runtime.Object, pre *storage.Preconditions, validate storage.ValidateObjectFunc, cached runtime.Object, opts storage.DeleteOptions) error {
	if opts.ExpectTransformOrDecodeError && utilfeature.DefaultFeatureGate.Enabled(features.AllowUnsafeMalformedObjectDeletion) {
		return s.unsafeDelete(ctx, key, out, validate)
	}
	if allocationProbe(ctx) {
		// A Service write run as a real allocation: an update that
		// removes the last finalizers of a Service being deleted deletes
		// it (the registry's deleteWithoutFinalizers), in dry run here as
		// its create and update are (found by a probe: said unknown,
		// "kproxy refused", for the apiserver's plain 200).
		return s.asDryRun().Delete(ctx, key, out, pre, validate, true, cached, opts)
	}
	return refuseWrite(ctx, "delete", key)
}

// unsafeDelete answers the delete of the registry's corrupt-object
// deleter (a DELETE with ignoreStoreReadErrorWithClusterBreakingPotential),
// which calls the storage itself, past the dry-run layer, as the etcd3
// store's conditionalDelete decides it, never deleting: the key read live;
// absent, NotFound; an object the store decodes, Invalid ("unsafe deletion
// is not allowed ..."); one it cannot decrypt or decode, the deletion
// validator, which on the replay's dry run aborts the delete (the deleter
// then answers success). A delete answered with a Status removed the key:
// the object is read as etcd's history says it was just before.
func (s *snapshotStorage) unsafeDelete(ctx context.Context, key string, out runtime.Object, validate storage.ValidateObjectFunc) error {
	run := runFrom(ctx)
	if run == nil || s.etcd == nil {
		if run != nil {
			run.markUnknown("an unsafe delete (ignoreStoreReadErrorWithClusterBreakingPotential) turns on whether etcd holds an object the apiserver cannot decrypt or decode: " + needsEtcd + s.noEtcd)
		}
		return errReplayWrite
	}
	p, _, _, _ := s.apiPath(key, false)
	read := StorageRead{Key: key, Path: p, Start: s.clock.Now()}
	defer func() {
		read.Duration = s.clock.Since(read.Start)
		run.addRead(read)
	}()
	src := etcdObjects{s: s, key: key, read: &read}
	found, rv, err := src.latest(ctx, out)
	corrupt := storage.IsCorruptObject(err)
	if err != nil && !corrupt {
		read.Err = err
		return err
	}
	read.ResourceVersion = rv
	if !corrupt {
		at, why := run.snapshotRevision(ctx, key, found, "")
		switch {
		case why != "":
			read.Err = errors.New(why)
			return read.Err
		case at == lastExisting:
			// Deleted by the request: as it was just before.
			read.Snapshot, err = src.lastExisting(ctx, out)
			if corrupt = apierrors.ReasonForError(err) == metav1.StatusReasonStoreReadError; !corrupt {
				read.Err = fmt.Errorf("the apiserver deleted the object as one it cannot decrypt or decode, and etcd's history of the key does not show it so just before the delete: %v", err)
				if err == nil {
					read.Err = errors.New("the apiserver deleted the object as one it cannot decrypt or decode, and kproxy's store decodes it as etcd's history shows it just before the delete: kproxy's encryption keys or conversion webhook answer otherwise, so the request's outcome is not known")
				}
				return read.Err
			}
		case !found:
			read.Refused = storage.NewKeyNotFoundError(s.access.key(key), 0)
			return read.Refused
		}
	}
	if !corrupt {
		read.Found = true
		if run.actual != nil {
			if aw, ok := run.actual(ctx); ok && aw.Status < 300 {
				// The apiserver found it unreadable (it refuses a readable
				// one, dry run or not): it was written again since.
				read.Err = fmt.Errorf("the apiserver deleted the object as one it cannot decrypt or decode (%d), and the replay reads it fine: it was written again after the request, or kproxy's store reads it otherwise, so the request's outcome is not known", aw.Status)
				return read.Err
			}
		}
		// The etcd3 store names the key with its prefix here.
		read.Refused = storage.NewInvalidObjError(s.access.key(key), "unsafe deletion is not allowed because the object is decodable from storage")
		return read.Refused
	}
	read.Found, read.Undecodable = true, err
	if err := validate(ctx, nil); err != nil {
		return err // the dry run's: the delete would have gone ahead
	}
	return refuseWrite(ctx, "delete", key)
}

func (s *snapshotStorage) GuaranteedUpdate(ctx context.Context, key string, out runtime.Object, ignoreNotFound bool, pre *storage.Preconditions, tryUpdate storage.UpdateFunc, cached runtime.Object) error {
	if allocationProbe(ctx) {
		return s.asDryRun().GuaranteedUpdate(ctx, key, out, ignoreNotFound, pre, tryUpdate, true, cached)
	}
	return refuseWrite(ctx, "update", key)
}

func (s *snapshotStorage) Watch(ctx context.Context, key string, opts storage.ListOptions) (watch.Interface, error) {
	if run := runFrom(ctx); run != nil && run.Read {
		// The handler has accepted the watch's options; its events are
		// not replayed: the watch ends at once.
		run.enter(PhaseStorage)
		if _, err := (storage.APIObjectVersioner{}).ParseResourceVersion(opts.ResourceVersion); err != nil {
			// The watch cache parses the resourceVersion before anything
			// else: a plain error, which the handler answers 500.
			read := StorageRead{Key: key, Watch: true, Start: s.clock.Now(), Options: rvOption(opts.ResourceVersion, string(opts.ResourceVersionMatch)),
				Refused: err, BeforeRead: true}
			read.Path, _ = s.listPath(key, opts)
			run.addRead(read)
			return nil, err
		}
		run.mu.Lock()
		run.Watched = true
		run.mu.Unlock()
		return watch.NewEmptyWatch(), nil
	}
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

// lastWritten is when obj was last written, as its managedFields say
// (the newest entry's time, to the second), or zero.
func lastWritten(obj runtime.Object) time.Time {
	m, err := meta.Accessor(obj)
	if err != nil {
		return time.Time{}
	}
	var last time.Time
	for _, f := range m.GetManagedFields() {
		if f.Time != nil && f.Time.After(last) {
			last = f.Time.Time
		}
	}
	return last
}
