// Package telemetry sets up OpenTelemetry tracing the way operators expect:
// the standard OTEL_* environment variables first, kproxy's flags over them,
// and nothing exported (and nothing failing) when no exporter is configured.
package telemetry

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"
)

// Options override the environment. Empty fields defer to OTEL_* variables.
type Options struct {
	// Endpoint is the OTLP endpoint: host:port for gRPC, or a URL
	// (http://host:4318) for HTTP. Overrides OTEL_EXPORTER_OTLP_ENDPOINT.
	Endpoint string
	// Protocol is "grpc" or "http/protobuf". Overrides
	// OTEL_EXPORTER_OTLP_PROTOCOL.
	Protocol string
	// Insecure disables TLS to the collector (default for http:// URLs and
	// loopback addresses).
	Insecure bool
	// ServiceName overrides OTEL_SERVICE_NAME (default "kproxy").
	ServiceName string
	// Version is reported as service.version.
	Version string
}

// Tracing is what Setup made.
type Tracing struct {
	Provider *sdktrace.TracerProvider
	// Shutdown flushes the spans not yet exported, within its context.
	Shutdown func(context.Context) error
	// Spans counts the spans handed to the exporter and what became of
	// them; nil when nothing is exported.
	Spans *Exports
}

// Setup returns a tracer provider and a shutdown func that flushes it.
// Exporting is on when an endpoint is given (flag or OTEL_EXPORTER_OTLP_*)
// or OTEL_TRACES_EXPORTER=otlp; OTEL_TRACES_EXPORTER=none turns it off.
// Spans are made either way so every record carries a trace ID.
func Setup(ctx context.Context, o Options, getenv func(string) string) (*Tracing, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	name := firstNonEmpty(o.ServiceName, getenv("OTEL_SERVICE_NAME"), "kproxy")
	res, err := resource.Merge(resource.Default(), resource.NewWithAttributes(semconv.SchemaURL,
		semconv.ServiceName(name), semconv.ServiceVersion(o.Version)))
	if err != nil {
		// Schema URL conflicts between the SDK default and ours are harmless;
		// fall back to ours alone.
		res = resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(name), semconv.ServiceVersion(o.Version))
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}

	exp, err := exporter(ctx, o, getenv)
	if err != nil {
		return nil, err
	}
	var spans *Exports
	if exp != nil {
		// The batch processor's queue holds what spans.admit lets
		// through, so it never drops one uncounted (exports.go).
		size := queueSize(getenv, "OTEL_BSP_MAX_QUEUE_SIZE")
		spans = newExports(size)
		bsp := sdktrace.NewBatchSpanProcessor(countedSpanExporter{SpanExporter: exp, e: spans}, sdktrace.WithMaxQueueSize(size))
		opts = append(opts, sdktrace.WithSpanProcessor(boundedSpans{SpanProcessor: bsp, e: spans}))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	return &Tracing{Provider: tp, Shutdown: tp.Shutdown, Spans: spans}, nil
}

// Propagator is W3C trace context plus baggage, as the apiserver uses.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// OwnScope begins the instrumentation scope (the tracer name) of every
// tracer kproxy makes: its Go package path.
const OwnScope = "github.com/kproxy/kproxy/"

// OwnSpansOnly wraps tp for code under which kproxy runs the apiserver's
// own code in-process (the replay). That code starts spans from whatever
// span its context carries (component-base's tracing.Start asks
// trace.SpanFromContext(ctx).TracerProvider()), so under kproxy's spans a
// dry run would show "Create etcd3", "SerializeObject" or "Write to
// database call succeeded" in kproxy's trace as if they had happened for
// real. The provider returned records the spans of tracers named under
// OwnScope only, each with mark, and those spans name the filter as their
// TracerProvider, so the apiserver's code that takes the provider from
// one of them is filtered too. A tracer of any other scope records
// nothing but keeps its parent's span context: kproxy's spans further
// down still join the trace, and traceparent still reaches webhooks.
func OwnSpansOnly(tp trace.TracerProvider, mark ...attribute.KeyValue) trace.TracerProvider {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return &ownSpans{inner: tp, mark: mark}
}

type ownSpans struct {
	embedded.TracerProvider
	inner trace.TracerProvider
	mark  []attribute.KeyValue
}

