package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// ClusterState is the replay's read-only view of the cluster: shared
// informers on the upstream (one list, then watch), and a client that can
// only read, so that nothing the replay runs can write to the cluster.
type ClusterState struct {
	// Config is the read-only client configuration (the write path's
	// "loopback" clients use it).
	Config    *rest.Config
	Client    kubernetes.Interface
	Informers informers.SharedInformerFactory
	// reads sheds a write replay's reads through the apiserver past
	// readQPS (SetReplayReadQPS).
	reads   flowcontrol.RateLimiter
	readQPS float64
	// extra are narrower factories (bootstrap-token secrets in
	// kube-system), started and synced with Informers.
	extra         []informers.SharedInformerFactory
	synced        func() bool
	secretsSynced func() bool
	secretsErr    atomic.Pointer[error]
}

// NewClusterState builds the state over kproxy's own client config.
// Informers are registered by the stages that need them; Start runs them.
func NewClusterState(cfg *rest.Config) (*ClusterState, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 50, 100
	cfg.UserAgent = "kproxy-replay"
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return readOnly{rt} })
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("replay client: %w", err)
	}
	st := &ClusterState{Config: cfg, Client: cs, Informers: informers.NewSharedInformerFactory(cs, 0)}
	st.SetReplayReadQPS(DefaultReplayAPIServerQPS)
	return st, nil
}

// SetReplayReadQPS bounds the reads a write's replay makes through the
// apiserver (the object before the write, an older revision of it): past
// qps (bursts of twice that), a read is shed and the prediction says
// unknown, rather than multiply the load on a struggling apiserver. The
// informers are not counted: they list once and then watch.
func (s *ClusterState) SetReplayReadQPS(qps float64) {
	if qps <= 0 {
		qps = DefaultReplayAPIServerQPS
	}
	s.readQPS = qps
	s.reads = flowcontrol.NewTokenBucketRateLimiter(float32(qps), int(2*qps))
}

// admitRead takes a token for one replay read, or says why it is shed.
func (s *ClusterState) admitRead() error {
	if s.reads == nil || s.reads.TryAccept() {
		return nil
	}
	return fmt.Errorf("kproxy sheds its own apiserver reads past --replay-apiserver-qps=%v, so as not to load the apiserver", s.readQPS)
}

// Start runs the informers and waits, at most timeout, for their caches.
// It returns an error if they did not sync in time: predictions stay
// unknown until they do.
//
// Secrets are not waited for. kube-apiserver serves requests whatever its
// informers' state, and a Secret it cannot decrypt (a key lost in a
// rotation: the very incident) fails every list of secrets until it is
// removed: waiting for them would leave every prediction unknown then.
// The replay reads secrets where the apiserver does: its service-account
// token getter falls back to a live read where its lister misses, and the
// bootstrap-token authenticator, which does not, is asked only once the
// bootstrap-token secrets have synced (SecretsSynced). Start waits for
// them as for the rest until a list of them fails (SecretsClient).
func (s *ClusterState) Start(ctx context.Context, timeout time.Duration) error {
	all := append([]informers.SharedInformerFactory{s.Informers}, s.extra...)
	for _, f := range all {
		f.Start(ctx.Done())
	}
	// The gate counts the informers the replay registered before Start.
	// Admission policies add informers of their paramKind later (a
	// ConfigMap informer for a policy whose params are ConfigMaps); their
	// sync is the policy plugin's to check, as in the apiserver, and one
	// that cannot sync (kproxy may not list the kind; a snapshot holds only
	// the named objects of it) must not hold every prediction unknown.
	own := startedTypes(all)
	var missing []string
	_ = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		missing = unsynced(all, own, func(typ reflect.Type) bool { return typ != secretType || s.SecretsErr() == nil })
		return len(missing) == 0, nil
	})
	s.synced = syncedLatch(all, own, func(typ reflect.Type) bool { return typ != secretType })
	s.secretsSynced = syncedLatch(all, own, func(typ reflect.Type) bool { return typ == secretType })
	if len(missing) > 0 {
		return fmt.Errorf("cluster state not synced after %v: %v (kproxy's identity may lack list/watch on them)", timeout, missing)
	}
	return nil
}

