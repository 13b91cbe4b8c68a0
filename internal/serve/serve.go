// Package serve wires kproxy together from its options: upstream
// transports, the replay pipeline, tracing, capture sinks, and the reverse
// or forward server. `kproxy serve` and `kproxy demo` both run it.
package serve

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"expvar"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/net/netutil"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kproxy/kproxy/internal/filter"
	"github.com/kproxy/kproxy/internal/flowapi"
	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/pki"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/servertrace"
	"github.com/kproxy/kproxy/internal/stages"
	"github.com/kproxy/kproxy/internal/telemetry"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// DefaultReplayBodyBudget is --replay-body-budget-mib's default, in bytes.
const DefaultReplayBodyBudget = proxy.DefaultReplayBodyBudget

// DefaultReplayCPUPressure is --replay-cpu-pressure's default, a percent.
const DefaultReplayCPUPressure = proxy.DefaultReplayCPUPressure

// Options are `kproxy serve`'s flags.
type Options struct {
	Upstream           string // apiserver URL; overrides the kubeconfig's server
	UpstreamKubeconfig string // kproxy's own credentials; empty: $KUBECONFIG / ~/.kube/config
	UpstreamContext    string
	Listen             string
	TLSCertFile        string
	TLSKeyFile         string
	PKIDir             string // kproxy's CA, created on first use
	Capture            string
	// CaptureRotation bounds the capture file (--capture-max*).
	CaptureRotation record.Rotation
	Mode            string // reverse | forward
	DebugAddr       string // pprof and expvar, off when empty
	// ShutdownDelay is how long kproxy, told to stop, keeps serving with
	// /readyz answering 503 before it stops accepting connections
	// (--shutdown-delay, as kube-apiserver's --shutdown-delay-duration):
	// time for a load balancer to take it out.
	ShutdownDelay time.Duration

	// APIServer are the mirrored kube-apiserver flags (parsed by its own
	// option structs); nil means none were given.
	APIServer *apiserver.Options
	// SyncTimeout bounds the wait for the replay's cluster state before
	// kproxy starts listening (default 60s); predictions are unknown until
	// it has synced.
	SyncTimeout time.Duration

	Telemetry telemetry.Options
	// OTLPLogs exports every record as an OpenTelemetry log record (as
	// OTEL_LOGS_EXPORTER=otlp does), to the OTLP/HTTP endpoint of the
	// traces or OTEL_EXPORTER_OTLP_LOGS_ENDPOINT.
	OTLPLogs bool

	// The flow API (flowapi.go): APIListen is its address, "" or "off"
	// for none. Off loopback it needs TLS and client authentication.
	APIListen       string
	APIBuffer       int // records it keeps (0: DefaultAPIBuffer)
	APITLSCertFile  string
	APITLSKeyFile   string
	APIClientCAFile string // clients authenticate with certificates signed by it
	APITokenFile    string // or with the bearer token in this file
	// APIRerunKeep is how many of the newest flows the API can re-run
	// (0: none); their requests, credentials included, are kept in
	// memory only. APIRerunKeepBytes bounds their bodies (0:
	// DefaultAPIRerunKeepBytes).
	APIRerunKeep      int
	APIRerunKeepBytes int64
	// LogFlows logs one line per finished flow.
	LogFlows bool
	// BodyIdleTimeout ends a request whose body stops arriving for that
	// long (0: none); MaxConnections bounds the client connections kproxy
	// holds at once (0: no bound; past it, new ones wait to be accepted).
	BodyIdleTimeout time.Duration
	MaxConnections  int
	// CaptureBodies records write bodies (secrets redacted) and
	// impersonation in the records.
	CaptureBodies bool
	// OTLPReceiverListen is where kproxy receives the apiserver's own
	// spans (OTLP/gRPC) and joins them to the records, "" or "off" for
	// nowhere (servertrace.go); ServerTraceWait is how long a record
	// waits for them (0: DefaultServerTraceWait).
	OTLPReceiverListen string
	ServerTraceWait    time.Duration

	// The apiserver's audit latency annotations (auditlatency.go), for
	// its slow requests, joined as its spans are: AuditWebhookListen
	// receives its audit webhook backend, "" or "off" for nowhere (off
	// loopback with TLS: AuditWebhookTLSCertFile and
	// AuditWebhookTLSKeyFile; AuditWebhookClientCAFile verifies its
	// client certificate); AuditLogFollow follows its JSON audit log.
	AuditWebhookListen       string
	AuditWebhookTLSCertFile  string
	AuditWebhookTLSKeyFile   string
	AuditWebhookClientCAFile string
	AuditLogFollow           string

	// MetricsListen serves kproxy's own Prometheus metrics (/metrics),
	// "" or "off" for nowhere. ReplayWorkers bounds the replays run at
	// once and ReplayQueue those waiting (0: sized from GOMAXPROCS);
	// past both, replays are shed (proxy.ShedMessage).
	MetricsListen string
	ReplayWorkers int
	ReplayQueue   int
	// ReplayNice is --replay-nice: the replay workers' threads' nice value
	// (0: kproxy's own).
	ReplayNice int
	// ReplayCPUPressure is --replay-cpu-pressure: the percent of time
	// tasks may wait for a CPU before the replay yields (0: off; the flag
	// defaults to proxy.DefaultReplayCPUPressure).
	ReplayCPUPressure float64
	// ReplayBodyBudget bounds the request body bytes held for replays at
	// once (0: DefaultReplayBodyBudget).
	ReplayBodyBudget int64
	// NoReplay turns the replay off (--replay=false): requests are
	// forwarded and recorded, every prediction unknown ("the replay is
	// disabled"), and kproxy reads nothing of the cluster for it (no
	// informers, no discovery). The zero value keeps the replay on.
	NoReplay bool
	// ReplayFilter (--replay-filter) picks the requests replayed, in the
	// flow filter language restricted to a request's own terms; the
	// others are forwarded and recorded, their prediction unknown. ""
	// replays every request.
	ReplayFilter string
	// Replica names this kproxy in its records, when several run behind
	// one load balancer ("": not named).
	Replica string

	// Stream, when set, also receives every record (the TUI, the demo).
	Stream *record.Stream
	Log    *slog.Logger
}

