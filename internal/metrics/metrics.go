// Package metrics is kproxy's own Prometheus metrics, served on a
// listener of their own (kproxy serve --metrics-listen): how many requests
// kproxy relayed, how many replays it ran or shed and how long their
// stages took, how often the prediction agreed with the apiserver, what
// happened to the records, and the state of the replay pool.
//
// Metrics holds the collectors, registered on the registry it is given
// (never Prometheus's global default one), so that tests and two kproxies
// in one process keep their counts apart. Every method of a nil *Metrics
// does nothing: code that records measurements needs no "metrics on?"
// check, and a proxy built without metrics pays nothing.
//
// Names follow Prometheus's conventions: the kproxy_ prefix, base units
// (seconds), _total on counters, and labels of bounded cardinality (a
// verb outside Kubernetes's set is "other"; a status is its class, "2xx").
package metrics

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kproxy/kproxy/internal/flowview"
	"github.com/kproxy/kproxy/internal/record"
)

// Metrics are kproxy's collectors. Build it with New; the zero value is
// not usable, a nil *Metrics is (it records nothing).
type Metrics struct {
	reg *prometheus.Registry

	requests       *prometheus.CounterVec
	replays        *prometheus.CounterVec
	replayDuration prometheus.Histogram
	stageDuration  *prometheus.HistogramVec
	queueWait      prometheus.Histogram
	queueDepth     prometheus.Gauge
	queueCapacity  prometheus.Gauge
	workersBusy    prometheus.Gauge
	workers        prometheus.Gauge
	predictions    *prometheus.CounterVec
	records        prometheus.Counter
}

// The result label of kproxy_replays_total.
const (
	ReplayRun  = "run"
	ReplayShed = "shed"
	// ReplayFiltered: outside kproxy serve --replay-filter, not replayed.
	ReplayFiltered = "filtered"
)

// The agreement label of kproxy_predictions_total.
const (
	Agree    = "agree"
	Disagree = "disagree"
	Unknown  = "unknown"
)

// durationBuckets span a replay stage's range: tens of microseconds (an
// RBAC decision) to the replay budget (admission webhooks, up to 30s each,
// within the 40s budget).
var durationBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 40}

// New builds kproxy's collectors and registers them on reg, with the Go
// runtime's and the process's own (goroutines, memory, open files).
func New(reg *prometheus.Registry) *Metrics {
	m := &Metrics{
		reg: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kproxy_requests_total",
			Help: "Requests kproxy relayed, counted when the response ends, by Kubernetes verb and the class of the status the client received (2xx, 4xx, ...; none when no status was sent).",
		}, []string{"verb", "code_class"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kproxy_replays_total",
			Help: "Replays by result: run (the prediction comes from the replay), shed (the replay pool and its queue were full: the request was forwarded and recorded, its prediction unknown), filtered (outside --replay-filter: forwarded and recorded, not replayed).",
		}, []string{"result"}),
		replayDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kproxy_replay_duration_seconds",
			Help:    "How long one replay took, every stage included (not the wait for a worker).",
			Buckets: durationBuckets,
		}),
		stageDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kproxy_replay_stage_duration_seconds",
			Help:    "How long each replayed stage took, by the contract's stage name; stages not reached are not observed.",
			Buckets: durationBuckets,
		}, []string{"stage"}),
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kproxy_replay_queue_wait_seconds",
			Help:    "How long a replay waited for a free worker (0 when one was free).",
			Buckets: durationBuckets,
		}),
		queueDepth: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kproxy_replay_queue_depth",
			Help: "Replays waiting for a free worker now.",
		}),
		queueCapacity: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kproxy_replay_queue_capacity",
			Help: "How many replays may wait for a worker (--replay-queue); past it, replays are shed.",
		}),
		workersBusy: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kproxy_replay_workers_busy",
			Help: "Replay workers running a replay now.",
		}),
		workers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kproxy_replay_workers",
			Help: "How many replays may run at once (--replay-workers).",
		}),
		predictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kproxy_predictions_total",
			Help: "Finished records by agreement of the predicted status with the apiserver's: agree, disagree, unknown (kproxy could not predict, or no status came back).",
		}, []string{"agreement"}),
		records: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kproxy_records_total",
			Help: "Capture records finished and handed to the sinks (capture file, flow API, stream), one per relayed request.",
		}),
	}
	reg.MustRegister(m.requests, m.replays, m.replayDuration, m.stageDuration, m.queueWait,
		m.queueDepth, m.queueCapacity, m.workersBusy, m.workers, m.predictions, m.records,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Every label value a dashboard expects is there from the start, at
	// zero: a rate over a series that appears late misses its first
	// increase.
	for _, r := range []string{ReplayRun, ReplayShed, ReplayFiltered} {
		m.replays.WithLabelValues(r)
	}
	for _, a := range []string{Agree, Disagree, Unknown} {
		m.predictions.WithLabelValues(a)
	}
	return m
}

