package telemetry

import (
	"context"
	"strconv"
	"sync/atomic"

	sdklog "go.opentelemetry.io/otel/sdk/log"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// The SDK's batch processors drop what their queue cannot hold and keep
// the count to themselves (the span processor in a private field, the log
// processor in a debug line). kproxy bounds what it hands them at their
// own queue's size instead, so they never drop, and counts each span or
// record to its end: exported, failed, or dropped here. An operator
// reading kproxy's metrics then sees every lost span and record.

// Exports counts what kproxy handed to one OTLP exporter (traces, or
// records as logs), and what became of it.
type Exports struct {
	bound                     int64
	inflight                  atomic.Int64
	exported, failed, dropped atomic.Uint64
}

// ExportStats is a snapshot of Exports.
type ExportStats struct {
	// Exported the collector took; Failed it refused or did not take in
	// time (lost); Dropped kproxy dropped because the export queue was
	// full (lost).
	Exported, Failed, Dropped uint64
	// Queued is waiting for export now.
	Queued int64
}

func newExports(bound int) *Exports { return &Exports{bound: int64(bound)} }

// Stats reads the counts; nil (nothing exported) reads zeros.
func (e *Exports) Stats() ExportStats {
	if e == nil {
		return ExportStats{}
	}
	return ExportStats{Exported: e.exported.Load(), Failed: e.failed.Load(), Dropped: e.dropped.Load(), Queued: e.inflight.Load()}
}

// admit takes one place in the queue, or counts a drop.
func (e *Exports) admit() bool {
	for {
		n := e.inflight.Load()
		if n >= e.bound {
			e.dropped.Add(1)
			return false
		}
		if e.inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// done gives back n places, counted as exported or failed.
func (e *Exports) done(n int, err error) {
	e.inflight.Add(-int64(n))
	if err != nil {
		e.failed.Add(uint64(n))
	} else {
		e.exported.Add(uint64(n))
	}
}

// queueSize is an OTEL_BSP_MAX_QUEUE_SIZE or OTEL_BLRP_MAX_QUEUE_SIZE
// value, as the SDK reads it (a positive integer; otherwise the default).
func queueSize(getenv func(string) string, name string) int {
	if n, err := strconv.Atoi(getenv(name)); err == nil && n > 0 {
		return n
	}
	return 2048
}

// boundedSpans hands the batch processor only the spans its queue holds.
type boundedSpans struct {
	sdktrace.SpanProcessor
	e *Exports
}

func (p boundedSpans) OnEnd(s sdktrace.ReadOnlySpan) {
	// The batch processor exports sampled spans only.
	if !s.SpanContext().IsSampled() || !p.e.admit() {
		return
	}
	p.SpanProcessor.OnEnd(s)
}

type countedSpanExporter struct {
	sdktrace.SpanExporter
	e *Exports
}

func (x countedSpanExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := x.SpanExporter.ExportSpans(ctx, spans)
	x.e.done(len(spans), err)
	return err
}

type countedLogExporter struct {
	sdklog.Exporter
	e *Exports
}

func (x countedLogExporter) Export(ctx context.Context, records []sdklog.Record) error {
	err := x.Exporter.Export(ctx, records)
	x.e.done(len(records), err)
	return err
}
