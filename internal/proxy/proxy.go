package proxy

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/internal/decode"
	"github.com/kproxy/kproxy/internal/filter"
	"github.com/kproxy/kproxy/internal/flowview"
	"github.com/kproxy/kproxy/internal/logging"
	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/stages"
	"github.com/kproxy/kproxy/internal/telemetry"
)

// Replayer predicts a request's outcome (package stages).
type Replayer interface {
	Run(ctx context.Context, req *stages.Request) stages.Outcome
}

// apfNamer resolves the apiserver's APF response headers (UIDs) to names.
type apfNamer interface {
	APFNames(flowSchemaUID, priorityLevelUID string) (flowSchema, priorityLevel string)
}

// Config holds the proxy's collaborators; everything is injected.
type Config struct {
	// Upstream is the apiserver's URL (scheme and host).
	Upstream *url.URL
	// Passthrough carries requests with the caller's own credentials, or
	// none. It must not add credentials of its own.
	Passthrough http.RoundTripper
	// Impersonating carries verified certificate callers with kproxy's own
	// credentials. Nil: certificate callers are refused with a clear 403.
	Impersonating http.RoundTripper
	// WatchPassthrough and WatchImpersonating carry watches (nil: the
	// transports above do).
	WatchPassthrough   http.RoundTripper
	WatchImpersonating http.RoundTripper
	// CertAuthenticator verifies client certificates (NewCertAuthenticator).
	CertAuthenticator authenticator.Request
	// ImpersonationAuthorizer authorizes Impersonate-* headers sent by
	// certificate callers (NewImpersonationAuthorizer).
	ImpersonationAuthorizer authorizer.UnconditionalAuthorizer
	// Replayer runs the replay; nil disables it (prediction unknown).
	Replayer Replayer
	// Sink receives each finished record.
	Sink record.Sink
	// TracerProvider makes the server and upstream spans.
	TracerProvider trace.TracerProvider
	// Clock times the exchange.
	Clock clock.PassiveClock
	// HeldSecrets, when set, hold the secret values of the bodies in
	// flight (and of refused requests a while after) for kproxy's OTLP
	// receiver, which scrubs the apiserver's own spans of them.
	HeldSecrets *record.HeldSecrets
	// Mode is "reverse" or "forward", recorded on each record.
	Mode string
	// Rerun keeps the newest flows' requests, in memory, for Replay
	// (rerun.go); zero keeps none.
	Rerun RerunLimits
	// CaptureBodies records a write's body (secrets redacted) and its
	// Impersonate-* headers (bodies.go).
	CaptureBodies bool
	// BodyIdleTimeout ends a request whose body stops arriving for that
	// long (0: no limit).
	BodyIdleTimeout time.Duration
	// ReplayWorkers bounds the replays run at once (0:
	// DefaultReplayWorkers); ReplayQueue the replays waiting for a worker
	// (0: DefaultReplayQueue). Past both, a replay is shed: the request
	// is forwarded and recorded all the same, its prediction unknown
	// (replaypool.go).
	ReplayWorkers int
	ReplayQueue   int
	// ReplayNice, over 0, is the nice value (1 to 19) the replay workers'
	// threads run at, on Linux: a replay takes the CPU the apiserver, etcd
	// and forwarding leave (replaynice_linux.go).
	ReplayNice int
	// ReplayCPUPressure, a percent (0: off), makes the replay pool yield
	// while tasks waited for a CPU that share of the time, as it does
	// after a shed (cpupressure.go). CPUPressureTotal reads the
	// cumulative CPU stall time (nil: Linux PSI, /proc/pressure/cpu).
	ReplayCPUPressure float64
	CPUPressureTotal  func() (time.Duration, error)
	// ReplayBodyBudget bounds the request body bytes held for replays at
	// once (0: DefaultReplayBodyBudget, negative: no bound). Past it, a
	// write is forwarded and recorded, its replay shed (body.go).
	ReplayBodyBudget int64
	// Metrics receives kproxy's measurements; nil: none.
	Metrics *metrics.Metrics
	// Replica names this kproxy in its records ("": not named).
	Replica string
	// ReplayFilter picks the requests replayed (filter.ParseRequestOnly);
	// the others are forwarded and recorded, their prediction unknown.
	// nil: every request is replayed.
	ReplayFilter *filter.Expr
	// Log receives operational messages (never secrets).
	Log *slog.Logger
}

// Proxy is an http.Handler that forwards to the apiserver and records.
type Proxy struct {
	// cutting: the server's drain is over, and the requests still in
	// flight are being cut (CutInFlight).
	cutting             atomic.Bool
	upstream            *url.URL
	passthrough         http.RoundTripper
	impersonating       http.RoundTripper
	watchPassthrough    http.RoundTripper
	watchImpersonating  http.RoundTripper
	certAuth            authenticator.Request
	impersonationFilter http.Handler
	// impersonationAuthz builds a filter with nothing cached, to ask
	// again what impersonationFilter allowed (identity.go).
	impersonationAuthz authorizer.UnconditionalAuthorizer
	replayer           Replayer
	sink               record.Sink
	tracer             trace.Tracer
	propagator         propagation.TextMapPropagator
	clock              clock.PassiveClock
	held               *record.HeldSecrets
	mode               string
	log                *slog.Logger
	rp                 *httputil.ReverseProxy
	rpWatch            *httputil.ReverseProxy // small copy buffers for long-lived streams
	pending            sync.WaitGroup         // records not yet written
	reruns             *rerunStore            // nil: re-runs off
	captureBodies      bool
	bodyIdle           time.Duration
	perRequestLog      *slog.Logger // p.log, rate-limited
	shedLine           logging.Gate // the replay-shed warning
	recorder           recorder     // see completeLater
	pool               *replayPool
	// burst counts the requests relayed now that wait for their answer
	// (not long-running): the demand on kproxy's CPUs the replay pool
	// yields to under CPU pressure, and what tells a burst's end, when
	// the upstream connections it left idle are closed (idleconns.go).
	burst   *burstReaper
	bodies  *bodyBudget
	replica string
	metrics *metrics.Metrics // nil: none
	// selection is --replay-filter's choice of the requests replayed,
	// changed at run time through the flow API (SetReplayFilter); nil
	// replays every request.
	selection atomic.Pointer[replaySelection]
	// streams are the watches relayed off net/http (stream.go).
	streams detachedStreams
	// callers are who the replay authenticated each token as, to name the
	// caller of a request not replayed (callers.go).
	callers tokenCallers
}

// replaySelection is a replay filter and the outcome of the requests it
// leaves out on arrival, shared by their records as the shed outcomes
// are.
type replaySelection struct {
	expr     *filter.Expr
	filtered stages.Outcome
	// outside ends the gate's answer for a user the filter leaves out.
	outside string
}

// Drain waits until every record of a finished request has been written:
// call it after the server has stopped, before closing the sinks.
func (p *Proxy) Drain() { p.pending.Wait() }

