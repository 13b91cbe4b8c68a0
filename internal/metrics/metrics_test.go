package metrics

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kproxy/kproxy/internal/record"
)

func rec(verb string, predicted, actual int, stage string) *record.Record {
	return &record.Record{
		Request:   record.Request{Verb: verb},
		Predicted: record.Prediction{Status: predicted, Stage: stage},
		Actual:    record.Actual{Status: actual},
	}
}

type lossy struct {
	written int
	lost    uint64
}

func (l *lossy) Write(*record.Record)             { l.written++ }
func (l *lossy) Lost() uint64                     { return l.lost }
func (l *lossy) Rotations() (done, failed uint64) { return 3, 1 }

type buffer struct{}

func (buffer) Len() int        { return 3 }
func (buffer) Capacity() int   { return 10 }
func (buffer) Evicted() uint64 { return 7 }

// TestMetrics checks what each measurement moves, that labels stay
// bounded, and that every name passes Prometheus's own linter.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.Record(rec("create", 201, 201, ""))
	m.Record(rec("get", 404, 200, record.StageStorage))
	m.Record(rec("list", 0, 200, record.StageUnknown))
	m.Record(rec("BREW", 200, 418, "")) // a verb a client made up
	m.Record(rec("watch", 200, 0, ""))  // no status: the client went away
	m.ReplayRan(3*time.Millisecond, []record.StageResult{
		{Name: record.StageAuthentication, Outcome: record.Pass, DurationNs: 1000},
		{Name: record.StageAuthorization, Outcome: record.Reject, DurationNs: 2000},
		{Name: record.StageStorage, Outcome: record.Skip},
	})
	m.ReplayShed()
	m.ReplayFiltered()
	m.ReplayPool(2, 32)
	m.ReplayQueued(1)
	m.ReplayStarted(time.Millisecond)
	f := &lossy{lost: 2}
	sink := m.CaptureSink(f)
	sink.Write(&record.Record{})
	m.FlowBuffer(buffer{})
	m.ServerTrace(nil, nil)

	for _, tc := range []struct {
		c    prometheus.Collector
		want float64
	}{
		{m.requests.WithLabelValues("create", "2xx"), 1},
		{m.requests.WithLabelValues("get", "2xx"), 1},
		{m.requests.WithLabelValues("other", "4xx"), 1},
		{m.requests.WithLabelValues("watch", "none"), 1},
		{m.predictions.WithLabelValues(Agree), 1},
		{m.predictions.WithLabelValues(Disagree), 2},
		{m.predictions.WithLabelValues(Unknown), 2},
		{m.records, 5},
		{m.replays.WithLabelValues(ReplayRun), 1},
		{m.replays.WithLabelValues(ReplayShed), 1},
		{m.replays.WithLabelValues(ReplayFiltered), 1},
		{m.workers, 2},
		{m.queueCapacity, 32},
		{m.queueDepth, 1},
		{m.workersBusy, 1},
	} {
		if got := testutil.ToFloat64(tc.c); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.c.(prometheus.Metric).Desc(), got, tc.want)
		}
	}
	if n := testutil.CollectAndCount(m.stageDuration); n != 2 {
		t.Errorf("%d stage series, want 2 (a skipped stage is not observed)", n)
	}
	if f.written != 1 {
		t.Errorf("the capture sink wrote %d records, want 1", f.written)
	}
	want := `
# HELP kproxy_capture_records_dropped_total Records the capture file could not take: a write failed (a full disk), and the record was dropped; so also the count of failed writes.
# TYPE kproxy_capture_records_dropped_total counter
kproxy_capture_records_dropped_total 2
# HELP kproxy_capture_records_total Records handed to the capture file (--capture); kproxy_capture_records_dropped_total of them were not written.
# TYPE kproxy_capture_records_total counter
kproxy_capture_records_total 1
# HELP kproxy_capture_rotation_failures_total Rotations of the capture file that failed: records went on to the file past --capture-maxsize; tried again 10s later.
# TYPE kproxy_capture_rotation_failures_total counter
kproxy_capture_rotation_failures_total 1
# HELP kproxy_capture_rotations_total Times the capture file was rotated (--capture-maxsize).
# TYPE kproxy_capture_rotations_total counter
kproxy_capture_rotations_total 3
# HELP kproxy_flow_api_buffer_evicted_total Records the flow API's buffer evicted to make room for newer ones.
# TYPE kproxy_flow_api_buffer_evicted_total counter
kproxy_flow_api_buffer_evicted_total 7
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"kproxy_capture_records_dropped_total", "kproxy_capture_records_total", "kproxy_capture_rotations_total",
		"kproxy_capture_rotation_failures_total", "kproxy_flow_api_buffer_evicted_total"); err != nil {
		t.Error(err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// TestNilMetrics: a proxy built without metrics records nothing, and
// does not fail.
func TestNilMetrics(t *testing.T) {
	var m *Metrics
	m.Record(rec("get", 200, 200, ""))
	m.ReplayRan(time.Second, nil)
	m.ReplayShed()
	m.ReplayFiltered()
	m.ReplayPool(1, 1)
	m.ReplayQueued(1)
	m.ReplayStarted(0)
	m.ReplayFinished()
	m.FlowBuffer(buffer{})
	m.ServerTrace(nil, nil)
	f := &lossy{}
	if s := m.CaptureSink(f); s != record.Sink(f) {
		t.Error("a nil Metrics must hand back the capture sink itself")
	}
	if m.Registry() != nil {
		t.Error("a nil Metrics has no registry")
	}
}

// TestListen scrapes /metrics over HTTP, in Prometheus's text format.
func TestListen(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.Record(rec("get", 200, 200, ""))
	notReady := errors.New("the replay's cluster state has not synced")
	s, err := Listen("127.0.0.1:0", reg, nil, func() error { return notReady })
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	defer func() {
		if err := s.Close(context.Background()); err != nil {
			t.Error(err)
		}
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	// Health checks for a load balancer: /livez always, /readyz once ready.
	for _, tc := range []struct {
		path   string
		ready  error
		status int
		body   string
	}{
		{"/livez", notReady, 200, "ok"},
		{"/readyz", notReady, 503, "not ready: the replay's cluster state has not synced"},
		{"/readyz", nil, 200, "ok"},
	} {
		notReady = tc.ready
		resp, err := http.Get("http://" + s.Addr() + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.body) {
			t.Errorf("%s: %d %q, want %d %q", tc.path, resp.StatusCode, b, tc.status, tc.body)
		}
	}
	resp, err := http.Get("http://" + s.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"kproxy_requests_total", "kproxy_replays_total", "kproxy_predictions_total", "go_goroutines", "process_resident_memory_bytes"} {
		if fams[name] == nil {
			t.Errorf("no %s in the scrape", name)
		}
	}
	if got := fams["kproxy_records_total"].GetMetric()[0].GetCounter().GetValue(); got != 1 {
		t.Errorf("kproxy_records_total %v, want 1", got)
	}
}
