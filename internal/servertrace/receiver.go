package servertrace

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	_ "google.golang.org/grpc/encoding/gzip" // OTEL_EXPORTER_OTLP_COMPRESSION=gzip
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/internal/record"
)

// Defaults of ReceiverOptions.
const (
	DefaultForwardQueue     = 1024
	DefaultForwardTimeout   = 10 * time.Second
	DefaultMaxPendingTraces = 10000
	DefaultMaxSpansPerTrace = 1000
	DefaultPendingAge       = 30 * time.Second
	// MaxMessageBytes bounds one export request (the apiserver's batches
	// are at most 512 spans).
	MaxMessageBytes = 16 << 20
)

// ReceiverOptions configure a Receiver.
type ReceiverOptions struct {
	// Join receives one Observation per request the apiserver traced
	// (a Joiner); nil: none are made.
	Join Offerer
	// Forward, when set, receives every export request's spans unchanged
	// (kproxy's own exporter's client: telemetry.Client), asynchronously;
	// the receiver starts and stops it. ForwardQueue bounds the batches
	// waiting (default DefaultForwardQueue): past it a batch is dropped,
	// counted, rather than slow the apiserver's exporter down.
	// ForwardTimeout bounds one upload (default DefaultForwardTimeout).
	Forward        otlptrace.Client
	ForwardQueue   int
	ForwardTimeout time.Duration
	// A request's spans wait for its root span (which ends last, so comes
	// last) at most PendingAge (default DefaultPendingAge), for at most
	// MaxPendingTraces traces (default DefaultMaxPendingTraces, the
	// oldest going first) of at most MaxSpansPerTrace spans each (default
	// DefaultMaxSpansPerTrace).
	MaxPendingTraces int
	MaxSpansPerTrace int
	PendingAge       time.Duration
	// Secrets are the secret values of the bodies kproxy forwards
	// (record.HeldSecrets), scrubbed from every error text of the spans
	// before anything sees them: the apiserver's errors may quote them
	// in free text (a policy's message). nil: none.
	Secrets *record.HeldSecrets
	Clock   clock.PassiveClock
	Log     *slog.Logger
}

// ReceiverStats count what a Receiver did.
type ReceiverStats struct {
	Requests     uint64 // export requests
	Spans        uint64
	Observations uint64
	// Evicted spans never met their root: too old, too many traces
	// pending, or too many spans in one trace.
	Evicted        uint64
	Invalid        uint64 // spans without a valid trace or span ID
	Pending        int    // spans waiting for their root now
	Forwarded      uint64 // batches passed on
	ForwardDropped uint64 // batches dropped: the queue was full
	ForwardFailed  uint64 // batches the exporter's endpoint refused or did not take in time
}

// Receiver is an OTLP/gRPC trace service for the apiserver's own spans:
// it passes every batch on to kproxy's exporter and turns each request's
// spans into an Observation once its root span has arrived.
type Receiver struct {
	coltracepb.UnimplementedTraceServiceServer

	join                  Offerer
	secrets               *record.HeldSecrets
	clock                 clock.PassiveClock
	log                   *slog.Logger
	maxTraces, maxSpans   int
	pendingAge            time.Duration
	mu                    sync.Mutex
	pending               map[traceKey]*pendingTrace
	order                 fifo[*pendingTrace]
	nPending              int
	stats                 ReceiverStats
	fwd                   otlptrace.Client
	fwdQueue              chan []*tracepb.ResourceSpans
	fwdTimeout            time.Duration
	fwdCtx                context.Context
	fwdCancel             context.CancelFunc
	fwdDone               chan struct{}
	fwdMu                 sync.RWMutex // guards sending on fwdQueue against its close
	fwdClosed             bool
	lastFwdLog            time.Time
	srvMu                 sync.Mutex
	srv                   *grpc.Server
	stopped               bool
	fwdFailedSinceLastLog uint64
	droppedSinceLastLog   uint64
}

type traceKey [16]byte

type pendingTrace struct {
	key   traceKey
	spans []*tracepb.Span
	first time.Time
}

