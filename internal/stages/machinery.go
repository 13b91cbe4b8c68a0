package stages

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	authzconfig "k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	authzunion "k8s.io/apiserver/pkg/authorization/union"
	"k8s.io/apiserver/pkg/server/mux"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	utilflowcontrol "k8s.io/apiserver/pkg/util/flowcontrol"
	"k8s.io/client-go/informers"
	typedv1core "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/kubernetes/pkg/controller/serviceaccount"
	"k8s.io/kubernetes/pkg/features"
	authzmodes "k8s.io/kubernetes/pkg/kubeapiserver/authorizer/modes"
	"k8s.io/kubernetes/plugin/pkg/auth/authenticator/token/bootstrap"
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// machinery is the apiserver's own request machinery, assembled once from
// the mirrored flags over the cluster state exactly as kube-apiserver
// assembles it (options -> config -> New), and shared by the stages.
type machinery struct {
	authn    authenticator.Request
	authnErr error // why authentication cannot be replayed
	// bootstrapTokens: the bootstrap-token authenticator is on; it reads
	// its secrets from an informer (ClusterState.SecretsSynced).
	bootstrapTokens bool
	authnMembers    []authenticatorMember
	tracer          trace.Tracer
	apiAudiences    authenticator.Audiences
	saIssuers       []string
	// tokenSuccessTTL is how long the token authenticators keep a
	// success (--token-success-cache-ttl), the apiserver's and the
	// replay's alike.
	tokenSuccessTTL time.Duration
	requestHeader   *authenticatorfactory.RequestHeaderConfig

	authz    authorizer.Authorizer
	authzErr error // why authorization cannot be replayed
	// webhookAuthorizers name the chain's webhook members, whose
	// verdicts the apiserver caches from its own calls.
	webhookAuthorizers map[string]bool
	// authnConfig and authzConfig are --authentication-config and
	// --authorization-config, which the apiserver reloads (nil: not given).
	authnConfig, authzConfig *reloadedConfig
	// rules is the chain's rule resolver (SelfSubjectRulesReview), the
	// union of each authorizer's, as kube-apiserver builds it.
	rules authorizer.RuleResolver

	// apf is the apiserver's API Priority and Fairness controller, fed
	// the cluster's flowcontrol objects; it only classifies here.
	apf      utilflowcontrol.Interface
	apfReady func() bool
	apfName  func(flowSchemaUID, priorityLevelUID string) (string, string)
	// apfChanges is when kproxy last saw a FlowSchema or a
	// PriorityLevelConfiguration change.
	apfChanges *changeClock

	// write is kube-apiserver's resource handler over read-only storage,
	// with its admission chain (decode through storage), or why it is not
	// built. Built in the background again when the apiserver was
	// unreachable; read on every request without a lock (writer,
	// writeError).
	write atomic.Pointer[writePath]

	// authzChanges is when kproxy last saw the state the authorizers read
	// change (RBAC's objects, the Node authorizer's graph): a verdict read
	// after a later change may not be the one the request met
	// (read_late.go).
	authzChanges authzChanges

	state *apiserver.ClusterState
	opts  *apiserver.Options
	now   func() time.Time
	clock clock.PassiveClock
}

func buildMachinery(ctx context.Context, cfg Config) *machinery {
	tp := cfg.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	m := &machinery{state: cfg.State, opts: cfg.APIServer, tracer: tp.Tracer("github.com/kproxy/kproxy/internal/stages")}
	m.clock = cfg.Clock
	if m.clock == nil {
		m.clock = clock.RealClock{}
	}
	m.now = m.clock.Now
	o := cfg.APIServer
	switch {
	case o == nil || !o.AuthenticationGiven():
		m.authnErr = apiserver.NotGiven("authentication", "--client-ca-file, --token-auth-file, --service-account-key-file, --authentication-config, ...")
	case cfg.State == nil:
		m.authnErr = fmt.Errorf("no cluster state to replay authentication against")
	default:
		m.authnErr = m.buildAuthentication(ctx, o, cfg.State)
		m.authnConfig = watchReloaded(ctx, m.clock, "--authentication-config", o.Authentication.AuthenticationConfigFile)
	}
	switch {
	case o == nil || !o.AuthorizationGiven():
		m.authzErr = apiserver.NotGiven("authorization", "--authorization-mode or --authorization-config")
	case cfg.State == nil:
		m.authzErr = fmt.Errorf("no cluster state to replay authorization against")
	default:
		m.authzErr = m.buildAuthorization(ctx, o, cfg.State, tp)
		m.authzConfig = watchReloaded(ctx, m.clock, "--authorization-config", o.Authorization.AuthorizationConfigurationFile)
	}
	switch {
	case m.authzErr != nil:
		m.write.Store(&writePath{err: fmt.Errorf("it needs the authorizer (RBAC's escalation check, admission): %w", m.authzErr)})
	case m.authnErr != nil:
		m.write.Store(&writePath{err: fmt.Errorf("it needs the authenticator: %w", m.authnErr)})
	default:
		build := func(ctx context.Context) (*apiserver.Server, error) {
			return apiserver.New(ctx, apiserver.Config{Options: o, State: cfg.State, Authenticator: m.authn, Authorizer: m.authz,
				RuleResolver: m.rules, Clock: m.clock, Explainer: newAdmissionExplainer(cfg.State),
				AuthzChanged: func(t time.Time) string { return m.authzChanges.changedSince(t, nil) }})
		}
		bctx, cancel := context.WithCancel(ctx)
		w, err := build(bctx)
		m.write.Store(&writePath{s: w, err: err})
		if err != nil {
			cancel()
			go m.rebuildWrite(ctx, build, cfg.Log)
		} else {
			context.AfterFunc(ctx, cancel)
			m.awaitEtcd(ctx, w, cancel, build, o, cfg.Log)
		}
	}
	if cfg.State != nil && (o == nil || o.EnablePriorityAndFairness) {
		m.buildFlowControl(ctx, cfg.State)
	}
	return m
}