func (p *ownSpans) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	if !strings.HasPrefix(name, OwnScope) {
		return noop.NewTracerProvider().Tracer(name)
	}
	return ownTracer{inner: p.inner.Tracer(name, opts...), p: p}
}

type ownTracer struct {
	embedded.Tracer
	inner trace.Tracer
	p     *ownSpans
}

func (t ownTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if len(t.p.mark) > 0 {
		// A copy: the caller's slice is not ours to append to.
		opts = append(opts[:len(opts):len(opts)], trace.WithAttributes(t.p.mark...))
	}
	ctx, s := t.inner.Start(ctx, name, opts...)
	s = ownSpan{Span: s, p: t.p}
	return trace.ContextWithSpan(ctx, s), s
}

// ownSpan is a kproxy span that hands out the filter as its provider.
type ownSpan struct {
	trace.Span
	p *ownSpans
}

func (s ownSpan) TracerProvider() trace.TracerProvider { return s.p }

// Describe says where Setup, given the same options and environment,
// sends spans: "OTLP http/protobuf to http://127.0.0.1:4318", or why it
// exports nothing. kproxy logs it at start, so that an operator looking
// for traces knows where they went (or that they went nowhere).
func Describe(o Options, getenv func(string) string) string {
	if getenv == nil {
		getenv = os.Getenv
	}
	c, err := choose(o, getenv)
	switch {
	case err != nil:
		return "not exporting: " + err.Error()
	case c.off != "":
		return "not exporting: " + c.off
	}
	endpoint := c.endpoint
	if endpoint == "" {
		// OTEL_TRACES_EXPORTER=otlp alone: the exporter's own default.
		endpoint = "localhost:4318 (the OTLP default)"
		if c.protocol == "grpc" {
			endpoint = "localhost:4317 (the OTLP default)"
		}
	}
	return "OTLP " + c.protocol + " to " + withoutUserinfo(endpoint)
}

// choice is the exporter the options and the environment select.
type choice struct {
	off      string // why nothing is exported; "" when something is
	protocol string
	endpoint string // "" leaves the exporter's default
}

func choose(o Options, getenv func(string) string) (choice, error) {
	kind := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")))
	endpoint := firstNonEmpty(o.Endpoint, getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), getenv("OTEL_EXPORTER_OTLP_ENDPOINT"))
	switch kind {
	case "none":
		if o.Endpoint == "" {
			return choice{off: "OTEL_TRACES_EXPORTER=none"}, nil
		}
	case "", "otlp":
	default:
		return choice{}, fmt.Errorf("OTEL_TRACES_EXPORTER=%q is not supported: use otlp or none", kind)
	}
	if endpoint == "" && kind != "otlp" {
		return choice{off: "no OTEL_EXPORTER_OTLP_ENDPOINT / --otlp-endpoint"}, nil
	}
	protocol := firstNonEmpty(o.Protocol, getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), getenv("OTEL_EXPORTER_OTLP_PROTOCOL"), "http/protobuf")
	switch protocol {
	case "grpc", "http/protobuf", "http":
	default:
		return choice{}, fmt.Errorf("OTLP protocol %q is not supported: use grpc or http/protobuf", protocol)
	}
	return choice{protocol: protocol, endpoint: endpoint}, nil
}

// withoutUserinfo drops credentials from an endpoint URL before it is
// logged.
func withoutUserinfo(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || u.User == nil {
		return endpoint
	}
	u.User = nil
	return u.String()
}

func exporter(ctx context.Context, o Options, getenv func(string) string) (sdktrace.SpanExporter, error) {
	c, err := Client(o, getenv)
	if err != nil || c == nil {
		return nil, err
	}
	return otlptrace.New(ctx, c)
}

// hostPort strips a scheme; http:// (or a loopback host) means no TLS.
func hostPort(endpoint string) (string, bool) {
	switch {
	case strings.HasPrefix(endpoint, "http://"):
		return strings.TrimPrefix(endpoint, "http://"), true
	case strings.HasPrefix(endpoint, "https://"):
		return strings.TrimPrefix(endpoint, "https://"), false
	}
	return endpoint, isLoopback(endpoint)
}

func isLoopback(hostport string) bool {
	return strings.HasPrefix(hostport, "127.") || strings.HasPrefix(hostport, "localhost") || strings.HasPrefix(hostport, "[::1]")
}

func firstNonEmpty(v ...string) string {
	for _, s := range v {
		if s != "" {
			return s
		}
	}
	return ""
}
