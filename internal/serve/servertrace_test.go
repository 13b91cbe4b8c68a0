package serve

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/servertrace"
	"github.com/kproxy/kproxy/internal/telemetry"
)

func TestValidateServerTrace(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Options)
		want   string
	}{
		{"off", func(*Options) {}, ""},
		{"on", func(o *Options) { o.OTLPReceiverListen = "127.0.0.1:4317" }, ""},
		{"no port", func(o *Options) { o.OTLPReceiverListen = "127.0.0.1" }, `--otlp-receiver-listen="127.0.0.1": want host:port`},
		{"negative wait", func(o *Options) { o.ServerTraceWait = -time.Second }, "--server-trace-wait=-1s"},
		{"an hour's wait", func(o *Options) { o.ServerTraceWait = time.Hour }, "at most 1m0s"},
		{"a loop", func(o *Options) {
			o.OTLPReceiverListen, o.Telemetry = ":4317", telemetry.Options{Endpoint: "localhost:4317", Protocol: "grpc"}
		}, "kproxy would pass the apiserver's spans on to itself"},
		{"a loop by URL", func(o *Options) {
			o.OTLPReceiverListen, o.Telemetry = "127.0.0.1:4318", telemetry.Options{Endpoint: "http://127.0.0.1:4318/", Protocol: "http/protobuf"}
		}, "is also where kproxy exports its own traces"},
		{"a collector beside it", func(o *Options) {
			o.OTLPReceiverListen, o.Telemetry = "127.0.0.1:14317", telemetry.Options{Endpoint: "127.0.0.1:4317", Protocol: "grpc"}
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{Mode: "reverse", Listen: "127.0.0.1:8443"}
			tc.mutate(&o)
			err := o.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// TestNoSourceNoDelay: without a receiver the sinks are not wrapped, so
// no record waits.
func TestNoSourceNoDelay(t *testing.T) {
	s := &Server{opts: &Options{}, log: slog.New(slog.DiscardHandler)}
	got := make(chan *record.Record, 1)
	sinks := record.Sinks{sinkFunc(func(r *record.Record) { got <- r })}
	sink, err := s.joinServerTrace(context.Background(), sinks)
	if err != nil {
		t.Fatal(err)
	}
	if _, wrapped := sink.(*servertrace.Joiner); wrapped || s.Joiner != nil || len(s.shutdown) != 0 {
		t.Fatalf("sink %T, joiner %v", sink, s.Joiner)
	}
	sink.Write(&record.Record{ID: "1", Actual: record.Actual{Status: 200, AuditID: "a"}, Latency: record.Latency{UpstreamNs: 1}})
	select {
	case <-got:
	default:
		t.Fatal("the record was delayed")
	}
}

type sinkFunc func(*record.Record)

func (f sinkFunc) Write(r *record.Record) { f(r) }

// TestReceiverJoinsRecords: with --otlp-receiver-listen the joiner sits
// before the sinks and the receiver listens; a span exported over
// OTLP/gRPC joins the record with its audit ID.
func TestReceiverJoinsRecords(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	s := &Server{opts: &Options{OTLPReceiverListen: "127.0.0.1:0", ServerTraceWait: 10 * time.Second}, log: slog.New(slog.DiscardHandler)}
	got := make(chan *record.Record, 1)
	sink, err := s.joinServerTrace(context.Background(), record.Sinks{sinkFunc(func(r *record.Record) { got <- r })})
	if err != nil {
		t.Fatal(err)
	}
	defer s.close(context.Background())
	if _, ok := sink.(*servertrace.Joiner); !ok || s.OTLPReceiverAddr == "" {
		t.Fatalf("sink %T, receiver %q", sink, s.OTLPReceiverAddr)
	}
	go s.otlp.serve(s.log)
	sink.Write(&record.Record{ID: "1", Actual: record.Actual{Status: 200, AuditID: "audit-7"}, Latency: record.Latency{UpstreamNs: 1}})

	ctx := context.Background()
	exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(s.OTLPReceiverAddr), otlptracegrpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(10*time.Millisecond)))
	defer tp.Shutdown(ctx)
	_, span := tp.Tracer("apiserver").Start(ctx, "GET", trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attribute.String("audit-id", "audit-7")))
	span.End()
	select {
	case r := <-got:
		if r.Server == nil || r.Server.TraceID != span.SpanContext().TraceID().String() || r.Latency.ServerNs != r.Server.TotalNs {
			t.Fatalf("record %+v server %+v", r, r.Server)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the record was not joined")
	}
}