// rebuildWrite builds the write path again, with backoff, until it is
// built or ctx ends: when kproxy started while the apiserver was down,
// its informers could not sync, and predictions that need the handler
// stay unknown only until the apiserver is back.
func (m *machinery) rebuildWrite(ctx context.Context, build func(context.Context) (*apiserver.Server, error), log *slog.Logger) {
	delay := 5 * time.Second
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		bctx, cancel := context.WithCancel(ctx)
		w, err := build(bctx)
		m.write.Store(&writePath{s: w, err: err})
		if err == nil {
			context.AfterFunc(ctx, cancel)
			if log != nil {
				log.Info("the replay's write path is built: predictions of writes and reads resume")
			}
			m.awaitEtcd(ctx, w, cancel, build, m.opts, log)
			return
		}
		cancel()
		delay = min(2*delay, 2*time.Minute)
	}
}

// awaitEtcd builds the write path again once etcd answers, when w was
// built without it because etcd could not be reached (kproxy started
// during an etcd restart, found by a probe: it read through the
// apiserver, with the unknowns that brings, until it was restarted).
// The old write path is let go a minute later, when the replays that
// hold it are over.
func (m *machinery) awaitEtcd(ctx context.Context, w *apiserver.Server, cancel context.CancelFunc, build func(context.Context) (*apiserver.Server, error), o *apiserver.Options, log *slog.Logger) {
	if w == nil || !w.EtcdUnreachable() {
		return
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(apiserver.EtcdRetryInterval):
			}
			if !apiserver.EtcdAnswers(ctx, o) {
				continue
			}
			bctx, bcancel := context.WithCancel(ctx)
			nw, err := build(bctx)
			if err != nil || nw.EtcdUnreachable() {
				bcancel()
				continue
			}
			if ok, _ := nw.EtcdAccess(); !ok {
				bcancel()
				return
			}
			context.AfterFunc(ctx, bcancel)
			m.write.Store(&writePath{s: nw})
			time.AfterFunc(time.Minute, cancel)
			if log != nil {
				log.Info("etcd answers: the replay's storage stage reads etcd directly now (it had read through the apiserver since kproxy started)", "etcd", o.EtcdServers)
			}
			return
		}
	}()
}

// writePath is the write path, or why it is not built.
type writePath struct {
	s   *apiserver.Server
	err error
}

// writer is the write path (nil until built); writeError why it is not.
func (m *machinery) writer() *apiserver.Server {
	if w := m.write.Load(); w != nil {
		return w.s
	}
	return nil
}

func (m *machinery) writeError() error {
	if w := m.write.Load(); w != nil && w.err != nil {
		return w.err
	}
	return errors.New("the write path is not built")
}