// New builds a Proxy.
func New(cfg Config) (*Proxy, error) {
	if cfg.Upstream == nil || cfg.Upstream.Host == "" {
		return nil, errors.New("proxy: no upstream apiserver URL (give --upstream or --upstream-kubeconfig)")
	}
	if cfg.Passthrough == nil {
		return nil, errors.New("proxy: no upstream transport")
	}
	p := &Proxy{
		upstream:           cfg.Upstream,
		passthrough:        cfg.Passthrough,
		impersonating:      cfg.Impersonating,
		watchPassthrough:   cmp.Or(cfg.WatchPassthrough, cfg.Passthrough),
		watchImpersonating: cmp.Or(cfg.WatchImpersonating, cfg.Impersonating),
		certAuth:           cfg.CertAuthenticator,
		replayer:           cfg.Replayer,
		sink:               cfg.Sink,
		propagator:         telemetry.Propagator(),
		clock:              cfg.Clock,
		held:               cfg.HeldSecrets,
		mode:               cfg.Mode,
		log:                cfg.Log,
		reruns:             newRerunStore(cfg.Rerun),
		captureBodies:      cfg.CaptureBodies,
		bodyIdle:           cfg.BodyIdleTimeout,
		metrics:            cfg.Metrics,
		replica:            cfg.Replica,
	}
	p.selectBy(cfg.ReplayFilter)
	tp := cfg.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	// The certificate authenticator and the impersonation filter are the
	// apiserver's own code, run under the server span: kproxy's trace
	// keeps only kproxy's spans (telemetry.OwnSpansOnly).
	p.tracer = telemetry.OwnSpansOnly(tp).Tracer("github.com/kproxy/kproxy/internal/proxy")
	if p.clock == nil {
		p.clock = clock.RealClock{}
	}
	if cfg.ImpersonationAuthorizer != nil {
		p.impersonationFilter = newImpersonationFilter(cfg.ImpersonationAuthorizer)
		p.impersonationAuthz = cfg.ImpersonationAuthorizer
	}
	if p.sink == nil {
		p.sink = record.Sinks(nil)
	}
	p.sink = p.reruns.sink(p.sink)
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	// Lines a client can cause on every request are written once per
	// window, with a count (a rejected certificate retried in a loop).
	p.perRequestLog = slog.New(logging.RateLimit(p.log.Handler(), logging.DefaultWindow, p.clock))
	if p.mode == "" {
		p.mode = "reverse"
	}
	p.recorder.queue = make(chan *exchange, recorderBuffer)
	p.burst = newBurstReaper(p.clock, p.passthrough, p.impersonating, p.watchPassthrough, p.watchImpersonating)
	p.metrics.InFlight(func() float64 { return float64(p.burst.inFlight.Load()) }, func() float64 { return float64(p.burst.reaped.Load()) })
	p.pool = newReplayPool(cfg.ReplayWorkers, cfg.ReplayQueue, p.clock, p.metrics)
	p.pool.nice = cfg.ReplayNice
	if cfg.ReplayCPUPressure > 0 {
		total := cfg.CPUPressureTotal
		if total == nil {
			total = func() (time.Duration, error) { return readPSITotal(PSIPath) }
		}
		pressure, err := newCPUPressure(cfg.ReplayCPUPressure, p.clock, total)
		if err != nil {
			p.log.Info("CPU pressure cannot be read: the replay yields to forwarding only once its queue is full (--replay-cpu-pressure needs Linux PSI, "+PSIPath+")", "error", err)
		}
		if pressure != nil {
			p.pool.pressure, p.pool.demand = pressure, p.burst.inFlight.Load
			p.metrics.CPUPressure(pressure.Share)
		}
	}
	p.bodies = &bodyBudget{limit: cfg.ReplayBodyBudget}
	if cfg.ReplayBodyBudget == 0 {
		p.bodies.limit = DefaultReplayBodyBudget
	}
	p.metrics.ReplayBodies(p.bodies.held, max(0, p.bodies.limit))
	p.rp = &httputil.ReverseProxy{
		Rewrite:   p.rewrite,
		Transport: upstreamTransport{p: p},
		// ReverseProxy flushes every write of a response of unknown length
		// (watches, streamed LISTs: chunked) at once, headers included;
		// a response of known length is written as it comes, without a
		// flush (and a syscall) per write.
		FlushInterval:  0,
		BufferPool:     copyBuffers{pool: &bigCopyBuffers},
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.errorHandler,
		ErrorLog:       slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
	// A watch holds its copy buffer for as long as it is open, mostly
	// idle; events are small, so a small buffer keeps thousands of
	// watches cheap. Its transports share HTTP/2 connections.
	w := *p.rp
	w.BufferPool = copyBuffers{pool: &smallCopyBuffers}
	w.Transport = upstreamTransport{p: p, watch: true}
	p.rpWatch = &w
	return p, nil
}

// exchange is one request's state, shared by the handler, the transport
// hooks and the finisher.
type exchange struct {
	rec *record.Record
	// idle ends a request body that stops arriving (nil: no limit).
	idle *idleBody
	// span is the server span. It ends once the record is complete, so
	// that it carries what only the replay knows (the prediction, a
	// token caller's user), at the time the response ended.
	span trace.Span
	info *apirequest.RequestInfo // the request as the apiserver resolves it
	// answering: the request is not long-running, counted in
	// Proxy.burst until its relay ends.
	answering bool
	ident     identity
	// unreplayed: the request's replay was shed or filtered out.
	unreplayed bool
	actAs      user.Info // the user forwarded by impersonation
	// padded: an Impersonate-* value kproxy forwards has spaces around
	// it, which only HTTP/2 carries upstream.
	padded  bool
	auditID string
	body    *teeBody
	// errBody is the start of an error response's body (a Status), as the
	// client received it, whoever wrote it: the upstream, or kproxy.
	errBody []byte
	errCT   string
	// errStatus is errBody decoded, once (refusal).
	errStatus  *metav1.Status
	statusOnce sync.Once
	// headed is closed once a long-running request's answer has begun
	// (headStatus its status): its end waits on the stream, the replay
	// does not (actualAnswer). nil for the others.
	headed     chan struct{}
	headStatus int
	headFS     string // its X-Kubernetes-PF-FlowSchema-UID
	// refusalWaited: a replay waited streamRefusalWait for the refusal's
	// body once; later asks do not wait again.
	refusalWaited atomic.Bool
	// switched watches a connection the apiserver switched protocols on
	// (a WebSocket watch, exec, attach, port-forward), which
	// ReverseProxy copies to the client past the recorder.
	switched *switchedConn
	// actualWrite is the answer as the replay needs it; okBody the start
	// of a write's or a get's successful body: a write's is decoded for
	// the resourceVersion only when the replay asks (off the response's
	// path), a get's handed whole to the replay. okEncoding is its
	// Content-Encoding (gzip for a large answer to a client that asked).
	actualWrite stages.Answer
	okBody      []byte
	okEncoding  string
	okCT        string // its Content-Type
	rvOnce      sync.Once
	upStart     time.Time
	upEnd       time.Time
	start       time.Time
	end         time.Time
	// done is closed when the response has been relayed and rec's actual
	// side is final.
	done chan struct{}
	// replayReq is the replay's copy of the request, replayCtx its
	// context (the server span's, never canceled).
	replayReq *stages.Request
	// held: the body's secret values are held for the OTLP receiver
	// (Config.HeldSecrets) until the record is written.
	held bool
	// bodyDropped: the body was over the body budget, and not kept.
	bodyDropped bool
	replayCtx   context.Context
	// outcome is the replay's (or the shed's) outcome, headers the
	// request's headers redacted before the replay touched them.
	outcome stages.Outcome
	headers map[string][]string
	// parts counts what the record still waits for: the replay and the
	// relay. Whichever ends last writes the record.
	parts atomic.Int32
	// rw is the client's response writer (the handler's).
	rw *responseRecorder
	// detach is set for a stream that may be relayed off net/http
	// (stream.go); detached once it is, when the relay, not the
	// handler, finishes the exchange.
	detach   *detachable
	detached bool
}

type exchangeKey struct{}

func exchangeFrom(ctx context.Context) *exchange {
	ex, _ := ctx.Value(exchangeKey{}).(*exchange)
	return ex
}

// ServeHTTP forwards one request and records it, in three steps: begin
// (the record, the span, who is calling, the replay's copy of the
// request), answer (refuse what the apiserver would refuse before any
// upstream sees it, else forward), finish (complete the record's actual
// side once the response is relayed).
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ex, r, rw := p.begin(w, r)
	defer func() {
		v := recover()
		if ex.detached {
			// The stream's own relay finishes the exchange (stream.go).
			if v != nil {
				panic(v)
			}
			return
		}
		p.finish(ex, rw, v, r.Context().Err() != nil)
	}()
	p.answer(rw, r, ex)
}