// NewReceiver makes a receiver and starts its forwarding client, if any.
func NewReceiver(ctx context.Context, o ReceiverOptions) (*Receiver, error) {
	r := &Receiver{join: o.Join, secrets: o.Secrets, clock: o.Clock, log: o.Log, maxTraces: o.MaxPendingTraces, maxSpans: o.MaxSpansPerTrace,
		pendingAge: o.PendingAge, pending: map[traceKey]*pendingTrace{}, fwd: o.Forward, fwdTimeout: o.ForwardTimeout}
	if r.clock == nil {
		r.clock = clock.RealClock{}
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.maxTraces <= 0 {
		r.maxTraces = DefaultMaxPendingTraces
	}
	if r.maxSpans <= 0 {
		r.maxSpans = DefaultMaxSpansPerTrace
	}
	if r.pendingAge <= 0 {
		r.pendingAge = DefaultPendingAge
	}
	if r.fwdTimeout <= 0 {
		r.fwdTimeout = DefaultForwardTimeout
	}
	if r.fwd != nil {
		if err := r.fwd.Start(ctx); err != nil {
			return nil, fmt.Errorf("start the OTLP client that passes the apiserver's spans on: %w (check kproxy's --otlp-endpoint and OTEL_EXPORTER_OTLP_* settings)", err)
		}
		q := o.ForwardQueue
		if q <= 0 {
			q = DefaultForwardQueue
		}
		r.fwdQueue = make(chan []*tracepb.ResourceSpans, q)
		r.fwdCtx, r.fwdCancel = context.WithCancel(context.WithoutCancel(ctx))
		r.fwdDone = make(chan struct{})
		go r.forward()
	}
	return r, nil
}

// Export implements the OTLP trace service: it never waits for the
// forwarding nor fails the exporter for kproxy's sake.
func (r *Receiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	redactSpans(req.GetResourceSpans(), r.secrets.All)
	r.enqueue(req.GetResourceSpans())
	for _, o := range r.consume(req.GetResourceSpans()) {
		r.join.Offer(o)
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// consume files a batch of spans and returns the observations of the
// requests whose root span it completes (Export offers them to Join).
func (r *Receiver) consume(batch []*tracepb.ResourceSpans) []Observation {
	now := r.clock.Now()
	type ready struct {
		root  *tracepb.Span
		spans []*tracepb.Span
	}
	var roots []*tracepb.Span
	r.mu.Lock()
	r.stats.Requests++
	for _, rs := range batch {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.stats.Spans++
				if len(s.TraceId) != 16 || len(s.SpanId) != 8 {
					r.stats.Invalid++
					continue
				}
				root := r.join != nil && isRequestRoot(s)
				if !r.addLocked(s, now, root) {
					continue
				}
				if root {
					roots = append(roots, s)
				}
			}
		}
	}
	var done []ready
	for _, root := range roots {
		k := traceKey(root.TraceId)
		pt := r.pending[k]
		if pt == nil {
			continue
		}
		spans := takeSubtree(pt, root)
		r.nPending -= len(spans)
		if len(pt.spans) == 0 {
			delete(r.pending, k)
		}
		done = append(done, ready{root, spans})
	}
	r.evictLocked(now)
	r.mu.Unlock()
	if len(done) == 0 {
		return nil
	}
	obs := make([]Observation, 0, len(done))
	for _, d := range done {
		obs = append(obs, observe(d.root, d.spans))
	}
	r.mu.Lock()
	r.stats.Observations += uint64(len(obs))
	r.mu.Unlock()
	return obs
}

// addLocked files a span with its trace; roots are always filed.
func (r *Receiver) addLocked(s *tracepb.Span, now time.Time, root bool) bool {
	if r.join == nil {
		return false // nothing to observe for: only forwarding
	}
	k := traceKey(s.TraceId)
	pt := r.pending[k]
	if pt == nil {
		for len(r.pending) >= r.maxTraces {
			if !r.evictOldestLocked() {
				break
			}
		}
		pt = &pendingTrace{key: k, first: now}
		r.pending[k] = pt
		r.order.push(pt)
	}
	if len(pt.spans) >= r.maxSpans && !root {
		r.stats.Evicted++
		return false
	}
	pt.spans = append(pt.spans, s)
	r.nPending++
	return true
}

// evictLocked drops the traces pending longer than PendingAge.
func (r *Receiver) evictLocked(now time.Time) {
	for {
		pt, ok := r.order.peek()
		if !ok {
			return
		}
		switch {
		case r.pending[pt.key] != pt:
			r.order.pop() // completed (or replaced) since
		case now.Sub(pt.first) < r.pendingAge:
			return
		default:
			r.evictOldestLocked()
		}
	}
}

// evictOldestLocked drops the oldest pending trace; false when none is.
func (r *Receiver) evictOldestLocked() bool {
	for {
		pt, ok := r.order.pop()
		if !ok {
			return false
		}
		if r.pending[pt.key] != pt {
			continue // completed (or replaced) since
		}
		delete(r.pending, pt.key)
		r.nPending -= len(pt.spans)
		r.stats.Evicted += uint64(len(pt.spans))
		return true
	}
}

// takeSubtree removes root and the spans under it from pt, stopping at
// other requests' roots (a webhook calling back into the apiserver under
// the same trace), and returns them.
func takeSubtree(pt *pendingTrace, root *tracepb.Span) []*tracepb.Span {
	children := make(map[spanKey][]int, len(pt.spans))
	for i, s := range pt.spans {
		if len(s.ParentSpanId) == 8 {
			children[keyOf(s.ParentSpanId)] = append(children[keyOf(s.ParentSpanId)], i)
		}
	}
	take := make([]bool, len(pt.spans))
	out := make([]*tracepb.Span, 0, len(pt.spans))
	var walk func(s *tracepb.Span)
	walk = func(s *tracepb.Span) {
		for _, i := range children[keyOf(s.SpanId)] {
			c := pt.spans[i]
			if take[i] || isRequestRoot(c) {
				continue
			}
			take[i] = true
			out = append(out, c)
			walk(c)
		}
	}
	for i, s := range pt.spans {
		if s == root {
			take[i] = true
		}
	}
	out = append(out, root)
	walk(root)
	kept := pt.spans[:0]
	for i, s := range pt.spans {
		if !take[i] {
			kept = append(kept, s)
		}
	}
	clear(pt.spans[len(kept):])
	pt.spans = kept
	return out
}

// enqueue hands a batch to the forwarder, or drops it when the queue is
// full.
func (r *Receiver) enqueue(batch []*tracepb.ResourceSpans) {
	if r.fwd == nil || len(batch) == 0 {
		return
	}
	r.fwdMu.RLock()
	defer r.fwdMu.RUnlock()
	if r.fwdClosed {
		return
	}
	select {
	case r.fwdQueue <- batch:
	default:
		r.mu.Lock()
		r.stats.ForwardDropped++
		r.droppedSinceLastLog++
		r.mu.Unlock()
		r.logForwardTrouble(nil)
	}
}

// forward uploads the queued batches one at a time.
func (r *Receiver) forward() {
	defer close(r.fwdDone)
	for batch := range r.fwdQueue {
		ctx, cancel := context.WithTimeout(r.fwdCtx, r.fwdTimeout)
		err := r.fwd.UploadTraces(ctx, batch)
		cancel()
		r.mu.Lock()
		if err != nil {
			r.stats.ForwardFailed++
			r.fwdFailedSinceLastLog++
		} else {
			r.stats.Forwarded++
		}
		r.mu.Unlock()
		if err != nil {
			r.logForwardTrouble(err)
		}
	}
}

// logForwardTrouble logs dropped or failed batches at most once a
// minute, with the counts since the last line.
func (r *Receiver) logForwardTrouble(err error) {
	now := r.clock.Now()
	r.mu.Lock()
	if !r.lastFwdLog.IsZero() && now.Sub(r.lastFwdLog) < time.Minute {
		r.mu.Unlock()
		return
	}
	r.lastFwdLog = now
	dropped, failed := r.droppedSinceLastLog, r.fwdFailedSinceLastLog
	r.droppedSinceLastLog, r.fwdFailedSinceLastLog = 0, 0
	r.mu.Unlock()
	attrs := []any{"droppedBatches", dropped, "failedBatches", failed}
	if err != nil {
		attrs = append(attrs, "error", err)
	}
	r.log.Warn("the apiserver's spans are not all reaching kproxy's OTLP endpoint (a batch failed, or the forwarding queue was full and batches were dropped); records still get them", attrs...)
}

// Serve serves the OTLP/gRPC trace service on ln until Stop.
func (r *Receiver) Serve(ln net.Listener) error {
	r.srvMu.Lock()
	if r.stopped {
		r.srvMu.Unlock()
		return nil
	}
	if r.srv == nil {
		r.srv = grpc.NewServer(grpc.MaxRecvMsgSize(MaxMessageBytes))
		coltracepb.RegisterTraceServiceServer(r.srv, r)
	}
	srv := r.srv
	r.srvMu.Unlock()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("OTLP receiver on %s: %w", ln.Addr(), err)
	}
	return nil
}