// buildFlowControl runs the APF controller as kube-apiserver does, with a
// concurrency limit so large that the replay's own bookkeeping never
// queues or rejects: kproxy classifies, the real apiserver admits.
func (m *machinery) buildFlowControl(ctx context.Context, s *apiserver.ClusterState) {
	m.apf = utilflowcontrol.New(s.Informers, s.Client.FlowcontrolV1(), 1<<20)
	// Every record resolves the apiserver's X-Kubernetes-PF-* UIDs to
	// names: index the objects by UID rather than list them each time.
	fsInf := s.Informers.Flowcontrol().V1().FlowSchemas().Informer()
	plInf := s.Informers.Flowcontrol().V1().PriorityLevelConfigurations().Informer()
	for _, inf := range []cache.SharedIndexInformer{fsInf, plInf} {
		_ = inf.AddIndexers(cache.Indexers{uidIndex: func(obj any) ([]string, error) {
			if o, ok := obj.(metav1.Object); ok {
				return []string{string(o.GetUID())}, nil
			}
			return nil, nil
		}})
	}
	m.apfChanges = watchChanges(m.clock, fsInf, plInf)
	var fsNames, plNames uidNames
	m.apfName = func(fsUID, plUID string) (string, string) {
		return fsNames.of(fsInf, fsUID), plNames.of(plInf, plUID)
	}
	plLister := s.Informers.Flowcontrol().V1().PriorityLevelConfigurations().Lister()
	debug := mux.NewPathRecorderMux("kproxy-apf")
	m.apf.Install(debug)
	var ready atomic.Bool
	m.apfReady = func() bool {
		if ready.Load() {
			return true
		}
		if !s.Synced() {
			return false
		}
		// The controller digests the informers' objects asynchronously;
		// it is ready once every priority level (digested together with
		// the flow schemas) appears in its own dump.
		pls, err := plLister.List(labels.Everything())
		if err != nil || len(pls) == 0 {
			return false
		}
		w := httptest.NewRecorder()
		debug.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/debug/api_priority_and_fairness/dump_priority_levels", nil))
		known := map[string]bool{}
		for _, line := range strings.Split(w.Body.String(), "\n") {
			if f := strings.Fields(line); len(f) > 0 {
				known[strings.TrimSuffix(f[0], ",")] = true
			}
		}
		for _, pl := range pls {
			if !known[pl.Name] {
				return false
			}
		}
		ready.Store(true)
		return true
	}
	go func() { _ = m.apf.Run(ctx.Done()) }()
}

// buildAuthentication follows kube-apiserver's BuiltInAuthenticationOptions
// ApplyTo: the same config, with the same getters, over kproxy's
// read-only state.
func (m *machinery) buildAuthentication(ctx context.Context, o *apiserver.Options, s *apiserver.ClusterState) error {
	ac, err := o.Authentication.ToAuthenticationConfig()
	if err != nil {
		return fmt.Errorf("authentication flags: %w", err)
	}
	f := s.Informers
	var nodes corelisters.NodeLister
	if utilfeature.DefaultFeatureGate.Enabled(features.ServiceAccountTokenNodeBindingValidation) {
		nodes = f.Core().V1().Nodes().Lister()
	}
	// Secrets are never cached by kproxy: a legacy service-account token's
	// secret is read when needed (an empty lister always misses).
	noSecrets := corelisters.NewSecretLister(cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}))
	ac.ServiceAccountTokenGetter = serviceaccount.NewGetterFromClient(s.Client, noSecrets,
		f.Core().V1().ServiceAccounts().Lister(), f.Core().V1().Pods().Lister(), nodes,
		f.Admissionregistration().V1().ValidatingWebhookConfigurations().Lister(),
		f.Admissionregistration().V1().MutatingWebhookConfigurations().Lister())
	// The legacy token validator records "last used" on the secret: the
	// replay must not, so its writes go nowhere.
	ac.SecretsWriter = discardSecretWrites{}
	if ac.BootstrapToken {
		// Only bootstrap-token secrets, only in kube-system, as the
		// apiserver itself reads them.
		sc, err := s.SecretsClient()
		if err != nil {
			return fmt.Errorf("replay client for secrets: %w", err)
		}
		bf := informers.NewSharedInformerFactoryWithOptions(sc, 0, informers.WithNamespace(metav1.NamespaceSystem),
			informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.FieldSelector = "type=bootstrap.kubernetes.io/token" }))
		ac.BootstrapTokenAuthenticator = bootstrap.NewTokenAuthenticator(bf.Core().V1().Secrets().Lister().Secrets(metav1.NamespaceSystem))
		s.AddFactory(bf)
		m.bootstrapTokens = true
	}
	ac.APIServerID = apiserver.ServerID
	authn, members, err := buildAuthenticatorChain(ctx, ac)
	if err != nil {
		return err
	}
	m.authn, m.authnMembers = authn, members
	m.requestHeader, m.tokenSuccessTTL = ac.RequestHeaderConfig, ac.TokenSuccessCacheTTL
	m.apiAudiences = o.Authentication.APIAudiences
	if sa := o.Authentication.ServiceAccounts; sa != nil {
		m.saIssuers = sa.Issuers
		if len(sa.Issuers) != 0 && len(m.apiAudiences) == 0 {
			m.apiAudiences = authenticator.Audiences(sa.Issuers)
		}
	}
	return nil
}