// begin starts the exchange: the record and the server span, the
// replay's copy of the request (taken before anything here touches it),
// the caller's identity, and the body tee that hands the replay the body
// the apiserver reads. The replay runs in the replay pool, and the record
// is written once both the replay and the relay are over, by whichever
// ends last: the client never waits for either.
func (p *Proxy) begin(w http.ResponseWriter, r *http.Request) (*exchange, *http.Request, *responseRecorder) {
	start := p.clock.Now()
	ctx := p.propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	info, _ := stages.ResolveRequestInfo(r)
	id := newID()
	// The span is timed by the clock that times the record (it ends at
	// ex.end): its duration is the record's total.
	ctx, span := p.tracer.Start(ctx, spanName(r, info), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(start), trace.WithAttributes(requestAttributes(id, r, info)...))

	ex := &exchange{
		rec: &record.Record{
			ID: id, Start: start, Mode: p.mode, Replica: p.replica,
			TraceID:           span.SpanContext().TraceID().String(),
			KubernetesVersion: stages.KubernetesVersion,
			Request:           requestFields(r, info),
		},
		span:  span,
		info:  info,
		start: start,
		done:  make(chan struct{}),
	}
	ex.parts.Store(2)
	if !stages.IsLongRunning(r, info) {
		ex.answering = true
		p.burst.begin()
	} else {
		ex.headed = make(chan struct{})
	}
	// The apiserver uses a client-supplied Audit-ID; otherwise kproxy sets
	// one so its trace, the apiserver's trace and the audit log join up.
	ex.auditID = r.Header.Get("Audit-Id")
	if ex.auditID == "" {
		ex.auditID = id
	}
	rw := &responseRecorder{ResponseWriter: w, keepBody: stages.IsWrite(info)}
	ex.rw = rw

	replayReq := &stages.Request{ID: id, Arrival: start, HTTP: r.Clone(context.WithoutCancel(ctx)), Info: info}
	replayReq.HTTP.Body = nil
	// A write's replay reads the cluster as it was on arrival: it tells
	// its own write apart by the resourceVersion the apiserver answered
	// with (stages.Request.Actual). A get's replay checks that no write
	// came between the request and its read (the status is enough).
	replayReq.Actual = ex.actualAnswer
	ex.replayReq, ex.replayCtx = replayReq, context.WithoutCancel(ctx)
	p.pending.Add(1)
	startReplay := func(r teeResult) {
		if r.overBudget {
			p.shedOverBudget(ex)
			return
		}
		replayReq.Body, replayReq.BodyTruncated = r.body, r.truncated
		if p.held != nil && info != nil && stages.SecretBearing(info.Resource) && stages.IsWrite(info) {
			// Before the apiserver can answer: it reads the whole body.
			// A write without secrets in its body too (a label patch, a
			// delete): the values of the stored object its replay's
			// admission is given (stages.SecretStringsOf).
			p.held.Hold(id, func() []string { return stages.SecretStringsOf(replayReq) })
			ex.held = true
		}
		// A read changes nothing, so its replay can wait until the
		// response is relayed (finish submits it): off the client's
		// path, on a 2-core box that is latency saved. Writes replay at
		// once (state at arrival), and so do watches, which may stay
		// open for hours.
		if !shortRead(replayReq) {
			p.submitReplay(ex)
		}
	}
	// Identify after the copy: the front-proxy authenticator removes the
	// X-Remote-* headers it consumed.
	ex.ident = p.identify(r)
	ex.rec.Identity = ex.ident.kind
	if u := ex.ident.user; u != nil {
		ex.rec.Request.User, ex.rec.Request.Groups = u.GetName(), authenticatedGroups(u)
	}
	// A get's replay takes the object from a 200 answer instead of
	// reading etcd again (stages/apiserver/answered.go): keep the body,
	// unless the replay filter already leaves the request out.
	rw.keepBody = rw.keepBody || (answersObject(info) && p.mayReplay(ex))
	if r.Body != nil && r.Body != http.NoBody {
		if p.bodyIdle > 0 {
			ex.idle = &idleBody{ReadCloser: r.Body, ctl: http.NewResponseController(w), idle: p.bodyIdle, now: p.clock.Now}
			r.Body = ex.idle
		}
		ex.body = newTeeBody(r.Body, stages.MaxBodyBytes, r.ContentLength, p.bodies, startReplay)
		r.Body = ex.body
		if r.ContentLength > 0 && r.ContentLength <= smallBody && !ex.body.overBudget {
			r.Body = ex.body.readWhole()
			// Reading it, net/http answered the client's Expect:
			// 100-continue itself: the apiserver's 100 is not relayed
			// again (a probe saw two through kproxy, one direct).
			rw.continued = strings.EqualFold(r.Header.Get("Expect"), "100-continue")
		}
	} else {
		startReplay(teeResult{})
	}
	return ex, r.WithContext(context.WithValue(ctx, exchangeKey{}, ex)), rw
}

// smallBody is the largest request body kproxy reads whole before it
// forwards it. Streamed from the client's connection as the upstream
// transport writes it, a body the apiserver answers without reading (a
// POST to /apis, whose discovery handler ignores it) sometimes had the
// transport close the upstream connection before the last chunk of the
// answer: the client got the whole body but not its end ("unexpected
// EOF"), about one such POST in 200 over HTTP/1.1, with a bare
// httputil.ReverseProxy too, never directly. Read first, the body is
// written at once. A body this small is sent with the headers, so the
// request waits for nothing; larger ones still stream, and so does one
// the bodies' budget (--replay-body-budget-mib, the bound on what kproxy holds)
// cannot take: read whole, it would be held outside it.
const smallBody = 64 << 10

// actualAnswer is stages.Request.Actual: the apiserver's status and, for
// a write, decoded only when the replay asks (off the response's path),
// the resourceVersion it answered with; for any request refused, the
// Status it refused with.
func (ex *exchange) actualAnswer(ctx context.Context) (stages.Answer, bool) {
	// An answer already there is given even to a context already done
	// (a caller asking without waiting: the replay's shedGuard).
	select {
	case <-ex.done:
	default:
		if ex.headed != nil {
			return ex.streamAnswer(ctx)
		}
		select {
		case <-ex.done:
		case <-ctx.Done():
			return stages.Answer{}, false
		}
	}
	return ex.wholeAnswer(), true
}

// streamRefusalWait is how long the replay waits, once a long-running
// request is answered with a refusal, for the refusal's body to end;
// streamHeadWait how long for the answer to begin at all (a proxied
// backend or a kubelet that hangs held a replay worker for the whole
// replay budget, found by a probe).
const (
	streamRefusalWait = 2 * time.Second
	streamHeadWait    = 2 * time.Second
)

// streamAnswer is a long-running request's answer as soon as it has begun
// (a log followed, a proxied stream, an exec: their exchange ends with the
// stream, and a replay waiting for it held a replay worker as long, found
// by a probe: every prediction shed or late behind two 30 s streams).
// Its status is all the replay gets, unless it is a refusal whose body
// ends soon after.
func (ex *exchange) streamAnswer(ctx context.Context) (stages.Answer, bool) {
	head := time.NewTimer(streamHeadWait)
	defer head.Stop()
	select {
	case <-ex.done:
		return ex.wholeAnswer(), true
	case <-ex.headed:
	case <-head.C:
		return stages.Answer{}, false
	case <-ctx.Done():
		return stages.Answer{}, false
	}
	if ex.headStatus >= 300 && !ex.refusalWaited.Load() {
		t := time.NewTimer(streamRefusalWait)
		defer t.Stop()
		select {
		case <-ex.done:
			return ex.wholeAnswer(), true
		case <-t.C:
			ex.refusalWaited.Store(true)
		case <-ctx.Done():
		}
	}
	select {
	case <-ex.done:
		return ex.wholeAnswer(), true
	default:
		return stages.Answer{Status: ex.headStatus, FlowSchemaUID: ex.headFS}, true
	}
}

// wholeAnswer is the answer once the exchange has ended.
func (ex *exchange) wholeAnswer() stages.Answer {
	ex.rvOnce.Do(func() {
		// A dry run's too: it names the revision the request met.
		switch {
		case ex.actualWrite.Status < 300 && len(ex.okBody) > 0 && stages.IsWrite(ex.info):
			ex.actualWrite.ResourceVersion = decode.ObjectResourceVersion(ex.okBody, ex.okEncoding)
			if v := ex.info.Verb; v == "update" || v == "patch" {
				ex.actualWrite.EmptiedFinalizers = decode.ObjectEmptiedFinalizers(ex.okBody, ex.okEncoding)
			}
			if ex.info.Verb == "delete" && ex.actualWrite.ResourceVersion == "" && (ex.okEncoding == "" || strings.EqualFold(ex.okEncoding, "identity")) {
				if st, ok := decode.Status(ex.okCT, ex.okBody); ok && st.Details != nil {
					ex.actualWrite.DeletedUID = string(st.Details.UID)
				}
			}
		case ex.actualWrite.Status >= 400:
			ex.actualWrite.Refusal, _ = ex.refusal()
		}
	})
	return ex.actualWrite
}

// refusal is the error answer's Status (false when its body is none),
// decoded once for the replay and the record alike.
func (ex *exchange) refusal() (*metav1.Status, bool) {
	ex.statusOnce.Do(func() {
		if len(ex.errBody) > 0 {
			var ok bool
			if ex.errStatus, ok = decode.Status(ex.errCT, ex.errBody); !ok {
				// The timeout filter's 504 says its Status as text/plain.
				ex.errStatus, _ = decode.BareStatus(ex.errCT, ex.errBody, ex.rec.Actual.Status)
			}
		}
	})
	return ex.errStatus, ex.errStatus != nil
}

// identityEncoded says the body is sent as it is (no Content-Encoding).
func identityEncoded(h http.Header) bool {
	e := h.Get("Content-Encoding")
	return e == "" || strings.EqualFold(e, "identity")
}

