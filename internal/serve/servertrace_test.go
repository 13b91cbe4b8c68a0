package serve

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/servertrace"
)

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