// Stop stops serving (export requests under way finish), then gives the
// forwarder until ctx is done to pass on what it holds, and stops it.
func (r *Receiver) Stop(ctx context.Context) error {
	r.srvMu.Lock()
	srv := r.srv
	r.stopped = true
	r.srvMu.Unlock()
	if srv != nil {
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-ctx.Done():
			srv.Stop()
		}
	}
	if r.fwd == nil {
		return nil
	}
	r.fwdMu.Lock()
	if r.fwdClosed {
		r.fwdMu.Unlock()
		return nil
	}
	r.fwdClosed = true
	close(r.fwdQueue)
	r.fwdMu.Unlock()
	select {
	case <-r.fwdDone:
	case <-ctx.Done():
		r.fwdCancel()
		<-r.fwdDone
	}
	r.fwdCancel()
	return r.fwd.Stop(ctx)
}

// Stats reports what the receiver has done so far.
func (r *Receiver) Stats() ReceiverStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stats
	s.Pending = r.nPending
	return s
}

// urlAttributes are the span attributes that carry a request's URL or
// query, by the semantic conventions old and new.
var urlAttributes = map[string]bool{"http.target": true, "http.url": true, "url.full": true, "url.query": true}

// redactSpans redacts, in place, the credentials in the URLs the
// apiserver's spans carry (access_token, token and password query
// parameters, as records redact them) before anything else sees the
// spans: kproxy passes them on to its own OTLP endpoint (found by a
// probe: a services/proxy POST's ?password= reached Jaeger). What the
// apiserver's errors echo of a body or a stored object, in any other
// attribute, an event's or the span's status, is redacted as records
// redact it (record.RedactEchoes: a probe found a patched Secret's data
// there). The secret values of the bodies kproxy holds (secrets: found
// once a batch, when an error text is met) are scrubbed from the same
// texts: a policy's message may quote them in free text.
func redactSpans(batch []*tracepb.ResourceSpans, secrets func() []string) {
	var values []string
	found := false
	redact := func(s string) string {
		s = record.RedactEchoes(s)
		if s == "" || secrets == nil {
			return s
		}
		if !found {
			values, found = secrets(), true
		}
		return record.ScrubValues(s, values)
	}
	echoes := func(attrs []*commonpb.KeyValue) {
		for _, a := range attrs {
			if sv, ok := a.GetValue().GetValue().(*commonpb.AnyValue_StringValue); ok && !urlAttributes[a.GetKey()] {
				sv.StringValue = redact(sv.StringValue)
			}
		}
	}
	for _, rs := range batch {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				// Errors are in events ("Write to database call
				// failed", err) and statuses; a span's own attributes
				// on a failed span, or named as an error (the rest are
				// URLs and names: this runs for every span).
				for _, e := range s.GetEvents() {
					echoes(e.GetAttributes())
				}
				if st := s.GetStatus(); st != nil && st.GetCode() == tracepb.Status_STATUS_CODE_ERROR {
					st.Message = redact(st.Message)
					echoes(s.GetAttributes())
				} else {
					for _, a := range s.GetAttributes() {
						if k := strings.ToLower(a.GetKey()); strings.Contains(k, "err") || strings.Contains(k, "message") || strings.Contains(k, "exception") {
							echoes([]*commonpb.KeyValue{a})
						}
					}
				}
				for _, a := range s.GetAttributes() {
					if !urlAttributes[a.GetKey()] {
						continue
					}
					sv, ok := a.GetValue().GetValue().(*commonpb.AnyValue_StringValue)
					if !ok {
						continue
					}
					v := sv.StringValue
					if a.GetKey() == "url.query" {
						sv.StringValue = record.RedactQuery(v)
					} else if base, q, ok := strings.Cut(v, "?"); ok {
						sv.StringValue = base + "?" + record.RedactQuery(q)
					}
				}
			}
		}
	}
}