// answer refuses what the apiserver would refuse before the upstream sees
// it (a certificate it would reject: its 401; a certificate caller's
// impersonation it would not allow: its 403), and forwards the rest, as
// the caller or, for a verified certificate caller, by impersonation.
func (p *Proxy) answer(rw *responseRecorder, r *http.Request, ex *exchange) {
	switch ex.ident.kind {
	case IdentityRejected:
		ex.answeredHere(rw, "answered by kproxy: the apiserver's 401 for "+ex.ident.cred.Describe()+": "+ex.ident.err.Error())
		unauthorized(rw, r, ex.info)
		p.perRequestLog.Info("client certificate rejected", "id", ex.rec.ID, "reason", ex.ident.err)
		return
	case IdentityCertificate:
		if p.impersonating == nil {
			ex.rec.Actual.Error = "answered by kproxy: no upstream credentials to impersonate a certificate caller"
			http.Error(rw, "kproxy verified your client certificate but has no credentials of its own to forward it with (start kproxy with --upstream-kubeconfig)", http.StatusBadGateway)
			return
		}
		if hasImpersonation(r.Header) {
			// A refusal is kproxy's own answer, with the headers the
			// apiserver's refusals carry (a probe: no Audit-Id, no
			// Cache-Control); what passes is forwarded on rw as it is.
			why := "answered by kproxy: its run of the apiserver's impersonation filter (kube-apiserver's own code, asking the apiserver's authorizer) refused the caller's Impersonate-* headers; " +
				"kproxy forwards a certificate caller under its own identity, so the apiserver never sees this request"
			if p.impersonationFilter == nil {
				why = "answered by kproxy: it cannot authorize a certificate caller's Impersonate-* headers without an authorizer (no upstream credentials to ask SubjectAccessReviews with)"
			}
			refusal := &answeredHereWriter{ResponseWriter: rw, ex: ex, why: why}
			p.withCallerImpersonation(refusal, r, ex.info, authenticated(ex.ident.user), func(_ http.ResponseWriter, r *http.Request, u user.Info) {
				refusal.forwarded = true
				p.forwardAs(rw, r, ex, u)
			})
			return
		}
		p.forwardAs(rw, r, ex, ex.ident.user)
		return
	}
	// Only an HTTP/2 client's header values keep spaces around them
	// (HTTP/1.1 trims them, kproxy's server as the apiserver's).
	ex.padded = r.ProtoMajor == 2 && paddedImpersonation(r.Header)
	p.forward(rw, r, ex)
}

// answeredHereWriter writes kproxy's own answer to an exchange: the first
// write marks it answered here (answeredHere), unless the request was
// forwarded instead.
type answeredHereWriter struct {
	http.ResponseWriter
	ex        *exchange
	why       string
	forwarded bool
	written   bool
}

func (w *answeredHereWriter) WriteHeader(code int) {
	if !w.written && !w.forwarded {
		w.ex.answeredHere(w.ResponseWriter, w.why)
	}
	w.written = true
	w.ResponseWriter.WriteHeader(code)
}

func (w *answeredHereWriter) Write(b []byte) (int, error) {
	if !w.written {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// answeredHere marks the exchange as answered by kproxy itself (why, the
// record's error) and gives the answer the headers the apiserver's own
// refusals carry.
func (ex *exchange) answeredHere(w http.ResponseWriter, why string) {
	ex.rec.Actual.Error = why
	ex.rec.Actual.AuditID = ex.auditID
	w.Header().Set("Audit-Id", ex.auditID)
	w.Header().Set("Cache-Control", "no-cache, private")
}

// finish completes the record's actual side once the response has been
// relayed and releases the replay to write the record (which ends the
// server span, at ex.end). v is a panic from the relay:
// http.ErrAbortHandler (the client went away mid-stream) must reach
// net/http so that it drops the connection instead of ending the stream
// as if it were complete. clientGone: the client's request had ended
// (it closed its connection or stream), which the record says rather
// than net/http's "abort Handler" (found by a probe: every watch a client
// stopped read so).
func (p *Proxy) finish(ex *exchange, rw *responseRecorder, v any, clientGone bool) {
	abort := ""
	switch {
	case v == nil:
	case v == http.ErrAbortHandler && clientGone && p.cutting.Load():
		abort = "response aborted: " + errCutAtShutdown.Error()
	case v == http.ErrAbortHandler && clientGone:
		abort = "response aborted: " + errClientGone.Error()
	default:
		abort = fmt.Sprintf("response aborted: %v", v)
	}
	p.finishExchange(ex, rw, abort)
	if v != nil {
		panic(v)
	}
}

// finishExchange is finish without the panic, for a relay that ends off
// the handler (stream.go); abort is why the response was cut short ("":
// it was not).
func (p *Proxy) finishExchange(ex *exchange, rw *responseRecorder, abort string) {
	if ex.body != nil {
		ex.body.finish()
		ex.rec.Request.BodyBytes = ex.body.bytesRead()
	}
	if abort != "" && ex.rec.Actual.Error == "" {
		ex.rec.Actual.Error = abort
	}
	// A switch of protocols (exec, attach, port-forward) is written on
	// the hijacked connection, past the recorder: modifyResponse saw it.
	if rw.status != 0 || ex.rec.Actual.Status != http.StatusSwitchingProtocols {
		ex.rec.Actual.Status = rw.status
	}
	ex.rec.Actual.ResponseBytes = rw.bytes
	if ex.switched != nil {
		ex.rec.Actual.ResponseBytes = ex.switched.n.Load()
		if ex.switched.clientFirst() && ex.rec.Actual.Error == "" {
			ex.rec.Actual.Error = "the client closed its connection after the switch of protocols, before the apiserver closed its side"
		}
	}
	if rw.tally != nil {
		n := rw.tally.Events()
		ex.rec.Actual.Events = &n
		if st := rw.tally.LastError(); st != nil {
			ex.rec.Actual.StreamError = &record.StreamStatus{Code: int(st.Code), Reason: string(st.Reason), Message: st.Message}
		}
	}
	ex.rec.Actual.Headers = record.RedactHeaders(rw.Header())
	ex.errBody, ex.errCT = rw.errBody, rw.Header().Get("Content-Type")
	ex.actualWrite, ex.okBody, ex.okEncoding = stages.Answer{Status: rw.status, LastModified: rw.Header().Get("Last-Modified"),
		FlowSchemaUID: rw.Header().Get("X-Kubernetes-Pf-Flowschema-Uid")}, rw.okBody, rw.Header().Get("Content-Encoding")
	ex.okCT = rw.Header().Get("Content-Type")
	if rw.status == http.StatusOK && abort == "" && answersObject(ex.info) && int64(len(rw.okBody)) == rw.bytes {
		h := rw.Header()
		ex.actualWrite.Body, ex.actualWrite.ContentType, ex.actualWrite.ContentEncoding = rw.okBody, h.Get("Content-Type"), ex.okEncoding
	}
	ex.end = p.clock.Now()
	close(ex.done)
	if ex.answering {
		p.burst.end()
	}
	// The body tee has handed the replay its copy (ex.body.finish above):
	// a short read's replay starts now.
	if shortRead(ex.replayReq) {
		p.submitReplay(ex)
	}
	if ex.parts.Add(-1) == 0 {
		// The replay is over too: the record is written off the
		// handler's goroutine, which net/http needs to end the response.
		p.completeLater(ex)
	}
}

// reverseProxyFor is the one place a watch is told apart on its way
// upstream: its copy buffers and its transports.
func (p *Proxy) reverseProxyFor(ex *exchange) *httputil.ReverseProxy {
	if ex.rec.Request.Verb == "watch" {
		return p.rpWatch
	}
	return p.rp
}

// forward sends the request upstream inside the upstream span.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, ex *exchange) {
	ctx, span := p.tracer.Start(r.Context(), "upstream", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("server.address", p.upstream.Host)))
	detached := false
	defer func() {
		if !detached { // else the stream's relay ends the span
			// A relay that panicked (http.ErrAbortHandler: the client
			// went away mid-answer) still ends the upstream's time
			// (it had said 0 for a watch held seconds).
			if ex.upEnd.IsZero() {
				ex.upEnd = p.clock.Now()
			}
			span.End()
		}
	}()
	ex.upStart = p.clock.Now()
	if mayDetach(w, r, ex) {
		if detached = p.forwardStream(w, r.WithContext(ctx), ex, span); detached {
			return
		}
	} else {
		p.reverseProxyFor(ex).ServeHTTP(w, r.WithContext(ctx))
	}
	ex.upEnd = p.clock.Now()
	if ex.rec.Actual.Error != "" {
		span.SetStatus(codes.Error, ex.rec.Actual.Error)
	}
}