// DefaultPKIDir is where kproxy keeps its CA: $XDG_CONFIG_HOME/kproxy or
// ~/.config/kproxy.
func DefaultPKIDir() string {
	if d, err := os.UserConfigDir(); err == nil {
		return filepath.Join(d, "kproxy")
	}
	return ".kproxy"
}

// Validate checks the options, naming the flag and the fix.
func (o *Options) Validate() error {
	switch o.Mode {
	case "reverse", "forward":
	default:
		return fmt.Errorf("--mode=%q: use reverse (clients point their kubeconfig at kproxy) or forward (clients use kproxy as HTTPS_PROXY)", o.Mode)
	}
	if err := o.checkCaptureRotation(); err != nil {
		return err
	}
	if (o.TLSCertFile == "") != (o.TLSKeyFile == "") {
		return errors.New("--tls-cert-file and --tls-private-key-file go together: give both, or neither to have kproxy make a certificate with its own CA")
	}
	if _, _, err := net.SplitHostPort(o.Listen); err != nil {
		return fmt.Errorf("--listen=%q: want host:port, e.g. 127.0.0.1:8443 (%v)", o.Listen, err)
	}
	if o.Upstream != "" {
		u, err := url.Parse(o.Upstream)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return fmt.Errorf("--upstream=%q: want the apiserver's https URL, e.g. https://10.0.0.1:6443", o.Upstream)
		}
	}
	if o.BodyIdleTimeout < 0 {
		return fmt.Errorf("--request-body-idle-timeout=%v: want a duration such as 1m, or 0 for no limit", o.BodyIdleTimeout)
	}
	if o.MaxConnections < 0 {
		return fmt.Errorf("--max-connections=%d: want how many client connections kproxy holds at once, or 0 for no limit", o.MaxConnections)
	}
	if err := o.validateServerTrace(); err != nil {
		return err
	}
	if err := o.validateAuditLatency(); err != nil {
		return err
	}
	if err := o.validateMetrics(); err != nil {
		return err
	}
	return o.validateAPI()
}

func (o *Options) metricsOn() bool { return o.MetricsListen != "" && o.MetricsListen != "off" }

