package telemetry

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

func env(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func TestExporterSelection(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		opts    Options
		env     map[string]string
		want    bool // an exporter is configured
		wantErr string
	}{
		{name: "nothing configured exports nothing", want: false},
		{name: "endpoint variable", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, want: true},
		{name: "traces endpoint variable, grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, want: true},
		{name: "none wins over the endpoint variable", env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, want: false},
		{name: "flag", opts: Options{Endpoint: "127.0.0.1:4317", Protocol: "grpc"}, want: true},
		{name: "unknown exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, wantErr: `OTEL_TRACES_EXPORTER="zipkin"`},
		{name: "unknown protocol", opts: Options{Endpoint: "x:1", Protocol: "carrier-pigeon"}, wantErr: `"carrier-pigeon"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			exp, err := exporter(ctx, tc.opts, env(tc.env))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (exp != nil) != tc.want {
				t.Fatalf("exporter %v, want configured=%v", exp, tc.want)
			}
			if exp != nil {
				_ = exp.Shutdown(ctx)
			}
		})
	}
}

// startSpan sets up a provider with no exporter (ended with the test)
// and starts a span on it.
func startSpan(t *testing.T) (trace.TracerProvider, trace.Span) {
	t.Helper()
	tracing, err := Setup(context.Background(), Options{}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tracing.Shutdown(context.Background()) })
	if tracing.Spans != nil {
		t.Errorf("export counts %v with nothing exported", tracing.Spans)
	}
	_, span := tracing.Provider.Tracer("t").Start(context.Background(), "x")
	t.Cleanup(func() { span.End() })
	return tracing.Provider, span
}

func TestSetupWithoutExporterStillMakesTraceIDs(t *testing.T) {
	_, span := startSpan(t)
	if !span.SpanContext().TraceID().IsValid() {
		t.Fatal("no trace ID without an exporter: records need one")
	}
}

// TestSamplerFromEnvironment: OTEL_TRACES_SAMPLER (read by the SDK) is
// honoured: a request outside the ratio records no span, so kproxy does
// no span work for it, and still gets a trace ID for its record; a
// sampled incoming traceparent is followed (parentbased_).
func TestSamplerFromEnvironment(t *testing.T) {
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", "0")
	tp, span := startSpan(t)
	if span.IsRecording() || span.SpanContext().IsSampled() {
		t.Error("a span outside the ratio 0 is recorded")
	}
	if !span.SpanContext().TraceID().IsValid() {
		t.Error("no trace ID for an unsampled request: its record needs one")
	}
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled, Remote: true})
	_, child := tp.Tracer("t").Start(trace.ContextWithRemoteSpanContext(context.Background(), parent), "y")
	defer child.End()
	if !child.IsRecording() {
		t.Error("a request whose caller sampled its trace is not recorded")
	}
}