// rewrite builds the upstream request: same method, path, query, headers
// and body; kproxy adds only Audit-ID (when absent), traceparent, the
// caller's address, and for certificate callers the impersonation headers.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	ex := exchangeFrom(pr.In.Context())
	keepConnectionNamed(pr.In.Header, pr.Out.Header)
	pr.SetURL(p.upstream)
	if ip, _, err := net.SplitHostPort(pr.In.RemoteAddr); err == nil {
		pr.Out.Header.Set("X-Forwarded-For", ip)
	}
	if ex == nil {
		return
	}
	if pr.Out.Header.Get("Audit-Id") == "" {
		pr.Out.Header.Set("Audit-Id", ex.auditID)
	}
	p.propagator.Inject(pr.Out.Context(), propagation.HeaderCarrier(pr.Out.Header))
	if ex.actAs != nil {
		setImpersonation(pr.Out.Header, ex.actAs)
	}
}

// hopByHop are the headers RFC 9110 names as a connection's own, which
// no proxy passes on (the apiserver reads none of them).
var hopByHop = map[string]bool{"Connection": true, "Proxy-Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true}

// keepConnectionNamed puts back on the outbound request the headers the
// client's Connection header names, which ReverseProxy removes as a
// connection's own (RFC 9110, 7.6.1). The apiserver reads them all the
// same when they come to it directly (net/http leaves them to the
// handler): with Connection: Impersonate-User, a request kproxy sent on
// without its Impersonate-User ran as the caller, where the apiserver
// would have run it as the user named, with that user's narrower access
// (a probe: admin impersonating "nobody" listed kube-system's Secrets
// through kproxy, 403 directly); with Connection: Authorization the
// caller went as anonymous. Those RFC 9110 names as hop-by-hop stay
// removed.
func keepConnectionNamed(in, out http.Header) {
	for _, line := range in.Values("Connection") {
		for _, name := range strings.Split(line, ",") {
			k := http.CanonicalHeaderKey(strings.TrimSpace(name))
			if k == "" || hopByHop[k] {
				continue
			}
			if vs, ok := in[k]; ok {
				out[k] = slices.Clone(vs)
			}
		}
	}
}

// roundTrip picks the transport for the caller's identity, over HTTP/2
// for a watch (newWatchTransport) unless it asks for an upgrade. It is where
// kproxy sees exactly what goes upstream: a request sent without a body
// tells the replay so at once (the body kproxy tees is what the apiserver
// reads, whatever the client's protocol).
func (p *Proxy) roundTrip(req *http.Request, watch bool) (*http.Response, error) {
	ex := exchangeFrom(req.Context())
	if ex != nil && ex.body != nil && (req.Body == nil || req.Body == http.NoBody) {
		ex.body.sentNothing()
	}
	caller, own := p.passthrough, p.impersonating
	// HTTP/1.1 trims the spaces around a header's value, and an
	// Impersonate-* value is a name: padded, it goes over HTTP/2.
	if (watch || ex != nil && ex.padded) && req.Header.Get("Upgrade") == "" {
		caller, own = p.watchPassthrough, p.watchImpersonating
	}
	if ex != nil && ex.actAs != nil {
		return own.RoundTrip(req)
	}
	return caller.RoundTrip(req)
}

// maxStatusBody bounds the copy of an error body kept to read its Status.
const maxStatusBody = 256 << 10

func (p *Proxy) modifyResponse(resp *http.Response) error {
	ex := exchangeFrom(resp.Request.Context())
	if ex == nil {
		return nil
	}
	if ex.idle != nil && ex.idle.stalled.Load() {
		// kproxy cut the request's body (it stopped arriving): an answer
		// that comes after is the apiserver's to a request kproxy ended
		// (its timeout filter answers 504 once the request's context
		// ends), not to the request. errorHandler answers 408, as it
		// does when the cut reaches the transport first (a race: a
		// stalled body got the apiserver's 504 on a loaded machine).
		// ReverseProxy closes the body.
		return errBodyStalled
	}
	a := &ex.rec.Actual
	a.Status = resp.StatusCode
	if ex.headed != nil {
		ex.headStatus, ex.headFS = resp.StatusCode, resp.Header.Get("X-Kubernetes-Pf-Flowschema-Uid")
		close(ex.headed)
	}
	a.AuditID = resp.Header.Get("Audit-Id")
	a.FlowSchemaUID = resp.Header.Get("X-Kubernetes-Pf-Flowschema-Uid")
	a.PriorityLevelUID = resp.Header.Get("X-Kubernetes-Pf-Prioritylevel-Uid")
	a.Warnings = resp.Header.Values("Warning")
	a.RetryAfter = resp.Header.Get("Retry-After")
	// A compressed stream (the apiserver gzips a watch for a client that
	// accepts it) is not counted: kproxy would have to inflate every
	// byte of it, and counting its compressed bytes as frames was wrong
	// (probe AH: 0 recorded for 6 events).
	if ex.rw != nil && resp.StatusCode == http.StatusOK && ex.rec.Request.Verb == "watch" && identityEncoded(resp.Header) {
		ex.rw.tally = decode.NewWatchTally(resp.Header.Get("Content-Type"))
	}
	if rwc, ok := resp.Body.(io.ReadWriteCloser); ok && resp.StatusCode == http.StatusSwitchingProtocols {
		ex.switched = &switchedConn{ReadWriteCloser: rwc}
		resp.Body = ex.switched
	}
	if resp.Close && strings.HasPrefix(ex.rec.Request.Protocol, "HTTP/1") && resp.StatusCode != http.StatusSwitchingProtocols {
		// The apiserver closes the connection after this answer (a
		// refused upgrade: a bare 403): an HTTP/1.1 client is told so,
		// as it would be directly, and sends its next request on a new
		// one (probe AD: kproxy kept it open and served a request
		// pipelined after the refusal).
		resp.Header.Set("Connection", "close")
	}
	takeStream(resp, ex)
	if fillsReads(ex.info, resp) && resp.Body != http.NoBody {
		resp.Body = fullReads{resp.Body}
		if ex.rw != nil {
			ex.rw.unflushed = true
		}
	}
	return nil
}

// switchedConn is the apiserver's side of a connection that switched
// protocols: it counts what is read from it (what the client is sent),
// and tells which side ended the connection. ReverseProxy asserts the
// body is an io.ReadWriteCloser to copy both ways; its handler returns
// once either copy ends, and closes this side afterwards, on a goroutine
// of its own. A WebSocket closed by its close handshake ends on the
// apiserver's side: the server closes the TCP connection.
type switchedConn struct {
	io.ReadWriteCloser
	n atomic.Int64
	// upstreamEnded: a read from the apiserver failed (EOF included)
	// before kproxy closed this side.
	upstreamEnded, closed atomic.Bool
}

func (c *switchedConn) Read(p []byte) (int, error) {
	n, err := c.ReadWriteCloser.Read(p)
	c.n.Add(int64(n))
	if err != nil && !c.closed.Load() {
		c.upstreamEnded.Store(true)
	}
	return n, err
}

func (c *switchedConn) Close() error {
	c.closed.Store(true)
	return c.ReadWriteCloser.Close()
}

// clientFirst says, once ReverseProxy's handler has returned, that the
// client's side ended the connection (it closed it, or stopped taking
// what it was sent) while the apiserver's was still open.
func (c *switchedConn) clientFirst() bool { return !c.upstreamEnded.Load() }

// errBodyStalled ends a response to a request whose body kproxy cut.
var errBodyStalled = errors.New("the request body stopped arriving, and kproxy ended the request")

// errorHandler answers when the upstream gave no answer at all.
func (p *Proxy) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	ex := exchangeFrom(r.Context())
	if ex != nil && ex.idle != nil && ex.idle.stalled.Load() {
		// The client's body stopped arriving: the client's doing, not
		// the apiserver's (net/http may also have canceled the context).
		msg := fmt.Sprintf("the request body stopped arriving for %v (--request-body-idle-timeout); kproxy ended the request", p.bodyIdle)
		ex.rec.Actual.Error = msg
		p.perRequestLog.Warn("request body stalled: kproxy ended the request (--request-body-idle-timeout)", "path", r.URL.Path, "timeout", p.bodyIdle)
		http.Error(w, msg, http.StatusRequestTimeout)
		return
	}
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		// The client went away before the upstream answered, or kproxy,
		// shutting down, closed its connection.
		if ex != nil {
			ex.rec.Actual.Error = "client canceled the request"
			if p.cutting.Load() {
				ex.rec.Actual.Error = errCutAtShutdown.Error()
			}
		}
		w.WriteHeader(record.StatusClientCanceled) // never seen by the client; marks the record
		return
	}
	msg := fmt.Sprintf("kproxy could not reach the apiserver at %s: %v", p.upstream.Host, err)
	if hungUp(err) {
		// Reached, and it hung up: kube-apiserver aborts a request whose
		// handler panicked by closing the connection (HTTP/1.1) or
		// resetting the stream (HTTP/2), which a client sent straight to
		// it sees as such, not as an answer. kproxy aborts the client's
		// request alike (found by a probe: a protobuf body to a custom
		// resource crashes v1.37.2's handler; the client saw kproxy's
		// 502 where directly its stream was reset).
		msg = fmt.Sprintf("the apiserver at %s closed the connection without answering (%v): it aborted the request (a panic in its handler, or it was going away); "+
			"kproxy aborted the client's request alike", p.upstream.Host, err)
		if ex != nil {
			ex.rec.Actual.Error = msg
		}
		p.perRequestLog.Warn("upstream request failed", "error", err, "path", r.URL.Path)
		panic(http.ErrAbortHandler)
	}
	if ex != nil {
		ex.rec.Actual.Error = msg
	}
	// Once per window with a count: during an outage every request fails.
	p.perRequestLog.Warn("upstream request failed", "error", err, "path", r.URL.Path)
	http.Error(w, msg, http.StatusBadGateway)
}

