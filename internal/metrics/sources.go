package metrics

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/servertrace"
	"github.com/kproxy/kproxy/internal/telemetry"
)

// The parts of kproxy that keep their own counts are read at each scrape
// (CounterFunc, GaugeFunc, a collector over their Stats): no second count
// to keep in step, nothing added to their hot paths.

// lossyFile is what the capture file sink tells (record.FileSink).
type lossyFile interface {
	record.Sink
	// Lost is how many records the file could not take: each failed
	// write (a full disk) drops its record.
	Lost() uint64
	// Rotations is how many times the file was rotated, and how many
	// rotations failed.
	Rotations() (done, failed uint64)
}

// CaptureSink counts the records handed to the capture file, and exposes
// how many it dropped; it returns the sink to write to in its place.
func (m *Metrics) CaptureSink(f lossyFile) record.Sink {
	if m == nil {
		return f
	}
	c := &countingSink{next: f}
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "kproxy_capture_records_total",
			Help: "Records handed to the capture file (--capture); kproxy_capture_records_dropped_total of them were not written.",
		}, func() float64 { return float64(c.n.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "kproxy_capture_records_dropped_total",
			Help: "Records the capture file could not take: a write failed (a full disk), and the record was dropped; so also the count of failed writes.",
		}, func() float64 { return float64(f.Lost()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "kproxy_capture_rotations_total",
			Help: "Times the capture file was rotated (--capture-maxsize).",
		}, func() float64 { done, _ := f.Rotations(); return float64(done) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "kproxy_capture_rotation_failures_total",
			Help: "Rotations of the capture file that failed: records went on to the file past --capture-maxsize; tried again 10s later.",
		}, func() float64 { _, failed := f.Rotations(); return float64(failed) }))
	return c
}

type countingSink struct {
	next record.Sink
	n    atomic.Uint64
}

func (c *countingSink) Write(r *record.Record) {
	c.next.Write(r)
	c.n.Add(1)
}

// flowBuffer is what the flow API's buffer tells (flowapi.Buffer).
type flowBuffer interface {
	Len() int
	Capacity() int
	Evicted() uint64
}

// FlowBuffer exposes the flow API's buffer: how many records it holds and
// has evicted (the oldest go when it is full, by design).
func (m *Metrics) FlowBuffer(b flowBuffer) {
	if m == nil || b == nil {
		return
	}
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kproxy_flow_api_buffer_records",
			Help: "Records the flow API holds now (at most kproxy_flow_api_buffer_capacity, --api-buffer).",
		}, func() float64 { return float64(b.Len()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kproxy_flow_api_buffer_capacity",
			Help: "How many records the flow API keeps (--api-buffer).",
		}, func() float64 { return float64(b.Capacity()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "kproxy_flow_api_buffer_evicted_total",
			Help: "Records the flow API's buffer evicted to make room for newer ones.",
		}, func() float64 { return float64(b.Evicted()) }))
}

// ServerTrace exposes the receiver of the apiserver's own spans and the
// joiner that adds them (or its audit annotations) to the records; either
// may be nil (not configured).
func (m *Metrics) ServerTrace(r *servertrace.Receiver, j *servertrace.Joiner) {
	if m == nil || (r == nil && j == nil) {
		return
	}
	m.reg.MustRegister(&serverTraceCollector{r: r, j: j})
}

var (
	serverSpansDesc = prometheus.NewDesc("kproxy_server_spans_received_total",
		"The apiserver's own spans kproxy received (--otlp-receiver-listen).", nil, nil)
	serverSpansDroppedDesc = prometheus.NewDesc("kproxy_server_spans_dropped_total",
		"The apiserver's spans kproxy dropped before joining them to a record, by reason: evicted (their request's root span never came in time, or too many were pending), invalid (no valid trace or span ID).",
		[]string{"reason"}, nil)
	serverSpanBatchesDesc = prometheus.NewDesc("kproxy_server_span_batches_total",
		"Batches of the apiserver's spans passed on to kproxy's own OTLP endpoint, by result: forwarded, dropped (the forwarding queue was full), failed (the endpoint refused them or did not take them in time).",
		[]string{"result"}, nil)
	serverJoinsDesc = prometheus.NewDesc("kproxy_server_joins_total",
		"Records by how they met the apiserver's own account of their request (spans or audit annotations): matched, timed_out (written without it after --server-trace-wait), overflowed (written at once: too many were waiting), passed_through (nothing to wait for).",
		[]string{"result"}, nil)
	serverHeldDesc = prometheus.NewDesc("kproxy_server_join_records_held",
		"Records waiting now for the apiserver's own account of their request.", nil, nil)
)

