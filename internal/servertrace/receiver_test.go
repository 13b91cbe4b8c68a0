package servertrace

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// offers collects observations.
type offers struct {
	mu  sync.Mutex
	obs []Observation
	got chan Observation
}

func newOffers() *offers { return &offers{got: make(chan Observation, 100)} }

func (o *offers) Offer(ob Observation) {
	o.mu.Lock()
	o.obs = append(o.obs, ob)
	o.mu.Unlock()
	o.got <- ob
}

func newTestReceiver(t *testing.T, o ReceiverOptions) *Receiver {
	t.Helper()
	r, err := NewReceiver(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	return r
}

func export(t *testing.T, r *Receiver, spans ...*tracepb.Span) {
	t.Helper()
	if _, err := r.Export(context.Background(), &coltracepb.ExportTraceServiceRequest{ResourceSpans: batch(spans...)}); err != nil {
		t.Fatal(err)
	}
}

func TestRootCompletesTheRequest(t *testing.T) {
	o := newOffers()
	r := newTestReceiver(t, ReceiverOptions{Join: o})
	tr, root := createWithSlowWebhook(1, "audit-1")
	var children []*tracepb.Span
	for _, s := range tr.spans {
		if s != root {
			children = append(children, s)
		}
	}
	// The children first (they end first), over two batches; another
	// request's spans in between.
	other, otherRoot := createWithSlowWebhook(2, "audit-2")
	export(t, r, children[:3]...)
	export(t, r, append(children[3:], other.spans...)...)
	if len(o.obs) != 1 || o.obs[0].AuditID != "audit-2" {
		t.Fatalf("observations before audit-1's root: %+v", o.obs)
	}
	export(t, r, root)
	if len(o.obs) != 2 {
		t.Fatalf("no observation for audit-1 after its root")
	}
	got := o.obs[1]
	if got.AuditID != "audit-1" || got.TraceID != tr.hex() || len(got.Server.Layers) != 11 /* folded (TestFoldACreate) */ || selfSum(got.Server) != got.Server.TotalNs {
		t.Errorf("observation: %+v", got)
	}
	if s := r.Stats(); s.Pending != 0 || s.Observations != 2 || s.Spans != uint64(len(tr.spans)+len(other.spans)) {
		t.Errorf("stats %+v", s)
	}
	_ = otherRoot
}

// TestNestedRequestInOneTrace: a webhook calls back into the apiserver
// under the same trace (its caller is in system:masters): two requests,
// two observations, each with its own spans.
func TestNestedRequestInOneTrace(t *testing.T) {
	o := newOffers()
	r := newTestReceiver(t, ReceiverOptions{Join: o})
	tr := newTrace(9)
	outer := tr.root("outer", 0, 100)
	h := tr.child(tr.chain(outer), "Create", 6, 95)
	wh := tr.child(h, "Call validating webhook", 10, 60, "webhook", "w")
	call := tr.add(wh, "HTTP POST", tracepb.Span_SPAN_KIND_CLIENT, 11, 59)
	inner := tr.add(call, "GET /api/v1/pods", tracepb.Span_SPAN_KIND_SERVER, 20, 50, attrAuditID, "inner")
	tr.child(tr.chain(inner), "List", 26, 45)
	export(t, r, tr.spans...)
	if len(o.obs) != 2 {
		t.Fatalf("%d observations, want 2", len(o.obs))
	}
	for _, ob := range o.obs {
		if ob.AuditID == "inner" && ob.Server.TotalNs != int64(30*time.Millisecond) {
			t.Errorf("inner: %+v", ob.Server)
		}
		for _, l := range ob.Server.Layers {
			if ob.AuditID == "outer" && l.Name == "handler List" {
				t.Error("the inner request's handler is in the outer's layers")
			}
		}
	}
	if s := r.Stats(); s.Pending != 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestPendingIsBounded(t *testing.T) {
	fc := clocktesting.NewFakePassiveClock(t0)
	o := newOffers()
	r := newTestReceiver(t, ReceiverOptions{Join: o, Clock: fc, MaxPendingTraces: 3, MaxSpansPerTrace: 2, PendingAge: time.Minute})
	// Five traces whose roots never come: the oldest two go.
	for i := range 5 {
		tr := newTrace(uint64(20 + i))
		export(t, r, tr.child(nil, "orphan", 0, 1))
	}
	if s := r.Stats(); s.Pending != 3 || s.Evicted != 2 {
		t.Errorf("count bound: %+v", s)
	}
	// Past PendingAge, all go.
	fc.SetTime(t0.Add(2 * time.Minute))
	export(t, r)
	if s := r.Stats(); s.Pending != 0 || s.Evicted != 5 {
		t.Errorf("age bound: %+v", s)
	}
	// Spans per trace are bounded, but the root is always filed.
	tr := newTrace(30)
	root := tr.root("a", 0, 10)
	for i := range 5 {
		tr.child(root, "x", float64(i), float64(i)+1)
	}
	export(t, r, tr.spans...)
	if s := r.Stats(); len(o.obs) != 1 || s.Evicted != 5+4 || s.Pending != 0 {
		t.Errorf("span bound: %d observations, %+v", len(o.obs), s)
	}
}

// fakeClient is an otlptrace.Client.
type fakeClient struct {
	mu      sync.Mutex
	batches [][]*tracepb.ResourceSpans
	block   chan struct{} // when set, uploads wait for it
	started bool
	stopped bool
}

func (f *fakeClient) Start(context.Context) error { f.started = true; return nil }
func (f *fakeClient) Stop(context.Context) error  { f.stopped = true; return nil }
func (f *fakeClient) UploadTraces(ctx context.Context, b []*tracepb.ResourceSpans) error {
	if f.block != nil {
		select {
		case <-f.block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.batches = append(f.batches, b)
	return nil
}

func (f *fakeClient) n() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.batches)
}

func TestForwardsEveryBatchUnchanged(t *testing.T) {
	fc := &fakeClient{}
	r, err := NewReceiver(context.Background(), ReceiverOptions{Join: newOffers(), Forward: fc})
	if err != nil {
		t.Fatal(err)
	}
	tr, _ := createWithSlowWebhook(1, "a")
	req := &coltracepb.ExportTraceServiceRequest{ResourceSpans: batch(tr.spans...)}
	if _, err := r.Export(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !fc.started || !fc.stopped || fc.n() != 1 || &fc.batches[0][0] != &req.ResourceSpans[0] {
		t.Errorf("forwarded %d batches (started %v, stopped %v)", fc.n(), fc.started, fc.stopped)
	}
	if s := r.Stats(); s.Forwarded != 1 {
		t.Errorf("stats %+v", s)
	}
}

// TestForwardingNeverBlocksTheApiserver: kproxy's endpoint hangs; exports
// return at once, batches past the queue are dropped and counted, and
// Stop gives up on the hung upload when its context ends.
func TestForwardingNeverBlocksTheApiserver(t *testing.T) {
	fc := &fakeClient{block: make(chan struct{})}
	r, err := NewReceiver(context.Background(), ReceiverOptions{Join: newOffers(), Forward: fc, ForwardQueue: 2, ForwardTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		for i := range 10 {
			_, _ = r.Export(context.Background(), &coltracepb.ExportTraceServiceRequest{ResourceSpans: batch(newTrace(uint64(40+i)).child(nil, "x", 0, 1))})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Export blocked on the forwarding")
	}
	// One upload in flight, two queued, the rest dropped.
	if s := r.Stats(); s.ForwardDropped < 7 {
		t.Errorf("stats %+v", s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := r.Stop(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	if s := r.Stats(); s.ForwardFailed == 0 {
		t.Errorf("the hung upload is not counted as failed: %+v", s)
	}
}

// TestOverTheWire: the apiserver's exporter (otlptracegrpc, as
// k8s.io/component-base/tracing builds it) sends a server span with an
// audit-id and a child; the receiver serves OTLP/gRPC and observes it.
func TestOverTheWire(t *testing.T) {
	o := newOffers()
	r := newTestReceiver(t, ReceiverOptions{Join: o})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.Serve(ln) }()
	ctx := context.Background()
	exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(ln.Addr().String()), otlptracegrpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(10*time.Millisecond)))
	defer tp.Shutdown(ctx)
	tracer := tp.Tracer("test")
	start := time.Now()
	rctx, root := tracer.Start(ctx, "GET /api/v1/namespaces/{:namespace}/pods", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(start), trace.WithAttributes(attribute.String(attrAuditID, "wire-1")))
	_, list := tracer.Start(rctx, "List", trace.WithTimestamp(start.Add(time.Millisecond)))
	list.End(trace.WithTimestamp(start.Add(3 * time.Millisecond)))
	root.End(trace.WithTimestamp(start.Add(4 * time.Millisecond)))
	select {
	case ob := <-o.got:
		if ob.AuditID != "wire-1" || ob.TraceID != root.SpanContext().TraceID().String() || ob.Server.TotalNs != int64(4*time.Millisecond) ||
			len(ob.Server.Layers) != 2 || ob.Server.Layers[1].Name != "handler List" {
			t.Errorf("observation %+v", ob)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no observation over OTLP/gRPC")
	}
}
