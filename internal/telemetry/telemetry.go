// Package telemetry sets up OpenTelemetry tracing the way operators expect:
// the standard OTEL_* environment variables first, kproxy's flags over them,
// and nothing exported (and nothing failing) when no exporter is configured.
package telemetry

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
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

// Setup returns a tracer provider and a shutdown func that flushes it.
// Exporting is on when an endpoint is given (flag or OTEL_EXPORTER_OTLP_*)
// or OTEL_TRACES_EXPORTER=otlp; OTEL_TRACES_EXPORTER=none turns it off.
// Spans are made either way so every record carries a trace ID.
func Setup(ctx context.Context, o Options, getenv func(string) string) (*sdktrace.TracerProvider, func(context.Context) error, error) {
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
		return nil, nil, err
	}
	if exp != nil {
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	return tp, tp.Shutdown, nil
}

// Propagator is W3C trace context plus baggage, as the apiserver uses.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

func exporter(ctx context.Context, o Options, getenv func(string) string) (sdktrace.SpanExporter, error) {
	kind := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")))
	endpoint := firstNonEmpty(o.Endpoint, getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), getenv("OTEL_EXPORTER_OTLP_ENDPOINT"))
	switch kind {
	case "none":
		if o.Endpoint == "" {
			return nil, nil
		}
	case "", "otlp":
	default:
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q is not supported: use otlp or none", kind)
	}
	if endpoint == "" && kind != "otlp" {
		return nil, nil
	}
	protocol := firstNonEmpty(o.Protocol, getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), getenv("OTEL_EXPORTER_OTLP_PROTOCOL"), "http/protobuf")
	switch protocol {
	case "grpc":
		var opts []otlptracegrpc.Option
		if o.Endpoint != "" {
			host, insecure := hostPort(o.Endpoint)
			opts = append(opts, otlptracegrpc.WithEndpoint(host))
			if insecure || o.Insecure {
				opts = append(opts, otlptracegrpc.WithInsecure())
			}
		}
		return otlptracegrpc.New(ctx, opts...)
	case "http/protobuf", "http":
		var opts []otlptracehttp.Option
		if o.Endpoint != "" {
			if strings.Contains(o.Endpoint, "://") {
				opts = append(opts, otlptracehttp.WithEndpointURL(strings.TrimSuffix(o.Endpoint, "/")+"/v1/traces"))
			} else {
				opts = append(opts, otlptracehttp.WithEndpoint(o.Endpoint))
				if o.Insecure || isLoopback(o.Endpoint) {
					opts = append(opts, otlptracehttp.WithInsecure())
				}
			}
		}
		return otlptracehttp.New(ctx, opts...)
	default:
		return nil, fmt.Errorf("OTLP protocol %q is not supported: use grpc or http/protobuf", protocol)
	}
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
