package telemetry

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/record"
)

// collector is an OTLP/HTTP endpoint answering every export with code.
func collector(t *testing.T, code *atomic.Int32) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(int(code.Load()))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestSpansCounted: every span handed to the exporter is counted to its
// end: dropped at once when the queue (OTEL_BSP_MAX_QUEUE_SIZE) is full,
// exported when the collector takes it, failed when it refuses it.
func TestSpansCounted(t *testing.T) {
	var code atomic.Int32
	code.Store(http.StatusOK)
	url := collector(t, &code)
	getenv := env(map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "4"})
	tracing, err := Setup(context.Background(), Options{Endpoint: url}, getenv)
	if err != nil {
		t.Fatal(err)
	}
	defer tracing.Shutdown(context.Background())
	end := func(n int) {
		for range n {
			_, s := tracing.Provider.Tracer("t").Start(context.Background(), "x")
			s.End()
		}
	}
	// The batch processor exports every 5 s: 20 spans ended at once
	// find 4 places.
	end(20)
	if got, want := tracing.Spans.Stats(), (ExportStats{Dropped: 16, Queued: 4}); got != want {
		t.Errorf("20 spans on a queue of 4: %+v, want %+v", got, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tracing.Provider.ForceFlush(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := tracing.Spans.Stats(), (ExportStats{Exported: 4, Dropped: 16}); got != want {
		t.Errorf("flushed to a collector that takes them: %+v, want %+v", got, want)
	}
	// 400 is not retried: the batch is lost, and counted as failed.
	code.Store(http.StatusBadRequest)
	end(3)
	_ = tracing.Provider.ForceFlush(ctx)
	if got, want := tracing.Spans.Stats(), (ExportStats{Exported: 4, Failed: 3, Dropped: 16}); got != want {
		t.Errorf("flushed to a collector that refuses them: %+v, want %+v", got, want)
	}
}

// TestRecordLogsCounted: the same for records exported as logs
// (OTEL_BLRP_MAX_QUEUE_SIZE).
func TestRecordLogsCounted(t *testing.T) {
	var code atomic.Int32
	code.Store(http.StatusOK)
	url := collector(t, &code)
	getenv := env(map[string]string{"OTEL_BLRP_MAX_QUEUE_SIZE": "2"})
	logs, err := SetupRecordLogs(context.Background(), Options{Endpoint: url}, LogsOptions{On: true}, getenv)
	if err != nil || logs == nil {
		t.Fatalf("SetupRecordLogs: %v, %v", logs, err)
	}
	for i := range 5 {
		logs.Write(&record.Record{ID: string(rune('a' + i))})
	}
	if got, want := logs.Exports.Stats(), (ExportStats{Dropped: 3, Queued: 2}); got != want {
		t.Errorf("5 records on a queue of 2: %+v, want %+v", got, want)
	}
	if err := logs.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, want := logs.Exports.Stats(), (ExportStats{Exported: 2, Dropped: 3}); got != want {
		t.Errorf("flushed: %+v, want %+v", got, want)
	}
}