// validateMetrics checks --metrics-listen and the replay pool's bounds.
func (o *Options) validateMetrics() error {
	if o.ReplayWorkers < 0 {
		return fmt.Errorf("--replay-workers=%d: want how many replays run at once, e.g. %d, or 0 for one per CPU", o.ReplayWorkers, proxy.DefaultReplayWorkers())
	}
	if o.ReplayQueue < 0 {
		return fmt.Errorf("--replay-queue=%d: want how many replays may wait for a worker, e.g. %d, or 0 for %d per worker", o.ReplayQueue, proxy.DefaultReplayQueue(proxy.DefaultReplayWorkers()), proxy.DefaultReplayQueue(1))
	}
	if o.ReplayNice < 0 || o.ReplayNice > 19 {
		return fmt.Errorf("--replay-nice=%d: want the replay threads' nice value, from 1 (a little below forwarding) to 19 (only what is left), or 0 to run replays at kproxy's own priority", o.ReplayNice)
	}
	if o.ReplayCPUPressure < 0 || o.ReplayCPUPressure > 100 {
		return fmt.Errorf("--replay-cpu-pressure=%v: want the percent of time tasks may wait for a CPU before the replay yields, e.g. %d, or 0 to replay at full speed whatever the CPU pressure", o.ReplayCPUPressure, proxy.DefaultReplayCPUPressure)
	}
	if _, err := o.replayFilter(); err != nil {
		return err
	}
	if !o.metricsOn() {
		return nil
	}
	if _, _, err := net.SplitHostPort(o.MetricsListen); err != nil {
		return fmt.Errorf("--metrics-listen=%q: want host:port, e.g. 127.0.0.1:9090, or off (%v)", o.MetricsListen, err)
	}
	return nil
}

// replayFilter compiles --replay-filter (nil: replay every request).
func (o *Options) replayFilter() (*filter.Expr, error) {
	if strings.TrimSpace(o.ReplayFilter) == "" {
		return nil, nil
	}
	if o.NoReplay {
		return nil, fmt.Errorf("--replay-filter=%q with --replay=false: the replay is off, so there is nothing to filter; drop one of the two", o.ReplayFilter)
	}
	e, err := filter.ParseRequestOnly(o.ReplayFilter)
	if err != nil {
		var se *filter.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("--replay-filter: %s\n%s\n(the filter language: kproxy flows --help)", se.Msg, se.Caret())
		}
		return nil, fmt.Errorf("--replay-filter=%q: %w", o.ReplayFilter, err)
	}
	return e, nil
}

// LoadUpstreamConfig reads kproxy's own client configuration the kubectl
// way: --upstream-kubeconfig, else $KUBECONFIG, else ~/.kube/config, else
// in-cluster; --upstream overrides the server.
func LoadUpstreamConfig(o *Options) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if o.UpstreamKubeconfig != "" {
		rules.ExplicitPath = o.UpstreamKubeconfig
	}
	overrides := &clientcmd.ConfigOverrides{CurrentContext: o.UpstreamContext}
	if o.Upstream != "" {
		overrides.ClusterInfo.Server = o.Upstream
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err != nil {
		if o.Upstream == "" {
			return nil, fmt.Errorf("no upstream apiserver: give --upstream-kubeconfig or --upstream, or set KUBECONFIG (%v)", err)
		}
		// An upstream without credentials: tokens pass through, certificate
		// callers cannot be impersonated.
		cfg = &rest.Config{Host: o.Upstream}
	}
	// Never send kproxy's own traffic through a proxy from the environment:
	// in forward mode that proxy is kproxy.
	cfg.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
	return cfg, nil
}

