package telemetry

import (
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
)

// Client is the OTLP trace client behind Setup's exporter, given the same
// options and environment: also used to pass on spans kproxy receives
// from elsewhere (internal/servertrace), as raw protos. It is
// nil, with no error, when nothing is exported. The caller starts and
// stops it.
func Client(o Options, getenv func(string) string) (otlptrace.Client, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	c, err := choose(o, getenv)
	if err != nil || c.off != "" {
		return nil, err
	}
	switch c.protocol {
	case "grpc":
		var opts []otlptracegrpc.Option
		if o.Endpoint != "" {
			host, insecure := hostPort(o.Endpoint)
			opts = append(opts, otlptracegrpc.WithEndpoint(host))
			if insecure || o.Insecure {
				opts = append(opts, otlptracegrpc.WithInsecure())
			}
		}
		return otlptracegrpc.NewClient(opts...), nil
	case "http/protobuf", "http":
		opts := httpEndpoint(o.Endpoint, "/v1/traces", o.Insecure, otlptracehttp.WithEndpointURL, otlptracehttp.WithEndpoint, otlptracehttp.WithInsecure)
		return otlptracehttp.NewClient(opts...), nil
	}
	return nil, fmt.Errorf("OTLP protocol %q is not supported: use grpc or http/protobuf", c.protocol)
}

// EndpointHostPort is the host:port Setup exports to, "" when nothing is
// exported or the exporter's default applies: to tell an endpoint that
// would loop back into kproxy.
func EndpointHostPort(o Options, getenv func(string) string) string {
	if getenv == nil {
		getenv = os.Getenv
	}
	c, err := choose(o, getenv)
	if err != nil || c.off != "" || c.endpoint == "" {
		return ""
	}
	hp, _ := hostPort(c.endpoint)
	if i := strings.IndexByte(hp, '/'); i >= 0 {
		hp = hp[:i]
	}
	return hp
}

// httpEndpoint is the OTLP/HTTP exporter options (of either signal's
// exporter) for an endpoint kproxy was given: a URL gets the signal's
// path; host:port is plain HTTP when insecure or on loopback. "" leaves
// the exporter to its own OTEL_* variables and defaults.
func httpEndpoint[O any](endpoint, path string, insecure bool, withURL, withHostPort func(string) O, withInsecure func() O) []O {
	switch {
	case endpoint == "":
		return nil
	case strings.Contains(endpoint, "://"):
		return []O{withURL(strings.TrimSuffix(endpoint, "/") + path)}
	case insecure || isLoopback(endpoint):
		return []O{withHostPort(endpoint), withInsecure()}
	}
	return []O{withHostPort(endpoint)}
}