// serverTraceCollector reads the receiver's and the joiner's counts at
// each scrape.
type serverTraceCollector struct {
	r *servertrace.Receiver
	j *servertrace.Joiner
}

func (c *serverTraceCollector) Describe(ch chan<- *prometheus.Desc) {
	if c.r != nil {
		ch <- serverSpansDesc
		ch <- serverSpansDroppedDesc
		ch <- serverSpanBatchesDesc
	}
	if c.j != nil {
		ch <- serverJoinsDesc
		ch <- serverHeldDesc
	}
}

func (c *serverTraceCollector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v uint64, label string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), label)
	}
	if c.r != nil {
		s := c.r.Stats()
		ch <- prometheus.MustNewConstMetric(serverSpansDesc, prometheus.CounterValue, float64(s.Spans))
		counter(serverSpansDroppedDesc, s.Evicted, "evicted")
		counter(serverSpansDroppedDesc, s.Invalid, "invalid")
		counter(serverSpanBatchesDesc, s.Forwarded, "forwarded")
		counter(serverSpanBatchesDesc, s.ForwardDropped, "dropped")
		counter(serverSpanBatchesDesc, s.ForwardFailed, "failed")
	}
	if c.j != nil {
		s := c.j.Stats()
		counter(serverJoinsDesc, s.Matched, "matched")
		counter(serverJoinsDesc, s.TimedOut, "timed_out")
		counter(serverJoinsDesc, s.Overflowed, "overflowed")
		counter(serverJoinsDesc, s.PassedThrough, "passed_through")
		ch <- prometheus.MustNewConstMetric(serverHeldDesc, prometheus.GaugeValue, float64(s.Held))
	}
}

// ReplayBodies exposes the request body bytes held for replays now and
// their bound (--replay-body-budget-mib; 0: none).
func (m *Metrics) ReplayBodies(held func() int64, budget int64) {
	if m == nil || held == nil {
		return
	}
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kproxy_replay_body_bytes",
			Help: "Request body bytes held for replays now (being received, queued or replayed).",
		}, func() float64 { return float64(held()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kproxy_replay_body_budget_bytes",
			Help: "Bound on kproxy_replay_body_bytes (--replay-body-budget-mib); past it, a write's replay is shed.",
		}, func() float64 { return float64(budget) }))
}

// Exports exposes what became of the spans (signal "traces") or the
// records exported as logs (signal "logs") kproxy handed to its OTLP
// exporter; e nil (that signal is not exported) registers nothing.
func (m *Metrics) Exports(signal string, e *telemetry.Exports) {
	if m == nil || e == nil {
		return
	}
	m.reg.MustRegister(&exportsCollector{signal: signal, e: e})
}

var (
	otlpItemsDesc = prometheus.NewDesc("kproxy_otlp_items_total",
		"Spans (signal traces) and records exported as OTLP logs (signal logs) kproxy handed to its OTLP exporter, by result: exported (the collector took them), failed (the collector refused them or did not answer in time: lost), dropped (the export queue, OTEL_BSP_MAX_QUEUE_SIZE or OTEL_BLRP_MAX_QUEUE_SIZE, was full: lost; forwarding is never slowed).",
		[]string{"signal", "result"}, nil)
	otlpQueuedDesc = prometheus.NewDesc("kproxy_otlp_items_queued",
		"Spans (signal traces) or records (signal logs) waiting for export now.",
		[]string{"signal"}, nil)
)

type exportsCollector struct {
	signal string
	e      *telemetry.Exports
}

// Describe is unchecked: one collector per signal shares the two
// descriptors, told apart by the signal label.
func (c *exportsCollector) Describe(chan<- *prometheus.Desc) {}

func (c *exportsCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.e.Stats()
	for _, r := range []struct {
		result string
		n      uint64
	}{{"exported", s.Exported}, {"failed", s.Failed}, {"dropped", s.Dropped}} {
		ch <- prometheus.MustNewConstMetric(otlpItemsDesc, prometheus.CounterValue, float64(r.n), c.signal, r.result)
	}
	ch <- prometheus.MustNewConstMetric(otlpQueuedDesc, prometheus.GaugeValue, float64(s.Queued), c.signal)
}