// NewReplay builds the replay pipeline over a read-only view of the
// cluster through kproxy's own identity (cfg), and waits, at most
// syncTimeout (default 60s), for that view to sync. Without credentials
// there is no view: the stages that need it say "unknown". The pipeline's
// machinery lives as long as ctx.
func NewReplay(ctx context.Context, cfg *rest.Config, hasCredentials bool, opts *apiserver.Options,
	tp trace.TracerProvider, syncTimeout time.Duration, log *slog.Logger) (*stages.Pipeline, error) {
	var state *apiserver.ClusterState
	if hasCredentials {
		var err error
		if state, err = apiserver.NewClusterState(cfg); err != nil {
			return nil, err
		}
		if opts != nil {
			state.SetReplayReadQPS(opts.ReplayAPIServerQPS)
		}
	}
	pipeline := stages.New(ctx, stages.Config{TracerProvider: tp, APIServer: opts, State: state, Log: log})
	if state == nil {
		return pipeline, nil
	}
	if ok, why := pipeline.StorageAccess(); ok {
		log.Info("the storage stage reads etcd directly (read-only)", "etcd", opts.EtcdServers)
	} else {
		log.Warn("the storage stage reads through the apiserver: resourceVersion semantics and etcd keys stay unknown", "why", why)
	}
	syncTimeout = syncTimeoutOrDefault(syncTimeout)
	log.Info("syncing the replay's cluster state", "timeout", syncTimeout)
	if err := state.Start(ctx, syncTimeout); err != nil {
		// An error, not a warning: every prediction stays unknown, and
		// kproxy test run on a snapshot shows only errors.
		log.Error("predictions stay unknown until the cluster state syncs (check kproxy's identity can list and watch RBAC, pods, nodes and flowcontrol objects)", "error", err)
		return pipeline, nil
	}
	switch {
	case !pipeline.WaitReady(ctx, syncTimeout):
		log.Warn("the replay's APF controller has not digested the flow schemas yet; flowcontrol stays unknown until it has")
	default:
		log.Info("cluster state synced")
	}
	return pipeline, nil
}

// DefaultSyncTimeout bounds the wait for the replay's cluster state when
// Options.SyncTimeout is not set.
const DefaultSyncTimeout = 60 * time.Second

// syncTimeoutOrDefault is d, or DefaultSyncTimeout when d is 0: what
// NewReplay waits and what /readyz says it waits.
func syncTimeoutOrDefault(d time.Duration) time.Duration {
	if d == 0 {
		return DefaultSyncTimeout
	}
	return d
}

// Server is a configured, not yet running kproxy.
type Server struct {
	opts     *Options
	ln       net.Listener
	handler  *proxy.Proxy
	tlsCfg   *tls.Config
	forward  *proxy.ForwardServer
	shutdown []func(context.Context) error
	// CA is kproxy's CA (nil when serving a given certificate).
	CA *pki.CA
	// Addr is the address kproxy listens on.
	Addr string
	// APIURL is the flow API's base URL, e.g. http://127.0.0.1:7070
	// ("" when off); Flows its buffer (nil when off).
	APIURL string
	Flows  *flowapi.Buffer
	api    *flowAPI
	log    *slog.Logger
	// OTLPReceiverAddr is where the apiserver's spans are received (""
	// when off); Joiner joins them to the records (nil when no source of
	// the apiserver's own account is configured).
	OTLPReceiverAddr string
	Joiner           *servertrace.Joiner
	otlp             *otlpReceiver
	// heldSecrets pass the secret values of the bodies in flight from
	// the proxy to the receiver of the apiserver's spans (nil when off).
	heldSecrets *record.HeldSecrets
	// AuditWebhookURL is where the apiserver's audit webhook backend is
	// received ("" when off).
	AuditWebhookURL string
	audit           *auditLatency
	// MetricsAddr is where /metrics is served ("" when off).
	MetricsAddr string
	metrics     *metrics.Server
	// starting says what New is waiting for (nil once it returns):
	// /readyz is served from the start and says so, rather than a load
	// balancer or a scrape finding nothing listening while the replay's
	// caches sync (up to a minute, more for APF). pipeline is the replay
	// (its readiness); stopping is set once Run's context ends, so
	// /readyz turns a load balancer away first.
	starting atomic.Pointer[string]
	pipeline atomic.Pointer[stages.Pipeline]
	stopping atomic.Bool
}