// hungUp reports an upstream that took the request and ended it without
// an answer: the connection closed (EOF) or, over HTTP/2, the stream
// reset by the apiserver (net/http's bundled HTTP/2 exports no type for
// it: "stream error: ... received from peer").
func hungUp(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	s := err.Error()
	return strings.Contains(s, "stream error: ") && strings.Contains(s, "received from peer")
}

// submitReplay hands the request's replay to the pool, or, when the
// pool is full, records it as shed. It never blocks.
func (p *Proxy) submitReplay(ex *exchange) {
	if p.replayer == nil {
		ex.headers = record.RedactHeaders(ex.replayReq.HTTP.Header)
		p.replayDone(ex, p.replay(ex.replayCtx, ex.replayReq))
		return
	}
	if sel := p.selection.Load(); sel != nil && !p.selectReplay(ex, sel) {
		p.metrics.ReplayFiltered()
		p.recordUnreplayed(ex, sel.filtered)
		return
	}
	if p.pool.submit(func() { p.replayAndRecord(ex) }, stages.IsWrite(ex.info)) {
		return
	}
	if p.shedLine.Open(p.clock.Now(), logging.DefaultWindow) {
		p.perRequestLog.Warn("replay shed: the replay workers and their queue are full; the request is forwarded and recorded, its prediction unknown (raise --replay-workers or --replay-queue: a replay waiting on etcd, the apiserver or a webhook holds its worker without using CPU; or give kproxy more CPU)",
			"id", ex.rec.ID, "workers", p.pool.workers, "queue", p.pool.capacity, "shedTotal", p.pool.stats().Shed)
	}
	p.recordUnreplayed(ex, shedQueueOutcome)
}

// replayAndRecord runs the replay, on a worker of the pool; the record
// is written by whichever of the replay and the relay ends last. The
// replay never fails the exchange.
func (p *Proxy) replayAndRecord(ex *exchange) {
	req := ex.replayReq
	// The request's headers as the client sent them (the replay's copy,
	// taken on arrival), redacted here, off the client's path.
	ex.headers = record.RedactHeaders(req.HTTP.Header)
	o := p.replay(ex.replayCtx, req)
	if o.Gated {
		p.metrics.ReplayFiltered()
	} else {
		p.metrics.ReplayRan(o.Duration, o.Stages)
	}
	p.replayDone(ex, o)
}

// selectReplay decides on arrival whether --replay-filter picks the
// request: from its own fields, and from its caller when kproxy knows it
// already (a certificate caller not impersonating anyone). When the
// answer hangs on a user kproxy learns only by replaying authentication
// (a bearer token), the replay runs that far and the gate decides.
func (p *Proxy) selectReplay(ex *exchange, sel *replaySelection) bool {
	f := sel.expr
	userKnown := ex.ident.user != nil && !hasImpersonation(ex.replayReq.HTTP.Header)
	match, decided := f.MatchRequest(ex.rec, userKnown)
	if decided {
		return match
	}
	q := &ex.rec.Request
	probe := record.Record{Request: record.Request{
		Method: q.Method, Path: q.Path, Query: q.Query, Verb: q.Verb, APIGroup: q.APIGroup,
		Resource: q.Resource, Subresource: q.Subresource, Namespace: q.Namespace,
	}}
	ex.replayReq.Gate = func(caller, actingAs user.Info) string {
		probe.Request.User, probe.Request.Groups = caller.GetName(), caller.GetGroups()
		if actingAs.GetName() != caller.GetName() {
			probe.Request.ActingAs = actingAs.GetName()
		}
		if f.Match(&probe) {
			return ""
		}
		who := fmt.Sprintf("user %q", caller.GetName())
		if probe.Request.ActingAs != "" {
			who += fmt.Sprintf(" acting as %q", probe.Request.ActingAs)
		}
		return "replayed only as far as impersonation: " + who + sel.outside
	}
	return true
}

// ReplayFilter is the replay filter in force, normalised ("" when every
// request is replayed).
func (p *Proxy) ReplayFilter() string {
	if sel := p.selection.Load(); sel != nil {
		return sel.expr.String()
	}
	return ""
}

// SetReplayFilter puts a new replay filter in force for the requests that
// arrive from now on ("" replays every request), as --replay-filter would
// have, and returns it normalised. A filter that does not parse, or uses
// more than a request's own terms, is refused and the one in force kept.
func (p *Proxy) SetReplayFilter(expr string) (string, error) {
	if p.replayer == nil {
		return "", replayOff{}
	}
	f, err := filter.ParseRequestOnly(expr) // blank: every request
	if err != nil {
		return "", err
	}
	before := p.ReplayFilter()
	p.selectBy(f)
	p.log.Info("replay filter changed", "from", before, "to", f.String())
	return f.String(), nil
}

// replayOff is SetReplayFilter's refusal when the replay is off: a
// conflict with how kproxy runs, not the filter's fault.
type replayOff struct{}

func (replayOff) Error() string {
	return "the replay is off (kproxy serve --replay=false): there is nothing to filter; restart kproxy with the replay on"
}
func (replayOff) Conflict() bool { return true }

// selectBy puts f in force (nil: replay every request).
func (p *Proxy) selectBy(f *filter.Expr) {
	if f == nil || f.String() == "" {
		p.selection.Store(nil)
		return
	}
	outside := " is outside --replay-filter " + f.String()
	why := "not replayed: the request" + outside // the prediction's and every stage's
	p.selection.Store(&replaySelection{expr: f, outside: outside, filtered: unreplayed(why, why)})
}

// shedOverBudget records a request whose body the body budget could not
// hold: forwarded all the same, its prediction unknown.
func (p *Proxy) shedOverBudget(ex *exchange) {
	ex.bodyDropped = true
	p.metrics.ReplayShed()
	p.perRequestLog.Warn("replay shed: the request bodies held for replay are over --replay-body-budget-mib; the request is forwarded and recorded, its prediction unknown (raise --replay-body-budget-mib, or give kproxy more memory)",
		"id", ex.rec.ID, "budget", p.bodies.limit)
	p.recordUnreplayed(ex, shedBodyOutcome)
}

// recordUnreplayed files the outcome of a request not replayed (shed, or
// left out by --replay-filter; o says why):
// the record is written with the prediction unknown.
func (p *Proxy) recordUnreplayed(ex *exchange, o stages.Outcome) {
	ex.headers = record.RedactHeaders(ex.replayReq.HTTP.Header)
	ex.unreplayed = true
	p.replayDone(ex, o)
}

// replayDone files the replay's outcome, and writes the record when the
// response has been relayed already. The replay is over with the body.
func (p *Proxy) replayDone(ex *exchange, o stages.Outcome) {
	if ex.body != nil {
		ex.body.release()
	}
	ex.outcome = o
	if ex.parts.Add(-1) == 0 {
		p.complete(ex)
	}
}

// complete writes the record of an exchange whose replay and relay are
// both over.
func (p *Proxy) complete(ex *exchange) {
	defer p.pending.Done()
	ex.rec.Request.Headers = ex.headers
	p.keepForRerun(ex.replayReq)
	if p.captureBodies {
		captureBody(&ex.rec.Request, ex.replayReq)
	}
	p.writeRecord(ex, ex.outcome)
}

