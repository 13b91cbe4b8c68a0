package servertrace

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/kproxy/kproxy/internal/record"
)

func selfSum(s record.Server) int64 {
	var n int64
	for _, l := range s.Layers {
		if l.SelfNs < 0 {
			panic("negative self time in " + l.Name)
		}
		n += l.SelfNs
	}
	return n
}

// layer is a layer without the float noise of the synthetic times.
type layer struct {
	Name, Stage    string
	Depth          int
	Offset, Dur, S float64 // ms, rounded to 0.1
}

func layers(s record.Server) []layer {
	r := func(ns int64) float64 { return float64((ns+50_000)/100_000) / 10 }
	var out []layer
	for _, l := range s.Layers {
		out = append(out, layer{l.Name, l.Stage, l.Depth, r(l.OffsetNs), r(l.DurationNs), r(l.SelfNs)})
	}
	return out
}

func TestLayersOfACreateWithASlowWebhook(t *testing.T) {
	tr, root := createWithSlowWebhook(1, "audit-1")
	s := analyze(root, tr.spans)
	want := []layer{
		{rootName, record.StageAuthentication, 0, 0, 400, 1.5},
		{"audit", record.LayerAudit, 1, 1, 398.5, 1.5},
		{"impersonation", record.StageImpersonation, 2, 2, 397, 1.5},
		{"APF (queue wait and dispatch)", record.StageFlowControl, 3, 3, 395.5, 1.5},
		{"authorization", record.StageAuthorization, 4, 4, 394, 5},
		{"handler Create", record.StageDecode, 5, 6, 389, 7.5},
		{"read request body", record.StageDecode, 6, 6, 1, 1},
		{"decode and convert", record.StageDecode, 6, 7.5, 0.5, 0.5},
		{"admission and validation", record.StageValidation, 6, 9, 371, 21},
		{"validating webhook policy.example.com", record.StageValidatingAdmission, 6, 20, 320, 320},
		{"etcd Create", record.StageStorage, 6, 345, 30, 30},
		{"write response", record.LayerSerialization, 6, 381, 9, 2},
		{"serialize response", record.LayerSerialization, 6, 382, 7, 1},
		{"encode", record.LayerSerialization, 7, 382, 4, 4},
		{"write to the connection", record.LayerSerialization, 7, 386, 2, 2},
	}
	if d := cmp.Diff(want, layers(s)); d != "" {
		t.Errorf("layers (-want +got):\n%s", d)
	}
	if s.TotalNs != int64(400*time.Millisecond) || selfSum(s) != s.TotalNs {
		t.Errorf("total %v, self times add up to %v", time.Duration(s.TotalNs), time.Duration(selfSum(s)))
	}
	if s.Source != record.ServerFromTrace || s.TraceID != tr.hex() {
		t.Errorf("source %q trace %q", s.Source, s.TraceID)
	}
	wantSummary := "400 ms: 320 ms in validating webhook policy.example.com (timeout 10s), 30 ms in etcd, 21 ms in admission plugins and validation"
	if s.Summary != wantSummary {
		t.Errorf("summary\n got %q\nwant %q", s.Summary, wantSummary)
	}
}

// TestWebhookInsideAnUpdate: an update's webhooks run inside the storage
// update (GuaranteedUpdate calls the update function) but their spans are
// the handler's children: the webhook's time is the webhook's, and the
// update function's rest is not etcd's.
func TestWebhookInsideAnUpdate(t *testing.T) {
	tr := newTrace(2)
	root := tr.root("a", 0, 100)
	h := tr.child(tr.chain(root), "Update", 6, 95)
	event(h, "About to store object in database", 10)
	event(h, "Write to database call succeeded", 90)
	gu := tr.child(h, "GuaranteedUpdate etcd3", 12, 88)
	event(gu, "initial value restored", 15)
	event(gu, "About to Encode", 80)
	tr.child(h, "Call mutating webhook", 20, 40, "webhook", "m.example.com")
	tr.child(h, "Call validating webhook", 50, 75, "webhook", "v.example.com")
	s := analyze(root, tr.spans)
	got := map[string]float64{}
	for _, l := range layers(s) {
		got[l.Name] = l.S
	}
	want := map[string]float64{"mutating webhook m.example.com": 20, "validating webhook v.example.com": 25,
		"etcd GuaranteedUpdate": 3 + 8, "update fn: admission, validation": 65 - 45, "admission and validation": 4}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: self %v ms, want %v (all: %v)", k, got[k], v, got)
		}
	}
	if selfSum(s) != s.TotalNs {
		t.Errorf("self times add up to %d, total %d", selfSum(s), s.TotalNs)
	}
}