// New builds the server and starts listening (so the address is known and
// clients can connect as soon as Run is called).
func New(ctx context.Context, o *Options) (*Server, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	cfg, err := LoadUpstreamConfig(o)
	if err != nil {
		return nil, err
	}
	up, err := proxy.NewUpstream(cfg)
	if err != nil {
		return nil, err
	}
	s := &Server{opts: o, log: log}
	s.startingWith("setting up tracing, records and listeners")
	ok := false
	defer func() {
		if !ok {
			s.close(context.Background())
		}
	}()

	// kproxy's own metrics, on a registry of their own; nil when off (the
	// proxy then measures nothing).
	var m *metrics.Metrics
	if o.metricsOn() {
		m = metrics.New(prometheus.NewRegistry())
	}
	if err := s.listenMetrics(m); err != nil {
		return nil, err
	}

	tracing, err := telemetry.Setup(ctx, o.Telemetry, nil)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	s.shutdown = append(s.shutdown, tracing.Shutdown)
	tp := tracing.Provider
	m.Exports("traces", tracing.Spans)

	var sinks record.Sinks
	logs, err := telemetry.SetupRecordLogs(ctx, o.Telemetry, telemetry.LogsOptions{On: o.OTLPLogs}, nil)
	if err != nil {
		return nil, err
	}
	if logs != nil {
		m.Exports("logs", logs.Exports)
		s.shutdown = append(s.shutdown, logs.Shutdown)
		sinks = append(sinks, logs)
	}
	if o.Capture != "" {
		fs, err := record.OpenFile(o.Capture, log, o.CaptureRotation)
		if err != nil {
			return nil, err
		}
		s.shutdown = append(s.shutdown, func(context.Context) error { return fs.Close() })
		sinks = append(sinks, m.CaptureSink(fs))
	}
	if o.Stream != nil {
		sinks = append(sinks, o.Stream)
	}
	if o.apiOn() {
		s.Flows = flowapi.NewBuffer(o.apiBuffer())
		sinks = append(sinks, s.Flows)
		m.FlowBuffer(s.Flows)
	}
	if o.LogFlows {
		sinks = append(sinks, flowLogger{log})
	}
	// Records wait here for the apiserver's own account of their
	// requests, when a source of it is configured.
	if o.serverTraceOn() {
		s.heldSecrets = record.NewHeldSecrets(time.Now)
	}
	sink, err := s.joinServerTrace(ctx, sinks)
	if err != nil {
		return nil, err
	}
	if s.otlp != nil {
		m.ServerTrace(s.otlp.r, s.Joiner)
	} else {
		m.ServerTrace(nil, s.Joiner)
	}
	// And for the audit latency annotations, when they are received.
	if err := s.listenAuditLatency(); err != nil {
		return nil, err
	}

	certAuth, clientCAs, err := certAuthenticator(o.APIServer)
	if err != nil {
		return nil, err
	}
	if o.APIServer != nil {
		if err := o.APIServer.Complete(); err != nil {
			return nil, err
		}
	}
	pcfg := proxy.Config{
		Upstream:          up.URL,
		Passthrough:       up.Passthrough,
		WatchPassthrough:  up.WatchPassthrough,
		CertAuthenticator: certAuth,
		Sink:              sink,
		TracerProvider:    tp,
		Mode:              o.Mode,
		Rerun:             o.rerunLimits(),
		CaptureBodies:     o.CaptureBodies,
		BodyIdleTimeout:   o.BodyIdleTimeout,
		ReplayWorkers:     o.ReplayWorkers,
		ReplayQueue:       o.ReplayQueue,
		ReplayNice:        o.ReplayNice,
		ReplayCPUPressure: o.ReplayCPUPressure,
		ReplayBodyBudget:  o.ReplayBodyBudget,
		Metrics:           m,
		HeldSecrets:       s.heldSecrets,
		Replica:           o.Replica,
		Log:               log,
	}
	if pcfg.ReplayFilter, err = o.replayFilter(); err != nil {
		return nil, err
	}
	if pcfg.ReplayFilter != nil {
		log.Info("replaying only the requests --replay-filter picks; the others are forwarded and recorded, their predictions unknown", "filter", pcfg.ReplayFilter.String())
	}
	if o.NoReplay {
		// Replayer stays nil (a nil *stages.Pipeline would not be a nil
		// Replayer): every prediction is unknown.
		log.Info("the replay is off (--replay=false): requests are forwarded and recorded, their predictions unknown")
	} else {
		if up.Impersonating != nil {
			if err := Reachable(ctx, cfg); err != nil {
				// A proxy in front of an apiserver that is down still
				// starts: it answers 502 until the apiserver is back, and
				// its informers sync when they can. There is nothing to
				// ask it meanwhile.
				log.Error("the replay's cluster state cannot sync until the apiserver answers; kproxy starts anyway", "error", err)
			} else {
				s.startingWith("asking the apiserver what it runs (version, feature gates)")
				d := Discover(ctx, cfg, log)
				ApplyFeatures(d, o.APIServer.GivenFeatureGates(), log)
			}
		}
		s.startingWith(fmt.Sprintf("syncing the replay's cluster state (for up to %s)", syncTimeoutOrDefault(o.SyncTimeout)))
		replayCtx, stopReplay := context.WithCancel(context.WithoutCancel(ctx))
		s.shutdown = append(s.shutdown, func(context.Context) error { stopReplay(); return nil })
		pipeline, err := NewReplay(replayCtx, cfg, up.Impersonating != nil, o.APIServer, tp, o.SyncTimeout, log)
		if err != nil {
			return nil, err
		}
		s.pipeline.Store(pipeline)
		pcfg.Replayer = pipeline
	}
	if up.Impersonating != nil {
		pcfg.Impersonating, pcfg.WatchImpersonating = up.Impersonating, up.WatchImpersonating
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("upstream client: %w", err)
		}
		if pcfg.ImpersonationAuthorizer, err = proxy.NewImpersonationAuthorizer(cs.AuthorizationV1()); err != nil {
			return nil, err
		}
	} else if certAuth != nil {
		log.Warn("kproxy has no upstream credentials: certificate callers will be refused (give --upstream-kubeconfig)")
	}
	s.startingWith("opening its listeners")
	if s.handler, err = proxy.New(pcfg); err != nil {
		return nil, err
	}
	if err := s.listenAPI(); err != nil {
		return nil, err
	}

	cert, err := s.servingCert(up.URL)
	if err != nil {
		return nil, err
	}
	s.tlsCfg = proxy.ServerTLS(cert, clientCAs)
	if s.ln, err = net.Listen("tcp", o.Listen); err != nil {
		return nil, fmt.Errorf("--listen=%s: %w", o.Listen, err)
	}
	s.Addr = s.ln.Addr().String()
	if o.MaxConnections > 0 {
		s.ln = netutil.LimitListener(s.ln, o.MaxConnections)
	}
	if o.Mode == "forward" {
		s.forward = proxy.NewForwardServer(s.handler, up.URL.Host, s.tlsCfg, s.ln.Addr(), log)
	}
	log.Info("kproxy listening", "mode", o.Mode, "addr", s.Addr, "upstream", up.URL.String(),
		"capture", o.Capture, "clientCA", o.APIServer.ClientCAFile() != "", "impersonation", up.Impersonating != nil)
	// Where traces go, or why nowhere: the first thing to check when a
	// trace is missing from the collector.
	log.Info("kproxy tracing", "traces", telemetry.Describe(o.Telemetry, nil), "records as logs", telemetry.DescribeLogs(o.Telemetry, telemetry.LogsOptions{On: o.OTLPLogs}, nil))
	ok = true
	s.starting.Store(nil)
	return s, nil
}