// completeLater writes the record of an exchange whose replay ended
// before its relay, on the recorder: one goroutine, kept while records
// come (once per workerLinger it ends if none waits), which writes them
// in the order their relays ended. A goroutine per record (as before) grew
// a fresh stack through the span's end for each: 2.4% of kproxy's CPU
// under overload, where every record is a shed request's. Past the
// recorder's buffer (a sink that stalls) a record gets a goroutine of
// its own: the handler never waits for a record.
func (p *Proxy) completeLater(ex *exchange) {
	r := &p.recorder
	select {
	case r.queue <- ex:
	default:
		go p.complete(ex)
		return
	}
	r.mu.Lock()
	if !r.running {
		r.running = true
		go p.record()
	}
	r.mu.Unlock()
}

// recorder is completeLater's goroutine and its buffer.
type recorder struct {
	queue   chan *exchange
	mu      sync.Mutex
	running bool
}

const recorderBuffer = 256

// record is the recorder's goroutine. It looks for the end once per
// workerLinger, under the lock completeLater starts it under: a record
// queued as it ends finds running false and starts another.
func (p *Proxy) record() {
	r := &p.recorder
	t := time.NewTimer(workerLinger)
	defer t.Stop()
	for {
		select {
		case ex := <-r.queue:
			p.complete(ex)
			continue
		case <-t.C:
		}
		r.mu.Lock()
		if len(r.queue) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		t.Reset(workerLinger)
	}
}

// shortRead reports a get, list or non-resource GET: reads that complete
// with their response.
// answersObject says whether a request is a get whose 200 answer is the
// object itself (no subresource), which its replay takes from the answer.
func answersObject(info *apirequest.RequestInfo) bool {
	return info != nil && info.IsResourceRequest && info.Verb == "get" && info.Subresource == ""
}

// mayReplay says whether the replay filter in force may pick ex (it
// picks it, or decides only once the caller is authenticated).
func (p *Proxy) mayReplay(ex *exchange) bool {
	if p.replayer == nil {
		return false
	}
	sel := p.selection.Load()
	if sel == nil {
		return true
	}
	userKnown := ex.ident.user != nil && !hasImpersonation(ex.replayReq.HTTP.Header)
	match, decided := sel.expr.MatchRequest(ex.rec, userKnown)
	return match || !decided
}

func shortRead(req *stages.Request) bool {
	if req.Info == nil {
		return false
	}
	if !req.Info.IsResourceRequest {
		return req.HTTP.Method == http.MethodGet || req.HTTP.Method == http.MethodHead
	}
	return (req.Info.Verb == "get" || req.Info.Verb == "list") && req.Info.Subresource == ""
}

