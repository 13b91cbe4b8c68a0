package apiserver

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/server/options/encryptionconfig"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/storage/value"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/transport"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/utils/clock"

	kdecode "github.com/kproxy/kproxy/internal/decode"
)

// etcdAccess is kproxy's read access to the apiserver's etcd, from the
// mirrored --etcd-servers, --etcd-cafile/certfile/keyfile, --etcd-prefix
// and --encryption-provider-config. The storage stage reads through the
// apiserver's own etcd3 store (upstream resourceVersion, continue-token
// and NotFound semantics) and inspects the raw key with a plain client.
// Nothing here writes: the stores are wrapped in readOnlyStore.
type etcdAccess struct {
	prefix       string
	transformers map[schema.GroupResource]value.Transformer
	raw          *clientv3.Client
	kube         *kubernetes.Client // raw, as the etcd3 stores use it
	// limiter sheds the replay's reads past --replay-etcd-qps.
	limiter flowcontrol.RateLimiter
	qps     float64
	clock   clock.PassiveClock
	// compactions are the compactions kproxy saw the apiserver write
	// (compaction.go).
	compactions *compactions
}

// admit takes a token for one read, or says why the read is shed.
func (a *etcdAccess) admit() error {
	if a.limiter.TryAccept() {
		return nil
	}
	return fmt.Errorf("kproxy sheds its own etcd reads past --replay-etcd-qps=%v, so as not to load etcd", a.qps)
}