// startingWith says, on /readyz, what New is doing.
func (s *Server) startingWith(what string) { s.starting.Store(&what) }

// Run serves until ctx is done, then flushes captures and spans.
func (s *Server) Run(ctx context.Context) error {
	if s.opts.DebugAddr != "" {
		go serveDebug(ctx, s.opts.DebugAddr, s.log)
	}
	if s.api != nil {
		go s.api.serve(s.log)
	}
	if s.otlp != nil {
		go s.otlp.serve(s.log)
	}
	if s.audit != nil {
		go s.audit.serve()
	}
	// Told to stop, kproxy answers /readyz 503 at once, serves on for
	// --shutdown-delay, then drains (a request still in flight after the
	// drain is cut, and its record says so).
	serving, stopServing := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServing()
	go func() {
		select {
		case <-ctx.Done():
		case <-serving.Done():
			return
		}
		s.stopping.Store(true)
		if d := s.opts.ShutdownDelay; d > 0 {
			s.log.Info("kproxy is stopping: /readyz answers 503; serving on for --shutdown-delay so load balancers take this replica out", "delay", d)
			select {
			case <-time.After(d):
			case <-serving.Done():
			}
		}
		s.log.Info("kproxy is stopping: no new connections; requests in flight have until the drain's end to finish, watches are ended", "drain", proxy.DrainTimeout)
		stopServing()
	}()
	var err error
	if s.forward != nil {
		err = s.forward.Serve(serving, s.ln)
	} else {
		err = proxy.ServeReverse(serving, s.ln, proxy.NewHTTPServer(s.handler, s.tlsCfg, s.log))
	}
	s.handler.Drain()
	// An unresponsive trace collector must not hold the exit: flushing
	// spans and captures gets ShutdownTimeout.
	cctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	s.close(cctx)
	return err
}