// Registry is the registry the collectors are registered on (nil for a
// nil *Metrics).
func (m *Metrics) Registry() *prometheus.Registry {
	if m == nil {
		return nil
	}
	return m.reg
}

// Record counts a finished record: the request by verb and status class,
// the prediction's agreement, the record itself.
func (m *Metrics) Record(rec *record.Record) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(verbLabel(rec.Request.Verb), codeClass(rec.Actual.Status)).Inc()
	m.predictions.WithLabelValues(agreement(rec)).Inc()
	m.records.Inc()
}

// ReplayRan counts a replay that ran, its duration and its stages'.
func (m *Metrics) ReplayRan(d time.Duration, stages []record.StageResult) {
	if m == nil {
		return
	}
	m.replays.WithLabelValues(ReplayRun).Inc()
	m.replayDuration.Observe(d.Seconds())
	for _, s := range stages {
		if s.Outcome == record.Skip {
			continue
		}
		m.stageDuration.WithLabelValues(s.Name).Observe(time.Duration(s.DurationNs).Seconds())
	}
}

// ReplayShed counts a replay that was shed.
func (m *Metrics) ReplayShed() {
	if m == nil {
		return
	}
	m.replays.WithLabelValues(ReplayShed).Inc()
}

// ReplayFiltered counts a request not replayed (or replayed only as far
// as its user) because it is outside --replay-filter.
func (m *Metrics) ReplayFiltered() {
	if m == nil {
		return
	}
	m.replays.WithLabelValues(ReplayFiltered).Inc()
}

// ReplayPool sets the pool's bounds: its workers and its queue.
func (m *Metrics) ReplayPool(workers, queue int) {
	if m == nil {
		return
	}
	m.workers.Set(float64(workers))
	m.queueCapacity.Set(float64(queue))
}

// CPUPressure exports share, the last sampled share of time tasks
// waited for a CPU, which --replay-cpu-pressure compares to its bound.
func (m *Metrics) CPUPressure(share func() float64) {
	if m == nil {
		return
	}
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kproxy_replay_cpu_pressure_ratio",
		Help: "The share of the last tenth of a second (or more, after a quiet spell) in which some task on the machine waited for a CPU (Linux PSI); at or past --replay-cpu-pressure the replay pool yields to forwarding (one worker, resting) and more replays are shed.",
	}, share))
}

// InFlight exports the requests relayed now that wait for their answer,
// and how many bursts of them ended with kproxy closing the upstream
// connections they left idle.
func (m *Metrics) InFlight(requests, idleCloses func() float64) {
	if m == nil {
		return
	}
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kproxy_requests_in_flight",
		Help: "Requests relayed now that wait for their answer (watches, logs, execs and other long-running requests not counted).",
	}, requests), prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "kproxy_upstream_idle_closes_total",
		Help: "Bursts (64 or more requests in flight at once) after which kproxy closed the upstream connections they left idle and returned the freed memory to the system.",
	}, idleCloses))
}

// ReplayQueued moves the queue depth by delta (+1 queued, -1 taken).
func (m *Metrics) ReplayQueued(delta int) {
	if m == nil {
		return
	}
	m.queueDepth.Add(float64(delta))
}

// ReplayStarted records a replay taken by a worker after waiting wait,
// and the worker busy until ReplayFinished.
func (m *Metrics) ReplayStarted(wait time.Duration) {
	if m == nil {
		return
	}
	m.queueWait.Observe(wait.Seconds())
	m.workersBusy.Inc()
}

// ReplayFinished frees the worker ReplayStarted took.
func (m *Metrics) ReplayFinished() {
	if m == nil {
		return
	}
	m.workersBusy.Dec()
}

// verbs are the label values of kproxy_requests_total's verb: the
// apiserver's verbs (RequestInfo), and the lowercased methods it uses as
// the verb of a non-resource request. Anything else, which a client
// chooses freely, is "other": a label must not grow with its input.
var verbs = map[string]bool{
	"get": true, "list": true, "watch": true, "create": true, "update": true, "patch": true,
	"delete": true, "deletecollection": true, "proxy": true,
	"post": true, "put": true, "head": true, "options": true,
}

func verbLabel(v string) string {
	if verbs[v] {
		return v
	}
	return "other"
}

// codeClass is a status's class ("2xx"), or "none" when no status was
// sent (the client went away first).
func codeClass(status int) string {
	if status < 100 || status > 599 {
		return "none"
	}
	return strconv.Itoa(status/100) + "xx"
}

// agreement is flowview's agreement of a record, as a label value.
func agreement(rec *record.Record) string {
	switch _, k := flowview.Agreement(rec); k {
	case flowview.Match:
		return Agree
	case flowview.Mismatch:
		return Disagree
	}
	return Unknown
}