// TestParallelWebhooksAndStrayChildren: validating webhooks run in
// parallel; a child that outlives its parent is clipped; events outside
// the span are clipped; nested requests (a webhook calling back into the
// apiserver under the same trace) are left out. Self times still add up
// to the total, none negative.
func TestParallelWebhooksAndStrayChildren(t *testing.T) {
	tr := newTrace(3)
	root := tr.root("a", 0, 100)
	h := tr.child(tr.chain(root), "Create", 6, 95)
	event(h, "About to store object in database", -5)
	event(h, "Write to database call succeeded", 500)
	w1 := tr.child(h, "Call validating webhook", 10, 60, "webhook", "one")
	tr.child(h, "Call validating webhook", 11, 30, "webhook", "two")
	tr.child(h, "Call validating webhook", 12, 200, "webhook", "three") // outlives everything
	call := tr.add(w1, "HTTP POST", tracepb.Span_SPAN_KIND_CLIENT, 10, 59)
	nested := tr.add(call, "GET /api/v1/pods", tracepb.Span_SPAN_KIND_SERVER, 20, 25, attrAuditID, "nested")
	tr.child(nested, "List", 21, 24)
	s := analyze(root, tr.spans)
	if selfSum(s) != s.TotalNs {
		t.Errorf("self times add up to %d, total %d", selfSum(s), s.TotalNs)
	}
	for _, l := range s.Layers {
		if l.Name == "handler List" {
			t.Errorf("the nested request's spans are in this one's layers: %+v", l)
		}
		if l.OffsetNs+l.DurationNs > s.TotalNs {
			t.Errorf("%s ends after the root: %+v", l.Name, l)
		}
	}
}

// TestSelfTimesAlwaysAddUp builds random span trees, overlapping and
// straying, and checks the invariant.
func TestSelfTimesAlwaysAddUp(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	names := []string{"audit", "authorization", "Create", "Get etcd3", "Call validating webhook", "SerializeObject", "GuaranteedUpdate etcd3", "other"}
	evs := []string{"Conversion done", "About to store object in database", "About to Encode", "initial value restored", "About to write a response"}
	for i := range 2000 {
		tr, root := randomTrace(rng, uint64(100+i), names, evs)
		s := analyze(root, tr.spans)
		if got := selfSum(s); got != s.TotalNs {
			t.Fatalf("trace %d: self times add up to %d, total %d: %+v", i, got, s.TotalNs, s.Layers)
		}
	}
}

func TestObservationLinks(t *testing.T) {
	// Continued: the root has kproxy's upstream span as its parent.
	tr := newTrace(4)
	root := tr.root("a", 0, 1)
	root.ParentSpanId = []byte{1, 2, 3, 4, 5, 6, 7, 8}
	if o := observe(root, tr.spans); o.AuditID != "a" || o.TraceID != tr.hex() || !cmp.Equal(o.Links, []string{tr.hex()}) {
		t.Errorf("continued: %+v", o)
	}
	// Linked: a new trace with a link to kproxy's span.
	tr = newTrace(5)
	root = tr.root("b", 0, 1)
	kp := newTrace(6)
	root.Links = []*tracepb.Span_Link{{TraceId: kp.id, SpanId: []byte{1, 2, 3, 4, 5, 6, 7, 8}}}
	if o := observe(root, tr.spans); o.TraceID != tr.hex() || !cmp.Equal(o.Links, []string{kp.hex()}) {
		t.Errorf("linked: %+v", o)
	}
}

func TestFormatDuration(t *testing.T) {
	for ns, want := range map[int64]string{
		1_150_000_000: "1.1 s", 40_000_000: "40 ms", 12_300_000: "12 ms", 5_250_000: "5.2 ms", 850_000: "850 µs", 999: "999 ns", 75_000_000_000: "75 s",
	} {
		if got := FormatDuration(ns); got != want {
			t.Errorf("FormatDuration(%d) = %q, want %q", ns, got, want)
		}
	}
}

func TestSummaryOfAQuickRequest(t *testing.T) {
	tr := newTrace(7)
	root := tr.root("a", 0, 2)
	tr.child(tr.chain(root), "List", 5, 5.5)
	s := analyze(root, tr.spans)
	if !strings.HasPrefix(s.Summary, "2.0 ms: ") {
		t.Errorf("summary %q", s.Summary)
	}
}

// randomTrace builds a random span tree under one root, overlapping and
// straying, with span names and events drawn from names and evs.
func randomTrace(rng *rand.Rand, id uint64, names, evs []string) (*synthTrace, *tracepb.Span) {
	tr := newTrace(id)
	root := tr.root("a", 0, float64(1+rng.IntN(1000)))
	spans := []*tracepb.Span{root}
	for range rng.IntN(30) {
		p := spans[rng.IntN(len(spans))]
		a, b := rng.Float64()*1200-100, rng.Float64()*1200-100
		s := tr.child(p, names[rng.IntN(len(names))], min(a, b), max(a, b))
		for range rng.IntN(4) {
			event(s, evs[rng.IntN(len(evs))], rng.Float64()*1200-100)
		}
		spans = append(spans, s)
	}
	return tr, root
}
