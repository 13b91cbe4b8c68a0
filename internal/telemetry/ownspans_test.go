package telemetry

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/component-base/tracing"
)

// TestOwnSpansOnly runs the apiserver's own span helper under a kproxy
// span, as the replay does: its span is not recorded, and a kproxy span
// started below it still joins the trace under the kproxy span.
func TestOwnSpansOnly(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	sdk := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	mark := attribute.Bool("kproxy.replay", true)
	tp := OwnSpansOnly(sdk, mark)
	own := tp.Tracer(OwnScope + "internal/stages")

	ctx, parent := own.Start(context.Background(), "authorization")
	// The apiserver's code: component-base's tracing.Start takes the
	// provider from the span in ctx.
	uctx, upstream := tracing.Start(ctx, "SerializeObject")
	upstream.AddEvent("Write to database call succeeded")
	_, child := own.Start(uctx, "authorizer rbac")
	child.End()
	upstream.End(0)
	// A tracer of another scope asked for by name is dropped too.
	_, other := tp.Tracer("k8s.io/apiserver/pkg/endpoints").Start(ctx, "KubernetesAPI")
	other.End()
	parent.End()

	ended := sr.Ended()
	var names []string
	for _, s := range ended {
		names = append(names, s.Name())
		if !hasAttr(s.Attributes(), mark) {
			t.Errorf("span %q lacks %v", s.Name(), mark)
		}
		for _, e := range s.Events() {
			t.Errorf("span %q has the apiserver's event %q", s.Name(), e.Name)
		}
	}
	if strings.Join(names, ",") != "authorizer rbac,authorization" {
		t.Fatalf("recorded %v, want only kproxy's spans", names)
	}
	if got, want := ended[0].Parent().SpanID(), parent.SpanContext().SpanID(); got != want {
		t.Errorf("kproxy's span under the apiserver's has parent %s, want kproxy's %s", got, want)
	}
	if ended[0].SpanContext().TraceID() != parent.SpanContext().TraceID() {
		t.Error("kproxy's span under the apiserver's left the trace")
	}
	if trace.SpanFromContext(uctx).SpanContext().SpanID() != parent.SpanContext().SpanID() {
		t.Error("the apiserver's dropped span does not carry kproxy's span context (traceparent to webhooks)")
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

func TestDescribe(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		env  map[string]string
		want string
	}{
		{name: "nothing configured", want: "not exporting: no OTEL_EXPORTER_OTLP_ENDPOINT / --otlp-endpoint"},
		{name: "none", env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
			want: "not exporting: OTEL_TRACES_EXPORTER=none"},
		{name: "endpoint variable", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
			want: "OTLP http/protobuf to http://127.0.0.1:4318"},
		{name: "flag over the variable", opts: Options{Endpoint: "127.0.0.1:4317", Protocol: "grpc"},
			env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, want: "OTLP grpc to 127.0.0.1:4317"},
		{name: "otlp alone uses the default", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
			want: "OTLP grpc to localhost:4317 (the OTLP default)"},
		{name: "credentials are not logged", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://user:secret@collector:4318"},
			want: "OTLP http/protobuf to https://collector:4318"},
		{name: "unknown protocol", opts: Options{Endpoint: "x:1", Protocol: "carrier-pigeon"},
			want: `not exporting: OTLP protocol "carrier-pigeon" is not supported: use grpc or http/protobuf`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Describe(tc.opts, env(tc.env)); got != tc.want {
				t.Errorf("Describe = %q, want %q", got, tc.want)
			}
		})
	}
}