// listenMetrics starts serving scrapes of m, /livez and /readyz, first
// thing, so that while New syncs the replay's caches a load balancer gets
// a 503 saying so rather than a refused connection. Off loopback,
// /metrics is plain HTTP without authentication, as Prometheus scrapes
// by default: it names no user, path or secret, only counts.
func (s *Server) listenMetrics(m *metrics.Metrics) error {
	if m == nil {
		return nil
	}
	ms, err := metrics.Listen(s.opts.MetricsListen, m.Registry(), s.log, s.ready)
	if err != nil {
		return fmt.Errorf("--metrics-listen=%s: %w (give another address, or off)", s.opts.MetricsListen, err)
	}
	s.metrics, s.MetricsAddr = ms, ms.Addr()
	s.shutdown = append(s.shutdown, ms.Close)
	go func() {
		if err := ms.Serve(); err != nil {
			s.log.Error("--metrics-listen: serving /metrics stopped", "error", err)
		}
	}()
	s.log.Info("serving kproxy's metrics", "addr", s.MetricsAddr, "path", "/metrics")
	if host, _, _ := net.SplitHostPort(s.opts.MetricsListen); !isLoopback(host) {
		s.log.Warn("kproxy's metrics are served beyond loopback, as plain HTTP without authentication: "+
			"whoever reaches the address sees kproxy's request rates and replay health (counts only: no user, path or secret); keep it on a network only Prometheus reaches",
			"addr", s.MetricsAddr)
	}
	return nil
}

// ready says why kproxy should not get traffic yet (nil: it should): it
// is starting (what it waits for), its replay's caches have not synced,
// or it is stopping.
func (s *Server) ready() error {
	if s.stopping.Load() {
		return errors.New("kproxy is stopping")
	}
	if what := s.starting.Load(); what != nil {
		return errors.New("kproxy is starting: " + *what)
	}
	if p := s.pipeline.Load(); p != nil {
		return p.Ready()
	}
	return nil
}

// ShutdownTimeout bounds the flush of spans and captures when kproxy stops.
const ShutdownTimeout = 5 * time.Second

func (s *Server) close(ctx context.Context) {
	if s.ln != nil {
		s.ln.Close()
	}
	for i := len(s.shutdown) - 1; i >= 0; i-- {
		_ = s.shutdown[i](ctx)
	}
	s.shutdown = nil
}

// servingCert is the given certificate, or one from kproxy's CA for the
// names clients will use: the listen address (reverse) or the apiserver's
// host (forward).
func (s *Server) servingCert(upstream *url.URL) (tls.Certificate, error) {
	o := s.opts
	if o.TLSCertFile != "" {
		c, err := tls.LoadX509KeyPair(o.TLSCertFile, o.TLSKeyFile)
		if err != nil {
			return c, fmt.Errorf("--tls-cert-file/--tls-private-key-file: %w", err)
		}
		return c, nil
	}
	dir := o.PKIDir
	if dir == "" {
		dir = DefaultPKIDir()
	}
	ca, err := pki.LoadOrCreateCA(dir, "kproxy-ca")
	if err != nil {
		return tls.Certificate{}, err
	}
	s.CA = ca
	leaf := pki.Leaf{CommonName: "kproxy", Server: true, DNSNames: []string{"localhost"},
		IPs: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}}
	hosts := []string{}
	if h, _, err := net.SplitHostPort(o.Listen); err == nil {
		hosts = append(hosts, h)
	}
	if hn, err := os.Hostname(); err == nil {
		hosts = append(hosts, hn)
	}
	if o.Mode == "forward" {
		hosts = append(hosts, upstream.Hostname())
	}
	for _, h := range hosts {
		if h == "" || h == "0.0.0.0" || h == "::" {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			leaf.IPs = append(leaf.IPs, ip)
		} else {
			leaf.DNSNames = append(leaf.DNSNames, strings.ToLower(h))
		}
	}
	issued, err := ca.Issue(leaf)
	if err != nil {
		return tls.Certificate{}, err
	}
	return issued.TLSCertificate(ca.Cert), nil
}

