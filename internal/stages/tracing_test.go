package stages

import (
	"context"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"k8s.io/component-base/tracing"

	"github.com/kproxy/kproxy/internal/record"
)

// TestReplaySpans: the replay's spans are kproxy's only, each marked
// kproxy.replay; a span the apiserver's code starts under a stage (as its
// handlers do with component-base's tracing.Start) is not recorded; a
// stage that refuses is an error.
func TestReplaySpans(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	apiserverCode := func(ctx context.Context) Result {
		_, span := tracing.Start(ctx, "SerializeObject")
		span.AddEvent("Write to database call succeeded")
		span.End(0)
		return Pass("ok")
	}
	p := newPipeline(Config{TracerProvider: replayTracing(tp)},
		fake{name: "s0", run: apiserverCode}, fake{name: "s1", run: result(forbidden())})
	req := &Request{HTTP: httptest.NewRequest("GET", "/api/v1/pods", nil)}
	p.Run(context.Background(), req)

	mark := attribute.Bool(replayAttr, true)
	seen := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range sr.Ended() {
		seen[s.Name()] = s
		if !hasAttr(s.Attributes(), mark) {
			t.Errorf("span %q lacks %v", s.Name(), mark)
		}
		if len(s.Events()) > 0 {
			t.Errorf("span %q has the apiserver's events %v", s.Name(), s.Events())
		}
	}
	if len(seen) != 3 || seen["replay"] == nil || seen["s0"] == nil || seen["s1"] == nil {
		t.Fatalf("spans %v, want replay, s0 and s1 only", keys(seen))
	}
	if st := seen["s1"].Status(); st.Code != codes.Error || st.Description != "403 Forbidden" {
		t.Errorf("the refusing stage's status %+v, want Error 403 Forbidden", st)
	}
	if st := seen["s0"].Status(); st.Code == codes.Error {
		t.Errorf("a passing stage is an error: %+v", st)
	}
}

// TestNewMarksEverySpan: the pipeline New builds traces its stages and
// the resource handler's after-the-fact spans through the replay's
// provider.
func TestNewMarksEverySpan(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	p := New(context.Background(), Config{TracerProvider: tp})
	r := httptest.NewRequest("GET", "/api/v1/namespaces/default/configmaps/c", nil)
	info, err := ResolveRequestInfo(r)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Run(context.Background(), &Request{HTTP: r, Info: info}).Predicted.Stage; got != record.StageUnknown {
		t.Fatalf("predicted stage %q without the apiserver's flags, want unknown", got)
	}
	ended := sr.Ended()
	if len(ended) < 2 {
		t.Fatalf("spans %d, want the replay and its stages", len(ended))
	}
	for _, s := range ended {
		if !hasAttr(s.Attributes(), attribute.Bool(replayAttr, true)) {
			t.Errorf("span %q lacks %s=true", s.Name(), replayAttr)
		}
	}
}

func hasAttr(attrs []attribute.KeyValue, want attribute.KeyValue) bool {
	for _, a := range attrs {
		if a == want {
			return true
		}
	}
	return false
}

func keys[V any](m map[string]V) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	return k
}