// buildAuthorization builds the authorizer chain of --authorization-mode
// or --authorization-config as kube-apiserver does, one member at a time:
// authorizer.Config.New for each configured authorizer alone, so that the
// chain (authorizerChain, system:masters first) can watch every member
// decide. A changed --authorization-config file is read when kproxy
// restarts (the apiserver reloads it every minute); until then the
// authorization stage says unknown (reloadedConfig).
func (m *machinery) buildAuthorization(ctx context.Context, o *apiserver.Options, s *apiserver.ClusterState, tp trace.TracerProvider) error {
	azc, err := o.Authorization.ToAuthorizationConfig(s.Informers)
	if err != nil {
		return fmt.Errorf("authorization flags: %w", err)
	}
	chain := &authorizerChain{members: []chainMember{privilegedGroup()}, tracer: tp.Tracer("github.com/kproxy/kproxy/internal/stages"), clock: m.clock}
	var resolvers []authorizer.RuleResolver
	for _, a := range azc.AuthorizationConfiguration.Authorizers {
		one := *azc
		one.AuthorizationConfiguration = azc.AuthorizationConfiguration.DeepCopy()
		one.AuthorizationConfiguration.Authorizers = []authzconfig.AuthorizerConfiguration{a}
		one.ReloadFile, one.InitialAuthorizationConfigurationData = "", ""
		authz, rules, err := one.New(ctx, apiserver.ServerID)
		if err != nil {
			return fmt.Errorf("build the apiserver's %s authorizer %q: %w", a.Type, a.Name, err)
		}
		chain.members = append(chain.members, chainMember{name: a.Name, kind: string(a.Type), authz: authz})
		resolvers = append(resolvers, rules)
		if a.Type == authzconfig.AuthorizerType(authzmodes.ModeWebhook) {
			if m.webhookAuthorizers == nil {
				m.webhookAuthorizers = map[string]bool{}
			}
			m.webhookAuthorizers[a.Name] = true
		}
		switch {
		case a.Type == authzconfig.AuthorizerType(authzmodes.ModeRBAC) && m.authzChanges.rbac == nil:
			r := s.Informers.Rbac().V1()
			m.authzChanges.rbac = watchChanges(m.clock, r.Roles().Informer(), r.RoleBindings().Informer(),
				r.ClusterRoles().Informer(), r.ClusterRoleBindings().Informer())
		case a.Type == authzconfig.AuthorizerType(authzmodes.ModeNode) && m.authzChanges.nodeGraph == nil:
			// The informers the Node authorizer's graph is built from
			// (those of its optional features aside).
			c := s.Informers.Core().V1()
			m.authzChanges.nodeGraph = watchChanges(m.clock, c.Nodes().Informer(), c.Pods().Informer(),
				c.PersistentVolumes().Informer(), s.Informers.Storage().V1().VolumeAttachments().Informer())
		}
	}
	m.authz = chain
	// The system:masters authorizer has no rules to list, as in
	// kube-apiserver's union.
	m.rules = authzunion.NewRuleResolvers(resolvers...)
	return nil
}

// discardSecretWrites is the legacy token validator's secrets writer: it
// only ever patches a "last used" label, which the replay drops.
type discardSecretWrites struct{}

func (discardSecretWrites) Secrets(ns string) typedv1core.SecretInterface { return discardSecret{} }

type discardSecret struct{ typedv1core.SecretInterface }

func (discardSecret) Patch(_ context.Context, name string, _ types.PatchType, _ []byte, _ metav1.PatchOptions, _ ...string) (*corev1.Secret, error) {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}}, nil
}

const uidIndex = "uid"

// uidNames remembers the names nameByUID found: an object's UID names it
// for its whole life, and the index's lookup (a lock and a slice per
// call) was 1.4% of kproxy's CPU under overload, where every record asks
// for the same two or three. Bounded: cleared past maxUIDNames.
type uidNames struct {
	names sync.Map // UID -> name
	n     atomic.Int32
}

const maxUIDNames = 1024

func (u *uidNames) of(inf cache.SharedIndexInformer, uid string) string {
	if v, ok := u.names.Load(uid); ok {
		return v.(string)
	}
	name := nameByUID(inf, uid)
	if name != "" {
		if u.n.Add(1) > maxUIDNames {
			u.names.Clear()
			u.n.Store(1)
		}
		u.names.Store(uid, name)
	}
	return name
}

func nameByUID(inf cache.SharedIndexInformer, uid string) string {
	if uid == "" {
		return ""
	}
	objs, err := inf.GetIndexer().ByIndex(uidIndex, uid)
	if err != nil || len(objs) == 0 {
		return ""
	}
	if o, ok := objs[0].(metav1.Object); ok {
		return o.GetName()
	}
	return ""
}