// startedTypes are the types of each factory's started informers.
func startedTypes(all []informers.SharedInformerFactory) []map[reflect.Type]bool {
	own := make([]map[reflect.Type]bool, len(all))
	for i, f := range all {
		own[i] = map[reflect.Type]bool{}
		for typ := range f.WaitForCacheSync(closed) {
			own[i][typ] = true
		}
	}
	return own
}

var secretType = reflect.TypeFor[*corev1.Secret]()

// syncedLatch reports whether the informers of the types counted have
// synced, and keeps saying so once they have: informers do not unsync.
func syncedLatch(all []informers.SharedInformerFactory, own []map[reflect.Type]bool, counted func(reflect.Type) bool) func() bool {
	var done atomic.Bool
	return func() bool {
		if done.Load() {
			return true
		}
		if len(unsynced(all, own, counted)) > 0 {
			return false
		}
		done.Store(true)
		return true
	}
}

// unsynced names the informers of own (each factory's, started by
// Start) of the types counted that have not synced.
func unsynced(all []informers.SharedInformerFactory, own []map[reflect.Type]bool, counted func(reflect.Type) bool) []string {
	var missing []string
	for i, f := range all {
		for typ, ok := range f.WaitForCacheSync(closed) {
			if !ok && own[i][typ] && counted(typ) {
				missing = append(missing, typ.String())
			}
		}
	}
	return missing
}

var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// AddFactory adds a narrower informer factory (bootstrap-token secrets in
// kube-system), started and synced with Informers. Add before Start.
func (s *ClusterState) AddFactory(f informers.SharedInformerFactory) { s.extra = append(s.extra, f) }

// Synced reports whether every informer has synced, Secrets aside (see
// Start).
func (s *ClusterState) Synced() bool { return s != nil && s.synced != nil && s.synced() }

// SecretsClient is a client for informers of secrets that keeps the
// last failure of a list of them (SecretsErr), for Start: a list the
// apiserver answers 429 (its watch cache of secrets re-initializing, as
// while one Secret cannot be decrypted) is retried by client-go for about
// a minute before the informer hears of it; Start should not wait that
// long, so the failure is seen where the answer arrives.
func (s *ClusterState) SecretsClient() (kubernetes.Interface, error) {
	cfg := rest.CopyConfig(s.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return secretListObserver{rt: rt, s: s} })
	return kubernetes.NewForConfig(cfg)
}

// secretListObserver records a failed list of secrets (or watch: a
// client may list by watching).
type secretListObserver struct {
	rt http.RoundTripper
	s  *ClusterState
}

func (o secretListObserver) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := o.rt.RoundTrip(req)
	var failed error
	switch {
	case err != nil:
		failed = fmt.Errorf("a list of secrets failed: %w", err)
	case resp.StatusCode >= 300:
		// Read the Status (small) and hand the client an identical body.
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
		msg := strings.TrimSpace(string(body))
		var st metav1.Status
		if json.Unmarshal(body, &st) == nil && st.Message != "" {
			msg = st.Message
		}
		failed = fmt.Errorf("a list of secrets was answered %d: %s", resp.StatusCode, msg)
	}
	if failed != nil {
		o.s.secretsErr.Store(&failed)
	}
	return resp, err
}

// SecretsErr is the last failure of a list of secrets through
// SecretsClient, or nil.
func (s *ClusterState) SecretsErr() error {
	if s == nil {
		return nil
	}
	if err := s.secretsErr.Load(); err != nil {
		return *err
	}
	return nil
}

// SecretsSynced reports whether the Secret informers (bootstrap-token
// secrets) have synced too.
func (s *ClusterState) SecretsSynced() bool {
	return s != nil && s.secretsSynced != nil && s.secretsSynced()
}

// readOnly refuses every request that could change the cluster.
type readOnly struct{ rt http.RoundTripper }

func (r readOnly) RoundTrip(req *http.Request) (*http.Response, error) {
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return r.rt.RoundTrip(req)
	}
	return nil, errors.New("the kproxy replay is read-only: refused " + req.Method + " " + req.URL.Path)
}