func (p *Proxy) replay(ctx context.Context, req *stages.Request) (o stages.Outcome) {
	if p.replayer == nil {
		return disabledOutcome
	}
	defer func() {
		if v := recover(); v != nil {
			why, blame := stages.PanicReport(v, req.ID)
			p.log.Error("replay panicked ("+blame+")", "record", req.ID, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			o = stages.Outcome{Predicted: record.Prediction{Stage: record.StageUnknown, Message: "cannot predict: " + why}}
		}
	}()
	return p.replayer.Run(ctx, req)
}

// writeRecord completes the record with the replay's outcome and hands it
// to the sinks.
func (p *Proxy) writeRecord(ex *exchange, o stages.Outcome) {
	rec := ex.rec
	// Token callers are known once the replay has authenticated them; a
	// request not replayed is named as an earlier replay authenticated
	// its token, saying so.
	switch {
	case rec.Request.User != "":
	case o.Caller != nil:
		rec.Request.User, rec.Request.Groups = o.Caller.GetName(), o.Caller.GetGroups()
		if ex.ident.kind == IdentityToken {
			p.callers.note(ex.ident.token, rec.Request.User, rec.Request.Groups, p.clock.Now())
		}
	case ex.unreplayed && ex.ident.kind == IdentityToken:
		if c, ok := p.callers.lookup(ex.ident.token, p.clock.Now()); ok {
			rec.Request.User, rec.Request.Groups = c.name, c.groups
			o = namedFromEarlierReplay(o, c, p.clock.Now())
		}
	}
	rec.Predicted, rec.Stages = o.Predicted, o.Stages
	if o.ActingAs != nil && o.Caller != nil && o.ActingAs.GetName() != o.Caller.GetName() {
		rec.Request.ActingAs = o.ActingAs.GetName()
	}
	rec.Latency = record.Latency{TotalNs: ex.end.Sub(ex.start).Nanoseconds(), ReplayNs: o.Duration.Nanoseconds()}
	if !ex.upStart.IsZero() && !ex.upEnd.IsZero() {
		rec.Latency.UpstreamNs = ex.upEnd.Sub(ex.upStart).Nanoseconds()
	}
	if len(ex.errBody) > 0 {
		if st, ok := ex.refusal(); ok {
			rec.Actual.Reason, rec.Actual.Message = string(st.Reason), st.Message
		} else if strings.HasPrefix(ex.errCT, "text/plain") {
			// Some answers are plain text (APF's 429, kproxy's 502).
			rec.Actual.Message = strings.TrimSpace(string(ex.errBody))
		}
	}
	if rec.Actual.AuditID == "" {
		rec.Actual.AuditID = ex.auditID
	}
	if n, ok := p.replayer.(apfNamer); ok {
		rec.Actual.FlowSchema, rec.Actual.PriorityLevel = n.APFNames(rec.Actual.FlowSchemaUID, rec.Actual.PriorityLevelUID)
	}
	// The apiserver's words for a refused write (or any Secret's) may
	// quote its body or the stored object; the replay's own verdicts are
	// redacted where they are made (stages.secretValuesOut).
	if stages.MayEcho(rec.Request.Method, rec.Request.Resource) {
		// And the body's secret values, which a policy's or a webhook's
		// message may quote in free text (probe AE), in a refusal or a
		// warning (a policy bound with the Warn action).
		var values []string
		if (rec.Actual.Message != "" || len(rec.Actual.Warnings) > 0) && ex.replayReq != nil {
			values = stages.SecretStringsOf(ex.replayReq)
		}
		switch {
		case ex.bodyDropped && stages.SecretBearing(rec.Request.Resource):
			// The body was over the budget and not kept: which words of
			// the free text are its secrets cannot be told.
			withhold(&rec.Actual, withheldText)
		case ex.unreplayed && stages.SecretBearing(rec.Request.Resource) && rec.Request.Verb != "create":
			// Nor those of the stored object a patch, an update or a
			// delete is about, which only the replay reads.
			withholdAdmissionText(&rec.Actual)
		}
		rec.Actual.Message = record.ScrubValues(record.RedactEchoes(rec.Actual.Message), values)
		// Copies: the slices are the answer's headers'.
		scrubAll := func(ws []string) []string {
			out := make([]string, len(ws))
			for i, w := range ws {
				out[i] = record.ScrubValues(record.RedactEchoes(w), values)
			}
			return out
		}
		if len(rec.Actual.Warnings) > 0 {
			rec.Actual.Warnings = scrubAll(rec.Actual.Warnings)
		}
		if ws := rec.Actual.Headers["Warning"]; len(ws) > 0 {
			rec.Actual.Headers["Warning"] = scrubAll(ws)
		}
	}
	if ex.held {
		p.held.Settle(rec.ID, rec.Actual.Status >= 400 || len(rec.Actual.Warnings) > 0)
	}
	rec.Predicted = stages.OfTheMoment(rec.Predicted, rec.Actual)
	rec.Request.Query = record.RedactQuery(rec.Request.Query)
	// The span ends before the sinks see the record: whoever reads the
	// record finds its trace complete.
	endServerSpan(ex.span, rec, ex.end)
	p.metrics.Record(rec)
	p.sink.Write(rec)
}

// withheldText stands for the apiserver's free text about a request
// whose body kproxy did not keep (over --replay-body-budget-mib): a
// policy's or a webhook's message may quote the body's secrets, and
// nothing is left to scrub them by.
const withheldText = record.Redacted + " (the message may quote the request body's secret values; kproxy did not keep the body, over --replay-body-budget-mib, to scrub them by: raise it to see such messages)"

// withheldUnreplayedText stands for an admission policy's or webhook's
// free text about a stored Secret or ConfigMap whose request kproxy did
// not replay (shed, or outside --replay-filter): it may quote the stored
// object's secret values, which only the replay reads.
const withheldUnreplayedText = record.Redacted + " (an admission policy's or webhook's words may quote the stored object's secret values; kproxy did not replay this request, so it did not read them to scrub them by)"

// withhold replaces a's message and warnings with text.
func withhold(a *record.Actual, text string) {
	if a.Message != "" {
		a.Message = text
	}
	if len(a.Warnings) > 0 {
		a.Warnings = []string{text}
	}
	if len(a.Headers["Warning"]) > 0 {
		a.Headers["Warning"] = []string{text}
	}
}

// withholdAdmissionText withholds a's warnings (a webhook's are free
// text, unmarked) and its message when an admission policy or webhook
// wrote it; the apiserver's own refusals say nothing of the object's
// values and are kept.
func withholdAdmissionText(a *record.Actual) {
	msg := a.Message
	withhold(a, withheldUnreplayedText)
	if !admissionText(msg) {
		a.Message = msg
	}
}

// admissionText reports a refusal an admission policy or webhook wrote.
func admissionText(msg string) bool {
	for _, m := range []string{"ValidatingAdmissionPolicy", "MutatingAdmissionPolicy", "admission webhook"} {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// requestAttributes are the server span's attributes known on arrival
// (README, Tracing). Empty values are left out: a search for
// k8s.namespace must not match cluster-scoped requests.
func requestAttributes(id string, r *http.Request, info *apirequest.RequestInfo) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 11)
	attrs = appendString(attrs, "http.request.method", r.Method)
	attrs = appendString(attrs, "url.path", r.URL.Path)
	attrs = appendString(attrs, "user_agent.original", r.UserAgent())
	attrs = appendString(attrs, "kproxy.record.id", id)
	if info != nil {
		attrs = appendString(attrs, "k8s.verb", info.Verb)
		attrs = appendString(attrs, "k8s.api_group", info.APIGroup)
		attrs = appendString(attrs, "k8s.api_version", info.APIVersion)
		attrs = appendString(attrs, "k8s.resource", info.Resource)
		attrs = appendString(attrs, "k8s.subresource", info.Subresource)
		attrs = appendString(attrs, "k8s.namespace", info.Namespace)
		attrs = appendString(attrs, "k8s.name", info.Name)
	}
	return attrs
}

// endServerSpan sets what the finished record knows (who called, how the
// apiserver classified and answered, what the replay predicted, whether
// the two agree) and ends the span at end, when the response ended. A
// refused or failed request is an error, described in a few words.
func endServerSpan(span trace.Span, rec *record.Record, end time.Time) {
	attrs := make([]attribute.KeyValue, 0, 13)
	attrs = appendString(attrs, "kproxy.identity", rec.Identity)
	attrs = appendString(attrs, "enduser.id", rec.Request.User)
	if len(rec.Request.Groups) > 0 {
		attrs = append(attrs, attribute.StringSlice("k8s.user.groups", rec.Request.Groups))
	}
	attrs = appendString(attrs, "k8s.user.acting_as", rec.Request.ActingAs)
	attrs = appendString(attrs, "k8s.audit_id", rec.Actual.AuditID)
	attrs = appendString(attrs, "k8s.apf.flow_schema", rec.Actual.FlowSchema)
	attrs = appendString(attrs, "k8s.apf.priority_level", rec.Actual.PriorityLevel)
	if rec.Actual.Status != 0 {
		attrs = append(attrs, attribute.Int("http.response.status_code", rec.Actual.Status))
	}
	if rec.Predicted.Status != 0 {
		attrs = append(attrs, attribute.Int("kproxy.predicted.status", rec.Predicted.Status))
	}
	attrs = appendString(attrs, "kproxy.predicted.stage", rec.Predicted.Stage)
	attrs = appendString(attrs, "kproxy.predicted.reason", rec.Predicted.Reason)
	if rec.Predicted.Stage == record.StageUnknown {
		// Why kproxy cannot say (a replay shed, a state read late): the
		// first thing to ask of an unknown, in Jaeger too (a probe found
		// only "unknown" there).
		attrs = appendString(attrs, "kproxy.unknown.reason", rec.Predicted.Message)
	}
	_, agreement := flowview.Agreement(rec)
	attrs = append(attrs, attribute.String("kproxy.agreement", agreement.String()))
	span.SetAttributes(attrs...)
	if why := failure(&rec.Actual); why != "" {
		span.SetStatus(codes.Error, why)
	}
	span.End(trace.WithTimestamp(end))
}

// maxStatusDescription keeps a span's error description short: the
// record holds the whole message.
const maxStatusDescription = 200

// failure describes a refused or failed request in a few words ("403
// Forbidden", "502 Bad Gateway: kproxy could not reach ..."), or is ""
// for a success.
func failure(a *record.Actual) string {
	var why string
	if a.Status >= 400 {
		reason := a.Reason
		if reason == "" {
			reason = http.StatusText(a.Status)
		}
		why = strings.TrimSpace(fmt.Sprintf("%d %s", a.Status, reason))
	}
	if a.Error != "" {
		why = strings.TrimPrefix(why+": "+a.Error, ": ")
	}
	if len(why) > maxStatusDescription {
		why = strings.ToValidUTF8(why[:maxStatusDescription-3], "") + "..."
	}
	return why
}

func appendString(attrs []attribute.KeyValue, key, value string) []attribute.KeyValue {
	if value == "" {
		return attrs
	}
	return append(attrs, attribute.String(key, value))
}

// requestFields fills the record's request from what the apiserver will
// resolve; the user is filled in later when kproxy knows it.
func requestFields(r *http.Request, info *apirequest.RequestInfo) record.Request {
	q := record.Request{
		Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Protocol: r.Proto,
		UserAgent: r.UserAgent(), ContentType: r.Header.Get("Content-Type"),
	}
	if info != nil {
		q.Verb, q.APIGroup, q.APIVersion = info.Verb, info.APIGroup, info.APIVersion
		q.Resource, q.Subresource = info.Resource, info.Subresource
		q.Namespace, q.Name = info.Namespace, info.Name
	}
	return q
}

func spanName(r *http.Request, info *apirequest.RequestInfo) string {
	if info != nil && info.IsResourceRequest {
		res := info.Resource
		if info.Subresource != "" {
			res += "/" + info.Subresource
		}
		return info.Verb + " " + res
	}
	return r.Method + " " + r.URL.Path
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	// A UUIDv4, the form the apiserver itself uses for audit IDs.
	b[6] = (b[6] & 0x0f) | 0x40
	b[8] = (b[8] & 0x3f) | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// upstreamTransport is ReverseProxy's transport: Proxy.roundTrip, for
// watches or not.
type upstreamTransport struct {
	p     *Proxy
	watch bool
}

func (t upstreamTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return t.p.roundTrip(r, t.watch)
}

// responseRecorder notes the status and size of what reaches the client.
// Unwrap lets http.ResponseController reach Flush and Hijack underneath,
// which ReverseProxy uses for streaming and upgrades.
type responseRecorder struct {
	http.ResponseWriter
	status      int
	bytes       int64
	wroteHeader bool
	// continued: net/http answered the request's Expect: 100-continue
	// as kproxy read its body whole; the apiserver's 100 is dropped.
	continued bool
	errBody   []byte // the first maxStatusBody bytes of an error response
	// keepBody keeps the start of a write's or a get's successful
	// answer (one object) too: a write's resourceVersion tells the
	// replay which state was the request's own; a get's object is the
	// state the request met.
	keepBody bool
	okBody   []byte
	// unflushed: the answer is relayed in full reads (coalesce.go), with
	// no flush after each.
	unflushed bool
	// tally counts a watch's events as they reach the client.
	tally *decode.WatchTally
}

func (w *responseRecorder) WriteHeader(code int) {
	if code == http.StatusContinue && w.continued {
		return
	}
	if code >= 200 || code == http.StatusSwitchingProtocols {
		if w.wroteHeader {
			return
		}
		w.status, w.wroteHeader = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *responseRecorder) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.status, w.wroteHeader = http.StatusOK, true
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	if w.tally != nil {
		w.tally.Write(b[:n])
	}
	if w.status >= 400 && len(w.errBody) < maxStatusBody {
		w.errBody = append(w.errBody, b[:min(n, maxStatusBody-len(w.errBody))]...)
	} else if w.keepBody && w.status < 300 && len(w.okBody) < maxStatusBody {
		w.okBody = append(w.okBody, b[:min(n, maxStatusBody-len(w.okBody))]...)
	}
	return n, err
}

func (w *responseRecorder) Flush() {
	if w.unflushed {
		return
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *responseRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// copyBuffers recycles ReverseProxy's copy buffers: without a pool each
// request allocates one.
type copyBuffers struct{ pool *sync.Pool }

var (
	bigCopyBuffers   = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
	smallCopyBuffers = sync.Pool{New: func() any { b := make([]byte, 4<<10); return &b }}
)

func (c copyBuffers) Get() []byte  { return *c.pool.Get().(*[]byte) }
func (c copyBuffers) Put(b []byte) { c.pool.Put(&b) }