// certAuthenticator builds the apiserver's certificate authenticators from
// the mirrored --client-ca-file and --requestheader-* flags.
// It also returns every CA the apiserver names in its TLS certificate
// request (both files), for kproxy to name the same.
func certAuthenticator(o *apiserver.Options) (authenticator.Request, *x509.CertPool, error) {
	var clientCA *x509.CertPool
	var rh *proxy.RequestHeaderOptions
	var err error
	all := x509.NewCertPool()
	if f := o.ClientCAFile(); f != "" {
		if clientCA, err = readPool("--client-ca-file", f, all); err != nil {
			return nil, nil, err
		}
	}
	if r := o.RequestHeader(); r.ClientCAFile != "" {
		pool, err := readPool("--requestheader-client-ca-file", r.ClientCAFile, all)
		if err != nil {
			return nil, nil, err
		}
		rh = &proxy.RequestHeaderOptions{ClientCA: pool, AllowedNames: r.AllowedNames,
			UsernameHeaders: r.UsernameHeaders, UIDHeaders: r.UIDHeaders,
			GroupHeaders: r.GroupHeaders, ExtraHeaderPrefixes: r.ExtraHeaderPrefixes}
	}
	if clientCA == nil && rh == nil {
		return nil, nil, nil
	}
	return proxy.NewCertAuthenticator(clientCA, rh), all, nil
}

// readPool reads a CA bundle, adding it to all as well.
func readPool(flag, file string, all *x509.CertPool) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s=%s: %w", flag, file, err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s=%s: no PEM certificates found in the file", flag, file)
	}
	all.AppendCertsFromPEM(b)
	return p, nil
}

// serveDebug exposes Go's profiler and expvar on a separate, plain-HTTP
// address meant for loopback.
func serveDebug(ctx context.Context, addr string, log *slog.Logger) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.Handle("/debug/vars", expvar.Handler())
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	log.Info("debug endpoints", "addr", addr, "pprof", "/debug/pprof/", "expvar", "/debug/vars")
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("--debug-addr", "error", err)
	}
}

// checkCaptureRotation refuses --capture-max* flags that would do nothing.
func (o *Options) checkCaptureRotation() error {
	r := o.CaptureRotation
	var given []string
	if r.MaxBackups != 0 {
		given = append(given, "--capture-maxbackup")
	}
	if r.MaxAge != 0 {
		given = append(given, "--capture-maxage")
	}
	if r.Compress {
		given = append(given, "--capture-compress")
	}
	switch {
	case r.MaxBackups < 0:
		return fmt.Errorf("--capture-maxbackup=%d: want 0 (keep every rotated file) or more", r.MaxBackups)
	case (r.MaxSize > 0 || len(given) > 0) && o.Capture == "":
		return fmt.Errorf("--capture-maxsize, --capture-maxbackup, --capture-maxage and --capture-compress rotate the capture file: give --capture FILE too")
	case r.MaxSize > 0 && o.Capture == record.Stdout:
		return fmt.Errorf("--capture-maxsize rotates a capture file, and --capture - writes to standard output: give --capture FILE, or leave rotation to what reads the output (the container runtime rotates a pod's log)")
	case r.MaxSize == 0 && len(given) > 0:
		return fmt.Errorf("%s: capture files rotate only past a size: give --capture-maxsize MiB too", strings.Join(given, ", "))
	}
	return nil
}