// NewEtcdClient is a plain etcd client from the apiserver's etcd flags.
func NewEtcdClient(o *Options) (*clientv3.Client, error) {
	if len(o.EtcdServers) == 0 {
		return nil, errors.New("no etcd to read: give --etcd-servers (and --etcd-cafile, --etcd-certfile, --etcd-keyfile) as the apiserver has them, or --apiserver-manifest")
	}
	var tlsCfg *tls.Config
	if o.EtcdCAFile != "" || o.EtcdCertFile != "" {
		var err error
		tlsCfg, err = transport.TLSConfigFor(&transport.Config{TLS: transport.TLSConfig{CAFile: o.EtcdCAFile, CertFile: o.EtcdCertFile, KeyFile: o.EtcdKeyFile}})
		if err != nil {
			return nil, fmt.Errorf("etcd TLS (--etcd-cafile, --etcd-certfile, --etcd-keyfile): %w", err)
		}
	}
	// An etcd kproxy cannot reach would leave a read to its deadline,
	// unexplained: say so now.
	if err := dialAny(o.EtcdServers); err != nil {
		return nil, fmt.Errorf("%w (%v): check --etcd-servers (or the manifest's), that etcd is up, and that kproxy runs where etcd can be reached",
			unreachable(o.EtcdServers), err)
	}
	// The client's own log (retries, a read cancelled as kproxy exits) is
	// not for kproxy's users: kproxy says what a failed read means.
	c, err := clientv3.New(clientv3.Config{Endpoints: o.EtcdServers, TLS: tlsCfg, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd %v: %w", o.EtcdServers, err)
	}
	return c, nil
}

// loadTransformers builds the apiserver's encryption-at-rest transformers
// from its --encryption-provider-config (nil without one).
func loadTransformers(ctx context.Context, o *Options) (map[schema.GroupResource]value.Transformer, error) {
	if o.EncryptionProviderConfig == "" {
		return nil, nil
	}
	cfg, err := encryptionconfig.LoadEncryptionConfig(ctx, o.EncryptionProviderConfig, false, ServerID)
	if err != nil {
		return nil, fmt.Errorf("--encryption-provider-config %s: %w", o.EncryptionProviderConfig, err)
	}
	return cfg.Transformers, nil
}

// newEtcdAccess is nil without --etcd-servers: the replay then reads
// through the apiserver and says so.
func newEtcdAccess(ctx context.Context, o *Options, transformers map[schema.GroupResource]value.Transformer, clk clock.PassiveClock) (*etcdAccess, error) {
	if len(o.EtcdServers) == 0 {
		return nil, nil
	}
	raw, err := NewEtcdClient(o)
	if errors.Is(err, ErrEtcdUnreachable) {
		return nil, fmt.Errorf("%w; when kproxy started: the replay reads through the apiserver until etcd answers, and tries again every %v", err, EtcdRetryInterval)
	}
	if err != nil {
		return nil, err
	}
	// The manifest's --etcd-servers is often loopback on the control
	// plane node, out of kproxy's reach: find out now, not on every read.
	pctx, cancel := context.WithTimeout(ctx, etcdProbeTimeout)
	defer cancel()
	if _, err := raw.Get(pctx, o.EtcdPrefix, clientv3.WithCountOnly()); err != nil {
		_ = raw.Close()
		return nil, fmt.Errorf("%w (%v; when kproxy started: the replay reads through the apiserver until etcd answers, and tries again every %v): check that etcd is up and answers kproxy's etcd client certificate",
			unreachable(o.EtcdServers), err, EtcdRetryInterval)
	}
	raw.KV = recordingKV{KV: raw.KV, clock: clk}
	qps := o.ReplayEtcdQPS
	if qps <= 0 {
		qps = DefaultReplayEtcdQPS
	}
	a := &etcdAccess{raw: raw, prefix: o.EtcdPrefix, transformers: transformers, kube: &kubernetes.Client{Client: raw}, clock: clk,
		limiter: flowcontrol.NewTokenBucketRateLimiter(float32(qps), int(2*qps)), qps: qps}
	a.kube.Kubernetes = a.kube
	a.compactions = &compactions{clock: clk}
	go a.compactions.follow(ctx, raw)
	go func() { <-ctx.Done(); _ = raw.Close() }()
	return a, nil
}

// dialAny connects to the first endpoint that answers, so that an etcd
// out of reach (refused, or a loopback address of another machine) is
// known at once rather than after the client's own probe times out.
// ErrEtcdUnreachable marks an etcd kproxy could not reach when it
// started: unlike a configuration error, time may mend it (etcd was
// restarting), so the replay tries again (EtcdReachable).
var ErrEtcdUnreachable = errors.New("etcd is not reachable from kproxy")

// EtcdRetryInterval is how often the replay tries again an etcd it could
// not reach at start.
const EtcdRetryInterval = 30 * time.Second

type unreachableEtcd struct{ servers []string }

func (u unreachableEtcd) Error() string {
	return fmt.Sprintf("etcd %v is not reachable from kproxy", u.servers)
}
func (u unreachableEtcd) Is(target error) bool { return target == ErrEtcdUnreachable }

func unreachable(servers []string) error { return unreachableEtcd{servers} }

// EtcdAnswers reports whether the apiserver's etcd answers kproxy's
// client now, as the replay's start-up check asks it: a connection, the
// TLS handshake, a count of the prefix's keys.
func EtcdAnswers(ctx context.Context, o *Options) bool {
	if o == nil || len(o.EtcdServers) == 0 {
		return false
	}
	c, err := NewEtcdClient(o)
	if err != nil {
		return false
	}
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(ctx, etcdProbeTimeout)
	defer cancel()
	_, err = c.Get(ctx, o.EtcdPrefix, clientv3.WithCountOnly())
	return err == nil
}

func dialAny(endpoints []string) error {
	var errs []error
	for _, e := range endpoints {
		u, err := url.Parse(e)
		if err != nil || u.Host == "" {
			errs = append(errs, fmt.Errorf("--etcd-servers %q: not a URL", e))
			continue
		}
		c, err := net.DialTimeout("tcp", u.Host, 2*time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// etcdProbeTimeout bounds the start-up check of etcd access;
// etcdReadTimeout one read of the replay, so that an etcd gone away
// makes a prediction unknown, not late.
const (
	etcdProbeTimeout = 5 * time.Second
	etcdReadTimeout  = 10 * time.Second
)

// store opens the apiserver's etcd3 store for one resource (its codec,
// key prefix and encryption) on kproxy's etcd client, read-only. It is
// storagebackend/factory's newETCD3Storage without the compactor, and
// with the client shared: the client records what etcd answered each
// read (see etcdCapture), so that the storage stage reports the key's
// revisions without reading it a second time. With
// AllowUnsafeMalformedObjectDeletion (on by default since 1.37) the
// apiserver wraps its transformer, decoder and store so that an object it
// cannot decrypt or decode is a "corrupt object" StorageError, whose
// message is what a get of it answers; kproxy wraps its alike.
func (a *etcdAccess) store(config storagebackend.ConfigForResource, newFunc, newListFunc func() runtime.Object, resourcePrefix string) (storage.Interface, error) {
	transformer := config.Transformer
	if t, ok := a.transformers[config.GroupResource]; ok {
		transformer = t
	}
	if transformer == nil {
		transformer = identity.NewEncryptCheckTransformer()
	}
	versioner := storage.APIObjectVersioner{}
	decoder := etcd3.NewDefaultDecoder(config.Codec, versioner)
	corruptObjects := utilfeature.DefaultFeatureGate.Enabled(features.AllowUnsafeMalformedObjectDeletion)
	if corruptObjects {
		transformer = etcd3.WithCorruptObjErrorHandlingTransformer(transformer)
		decoder = etcd3.WithCorruptObjErrorHandlingDecoder(decoder)
	}
	s, err := etcd3.New(a.kube, nil, config.Codec, newFunc, newListFunc, a.prefix, resourcePrefix, config.GroupResource,
		transformer, config.LeaseManagerConfig, decoder, versioner)
	if err != nil {
		return nil, fmt.Errorf("etcd store for %s: %w", config.GroupResource, err)
	}
	var st storage.Interface = s
	if corruptObjects {
		st = etcd3.NewStoreWithUnsafeCorruptObjectDeletion(st, config.GroupResource)
	}
	return readOnlyStore{st}, nil
}

// etcdCapture records the etcd reads made with its context: the etcd3
// store's answer, as etcd gave it.
type etcdCapture struct {
	mu    sync.Mutex
	reads []capturedRead
}

type capturedRead struct {
	key     string
	resp    *clientv3.GetResponse
	err     error
	start   time.Time
	latency time.Duration
}

type captureKey struct{}

func withCapture(ctx context.Context, c *etcdCapture) context.Context {
	return context.WithValue(ctx, captureKey{}, c)
}

// recordingKV is the etcd client's KV, recording reads made under an
// etcdCapture.
type recordingKV struct {
	clientv3.KV
	clock clock.PassiveClock
}

func (r recordingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	start := r.clock.Now()
	resp, err := r.KV.Get(ctx, key, opts...)
	if c, ok := ctx.Value(captureKey{}).(*etcdCapture); ok {
		c.mu.Lock()
		c.reads = append(c.reads, capturedRead{key: key, resp: resp, err: err, start: start, latency: r.clock.Since(start)})
		c.mu.Unlock()
	}
	return resp, err
}

// first is the first read the capture saw.
func (c *etcdCapture) first() (capturedRead, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.reads) == 0 {
		return capturedRead{}, false
	}
	return c.reads[0], true
}

// key is the etcd key of a registry storage key.
func (a *etcdAccess) key(registryKey string) string {
	return strings.TrimSuffix("/"+strings.Trim(a.prefix, "/"), "/") + registryKey
}

// EtcdKV is what kproxy shows of one etcd key.
type EtcdKV struct {
	Key            string
	Found          bool
	Revision       int64 // etcd's revision when read
	CreateRevision int64
	ModRevision    int64
	Version        int64
	Lease          int64
	Size           int
	Encoding       kdecode.Format // of the stored payload (after decryption)
	StoredAs       string         // the stored object's apiVersion and kind (the storage version)
	Encryption     string         // "k8s:enc:aesgcm:v1:key1:" or ""
	Latency        time.Duration
	Err            error
}

// inspect reads one key as it is at rev (0: the latest).
func (a *etcdAccess) inspect(ctx context.Context, key string, rev int64) EtcdKV {
	kv := EtcdKV{Key: key}
	if kv.Err = a.admit(); kv.Err != nil {
		return kv
	}
	opts := []clientv3.OpOption{}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	ctx, cancel := context.WithTimeout(ctx, etcdReadTimeout)
	defer cancel()
	start := a.clock.Now()
	resp, err := a.raw.Get(ctx, key, opts...)
	kv.Latency = a.clock.Since(start)
	if err != nil {
		kv.Err = err
		return kv
	}
	return a.kvInfo(ctx, key, resp, kv.Latency)
}

// kvInfo describes what etcd answered a read of one key.
func (a *etcdAccess) kvInfo(ctx context.Context, key string, resp *clientv3.GetResponse, latency time.Duration) EtcdKV {
	kv := EtcdKV{Key: key, Latency: latency, Revision: resp.Header.Revision}
	if len(resp.Kvs) == 0 {
		return kv
	}
	v := resp.Kvs[0]
	kv.Found, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease, kv.Size = true, v.CreateRevision, v.ModRevision, v.Version, v.Lease, len(v.Value)
	if kdecode.IsEncrypted(v.Value) {
		kv.Encryption = kdecode.EncryptionPrefix(v.Value)
		for _, t := range a.transformers {
			if out, _, err := t.TransformFromStorage(ctx, v.Value, value.DefaultContext(key)); err == nil && !kdecode.IsEncrypted(out) {
				kv.Encoding, _ = kdecode.Detect(out)
				kv.StoredAs = storedKind(out)
				break
			}
		}
	} else {
		kv.Encoding, _ = kdecode.Detect(v.Value)
		kv.StoredAs = storedKind(v.Value)
	}
	return kv
}

func (kv EtcdKV) String() string {
	if kv.Err != nil {
		return fmt.Sprintf("etcd %s: read failed: %v", kv.Key, kv.Err)
	}
	if !kv.Found {
		return fmt.Sprintf("etcd %s: absent at revision %d (read in %v)", kv.Key, kv.Revision, kv.Latency.Round(10*time.Microsecond))
	}
	enc := string(kv.Encoding)
	if enc == "" {
		enc = "encoding unknown" // encrypted with a key kproxy was not given
	}
	if kv.StoredAs != "" {
		enc += " (" + kv.StoredAs + ")"
	}
	if kv.Encryption != "" {
		enc += ", encrypted (" + kv.Encryption + ")"
	} else {
		enc += ", not encrypted"
	}
	lease := ""
	if kv.Lease != 0 {
		lease = fmt.Sprintf(", lease %x", kv.Lease)
	}
	return fmt.Sprintf("etcd %s: createRevision %d, modRevision %d, version %d%s, %d bytes, %s (revision %d, read in %v)",
		kv.Key, kv.CreateRevision, kv.ModRevision, kv.Version, lease, kv.Size, enc, kv.Revision, kv.Latency.Round(10*time.Microsecond))
}

// storedKind reads the apiVersion and kind a stored value carries: the
// protobuf envelope's TypeMeta, or a JSON object's.
func storedKind(b []byte) string {
	var tm runtime.TypeMeta
	switch {
	case bytes.HasPrefix(b, []byte("k8s\x00")):
		var u runtime.Unknown
		if u.Unmarshal(b[4:]) != nil {
			return ""
		}
		tm = u.TypeMeta
	case len(b) > 0 && b[0] == '{':
		if json.Unmarshal(b, &tm) != nil {
			return ""
		}
	}
	if tm.Kind == "" {
		return ""
	}
	return tm.APIVersion + " " + tm.Kind
}

// readOnlyStore is an etcd3 store that only reads.
type readOnlyStore struct{ storage.Interface }

func (readOnlyStore) Create(ctx context.Context, key string, _ runtime.Object, _ runtime.Object, _ uint64) error {
	return refuseWrite(ctx, "create", key)
}

func (readOnlyStore) Delete(ctx context.Context, key string, _ runtime.Object, _ *storage.Preconditions, _ storage.ValidateObjectFunc, _ runtime.Object, _ storage.DeleteOptions) error {
	return refuseWrite(ctx, "delete", key)
}

func (readOnlyStore) GuaranteedUpdate(ctx context.Context, key string, _ runtime.Object, _ bool, _ *storage.Preconditions, _ storage.UpdateFunc, _ runtime.Object) error {
	return refuseWrite(ctx, "update", key)
}

func (readOnlyStore) Watch(context.Context, string, storage.ListOptions) (watch.Interface, error) {
	return nil, errors.New("the kproxy replay does not watch etcd")
}

// lazyStore opens a resource's etcd store on its first read.
type lazyStore struct {
	once sync.Once
	open func() (storage.Interface, error)
	s    storage.Interface
	err  error
}

func (l *lazyStore) get() (storage.Interface, error) {
	l.once.Do(func() { l.s, l.err = l.open() })
	return l.s, l.err
}

// deleteRevision finds the revision of the delete that last removed key,
// which is absent now: a write's replay reads the object just before its
// own delete when the apiserver answered it with a Status that names no
// resourceVersion. etcd's history of the key says it exactly: a watch from
// a recent revision replays the key's changes, and the last up to now is
// that delete. (Probing exact revisions cannot: before the object was
// created it is as absent as after, and a short-lived object's window is
// easily stepped over.) The watch reaches back 64, then 1,024, then 16,384
// revisions, no further than etcd has not compacted.
func (a *etcdAccess) deleteRevision(ctx context.Context, key string) (int64, error) {
	if err := a.admit(); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, etcdReadTimeout)
	defer cancel()
	resp, err := a.raw.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	if resp.Count > 0 {
		return 0, fmt.Errorf("etcd %s: the key exists again (created after the request's delete)", key)
	}
	return a.deleteUpTo(ctx, key, resp.Header.Revision)
}

// deleteBefore finds the revision of the delete that last removed key
// before revision rev, when the key was created again: a delete's replay
// that finds the name re-created since (another uid) reads the object
// just before that delete.
func (a *etcdAccess) deleteBefore(ctx context.Context, key string, rev int64) (int64, error) {
	if err := a.admit(); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, etcdReadTimeout)
	defer cancel()
	return a.deleteUpTo(ctx, key, rev-1)
}

// deleteUpTo finds the revision of the last delete of key up to revision
// cur, where key was absent.
func (a *etcdAccess) deleteUpTo(ctx context.Context, key string, cur int64) (int64, error) {
	var compacted int64 // etcd keeps no history before it
	for back := int64(64); back <= 16384; back *= 16 {
		start := max(1, cur-back, compacted)
		d, err := a.lastDelete(ctx, key, start, cur)
		var c compactedError
		if errors.As(err, &c) && compacted == 0 {
			// A quiet cluster: fewer revisions since the compaction than
			// asked for. What etcd still holds is enough.
			compacted = int64(c)
			d, err = a.lastDelete(ctx, key, compacted, cur)
			start = compacted
		}
		if err != nil || d > 0 || start == max(1, compacted) {
			if err == nil && d == 0 {
				err = fmt.Errorf("etcd %s: no delete in its history", key)
			}
			return d, err
		}
	}
	return 0, fmt.Errorf("etcd %s: deleted more than 16384 revisions before the replay read it", key)
}

// lastDelete replays key's changes from revision start up to cur with a
// watch and returns the revision of the last, when it is a delete (0 when
// the key did not change in that range). It asks etcd for a progress
// notification, which etcd sends once the watch has caught up: every
// change up to its revision has been delivered before it.
func (a *etcdAccess) lastDelete(ctx context.Context, key string, start, cur int64) (int64, error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	w := clientv3.NewWatcher(a.raw)
	defer func() { _ = w.Close() }()
	ch := w.Watch(wctx, key, clientv3.WithRev(start), clientv3.WithProgressNotify(), clientv3.WithCreatedNotify())
	// Asked as soon as the watch exists, and again every few ms until it
	// has caught up: a delete's replay waits on this (a probe: deletes
	// replayed in 60 to 235 ms, and bursts of them shed). etcd catches a
	// watch of past revisions up every 100 ms, and answers a request for
	// progress only then; a 50 ms tick added up to 50 ms more.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var last int64
	var deleted bool
	for {
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("etcd %s: its history did not arrive in time: %w", key, ctx.Err())
		case <-tick.C:
			// etcd notifies progress only once the watch has caught up.
			_ = w.RequestProgress(wctx)
		case wr, ok := <-ch:
			switch {
			case !ok:
				return 0, fmt.Errorf("etcd %s: the watch of its history ended", key)
			case wr.CompactRevision != 0:
				return 0, compactedError(wr.CompactRevision)
			case wr.Err() != nil:
				return 0, fmt.Errorf("etcd %s: %w", key, wr.Err())
			case wr.Created:
				_ = w.RequestProgress(wctx)
				continue
			}
			for _, ev := range wr.Events {
				if ev.Kv.ModRevision > cur {
					break
				}
				last, deleted = ev.Kv.ModRevision, ev.Type == clientv3.EventTypeDelete
			}
			if wr.IsProgressNotify() && wr.Header.Revision >= cur || len(wr.Events) > 0 && wr.Events[len(wr.Events)-1].Kv.ModRevision > cur {
				if last > 0 && !deleted {
					return 0, fmt.Errorf("etcd %s: its last change up to revision %d is not a delete", key, cur)
				}
				return last, nil
			}
		}
	}
}

// compactedError: etcd has compacted the history a watch asked for, up to
// this revision.
type compactedError int64

func (c compactedError) Error() string {
	return fmt.Sprintf("etcd has compacted the key's history up to revision %d", int64(c))
}
