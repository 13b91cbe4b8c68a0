package telemetry

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	otellog "go.opentelemetry.io/otel/log"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	"go.opentelemetry.io/otel/sdk/resource"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/kproxy/kproxy/internal/flowview"
	"github.com/kproxy/kproxy/internal/record"
)

// Records as OpenTelemetry logs. Several kproxy replicas (or kproxy and
// the rest of a platform) send their records to one OpenTelemetry
// Collector, which fans them in beside the traces: one log record per
// capture record, its body the record's JSON (the capture line, redacted
// alike), its trace ID the record's, and the fields people filter on as
// attributes. Off unless asked for: OTEL_LOGS_EXPORTER=otlp, or
// --otlp-logs. (The OpenTelemetry default is otlp, but a trace backend
// such as Jaeger takes no logs: exporting them unasked would only fail.)

// RecordLogEventName names the log records kproxy exports.
const RecordLogEventName = "kproxy.record"

// LogsOptions select the records' export; empty fields defer to the
// environment and then to Options (the traces' endpoint and protocol).
type LogsOptions struct {
	// On exports records even without OTEL_LOGS_EXPORTER=otlp.
	On bool
}

// logsChoice is where records go, or why not.
func logsChoice(o Options, l LogsOptions, getenv func(string) string) (choice, error) {
	kind := strings.ToLower(strings.TrimSpace(getenv("OTEL_LOGS_EXPORTER")))
	switch kind {
	case "none":
		if !l.On {
			return choice{off: "OTEL_LOGS_EXPORTER=none"}, nil
		}
	case "otlp":
	case "":
		if !l.On {
			return choice{off: "records are exported as logs only with --otlp-logs or OTEL_LOGS_EXPORTER=otlp"}, nil
		}
	default:
		return choice{}, fmt.Errorf("OTEL_LOGS_EXPORTER=%q is not supported: use otlp or none", kind)
	}
	protocol := firstNonEmpty(getenv("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL"), o.Protocol, getenv("OTEL_EXPORTER_OTLP_PROTOCOL"), "http/protobuf")
	if protocol != "http/protobuf" && protocol != "http" {
		return choice{}, fmt.Errorf("records as OTLP logs: protocol %q is not supported; set OTEL_EXPORTER_OTLP_LOGS_PROTOCOL=http/protobuf (and OTEL_EXPORTER_OTLP_LOGS_ENDPOINT to the collector's OTLP/HTTP address, e.g. http://collector:4318)", protocol)
	}
	return choice{protocol: "http/protobuf", endpoint: firstNonEmpty(getenv("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"), o.Endpoint, getenv("OTEL_EXPORTER_OTLP_ENDPOINT"))}, nil
}

// DescribeLogs says where records are exported as logs, or why not.
func DescribeLogs(o Options, l LogsOptions, getenv func(string) string) string {
	if getenv == nil {
		getenv = os.Getenv
	}
	c, err := logsChoice(o, l, getenv)
	switch {
	case err != nil:
		return "not exporting: " + err.Error()
	case c.off != "":
		return "not exporting: " + c.off
	case c.endpoint == "":
		return "OTLP http/protobuf to localhost:4318 (the OTLP default)"
	}
	return "OTLP http/protobuf to " + withoutUserinfo(c.endpoint)
}

// RecordLogs is a record.Sink exporting each record as a log record.
type RecordLogs struct {
	provider *sdklog.LoggerProvider
	logger   otellog.Logger
	// Exports counts the records handed to the exporter, and what
	// became of them.
	Exports *Exports
}

// SetupRecordLogs returns the records' log exporter, or nil (no error)
// when records are not exported. Shutdown flushes it.
func SetupRecordLogs(ctx context.Context, o Options, l LogsOptions, getenv func(string) string) (*RecordLogs, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	c, err := logsChoice(o, l, getenv)
	if err != nil || c.off != "" {
		return nil, err
	}
	// Only an endpoint kproxy chose (a flag, or the generic variable it
	// reads for traces too) is passed on; the exporter reads
	// OTEL_EXPORTER_OTLP_LOGS_* itself.
	var opts []otlploghttp.Option
	if getenv("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT") == "" {
		opts = httpEndpoint(c.endpoint, "/v1/logs", o.Insecure, otlploghttp.WithEndpointURL, otlploghttp.WithEndpoint, otlploghttp.WithInsecure)
	}
	exp, err := otlploghttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("records as OTLP logs: %w", err)
	}
	name := firstNonEmpty(o.ServiceName, getenv("OTEL_SERVICE_NAME"), "kproxy")
	res := resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(name), semconv.ServiceVersion(o.Version))
	// The batch processor holds a bounded queue and drops past it: a
	// slow collector never slows forwarding or grows kproxy.
	// It holds what Exports.admit lets through (exports.go).
	size := queueSize(getenv, "OTEL_BLRP_MAX_QUEUE_SIZE")
	counts := newExports(size)
	bp := sdklog.NewBatchProcessor(countedLogExporter{Exporter: exp, e: counts}, sdklog.WithMaxQueueSize(size))
	p := sdklog.NewLoggerProvider(sdklog.WithResource(res), sdklog.WithProcessor(bp))
	return &RecordLogs{provider: p, logger: p.Logger("github.com/kproxy/kproxy"), Exports: counts}, nil
}

// Shutdown flushes the records not yet exported, within ctx.
func (r *RecordLogs) Shutdown(ctx context.Context) error { return r.provider.Shutdown(ctx) }

// Write implements record.Sink.
func (r *RecordLogs) Write(rec *record.Record) {
	// A full queue drops the record before any work is spent on it.
	if !r.Exports.admit() {
		return
	}
	body, err := json.Marshal(rec)
	if err != nil {
		r.Exports.done(1, err)
		return
	}
	var lr otellog.Record
	lr.SetEventName(RecordLogEventName)
	lr.SetTimestamp(rec.Start)
	lr.SetObservedTimestamp(time.Now())
	lr.SetSeverity(otellog.SeverityInfo)
	lr.SetSeverityText("INFO")
	agreement := "agree"
	switch _, kind := flowview.Agreement(rec); kind {
	case flowview.Unknown:
		agreement = "unknown"
	case flowview.Mismatch:
		// kproxy disagrees with the apiserver: a kproxy bug to look at.
		agreement = "disagree"
		lr.SetSeverity(otellog.SeverityWarn)
		lr.SetSeverityText("WARN")
	}
	lr.SetBody(otellog.StringValue(string(body)))
	attrs := []otellog.KeyValue{
		otellog.String("kproxy.record.id", rec.ID),
		otellog.String("http.request.method", rec.Request.Method),
		otellog.String("url.path", rec.Request.Path),
		otellog.Int("http.response.status_code", rec.Actual.Status),
		otellog.String("k8s.user", rec.Request.User),
		otellog.String("k8s.verb", rec.Request.Verb),
		otellog.String("k8s.resource", rec.Request.Resource),
		otellog.String("k8s.namespace.name", rec.Request.Namespace),
		otellog.Int("kproxy.predicted.status", rec.Predicted.Status),
		otellog.String("kproxy.predicted.stage", rec.Predicted.Stage),
		otellog.String("kproxy.prediction", agreement),
	}
	if rec.Replica != "" {
		attrs = append(attrs, otellog.String("kproxy.replica", rec.Replica))
	}
	lr.AddAttributes(attrs...)
	ctx := context.Background()
	if id, err := trace.TraceIDFromHex(rec.TraceID); err == nil {
		ctx = trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{TraceID: id, TraceFlags: trace.FlagsSampled}))
	}
	r.logger.Emit(ctx, lr)
}
