package proxy

import (
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/stages"
)

// gatedReplayer predicts 200 once its gate is open: a closed gate lets
// replays through, an open one holds them (the replay of an overloaded
// kproxy).
type gatedReplayer struct {
	mu   sync.Mutex
	gate chan struct{}
	ran  atomic.Int32
}

func (g *gatedReplayer) hold() chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gate = make(chan struct{})
	return g.gate
}

func (g *gatedReplayer) Run(ctx context.Context, req *stages.Request) stages.Outcome {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	<-gate
	g.ran.Add(1)
	o := stages.Outcome{Predicted: record.Prediction{Status: http.StatusOK}, Duration: time.Millisecond}
	if req.HTTP.Header.Get("Authorization") != "" {
		o.Caller = &user.DefaultInfo{Name: "dev", Groups: []string{"devs", user.AllAuthenticated}}
	}
	if req.HTTP.Method == http.MethodPost {
		o.Predicted.Status = http.StatusCreated
	}
	for _, name := range record.StageOrder {
		o.Stages = append(o.Stages, record.StageResult{Name: name, Outcome: record.Pass, DurationNs: 1000})
	}
	return o
}

// records is a record.Sink for the pool's tests.
type records struct {
	mu   sync.Mutex
	recs []*record.Record
}

func (r *records) Write(rec *record.Record) {
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
}

func (r *records) list() []*record.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*record.Record(nil), r.recs...)
}

// poll waits, at most 20s, until cond holds.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 20*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// goroutinesAtMost waits until at most n goroutines run (goleak's way:
// goroutines that are ending get the time to end, no sleep).
func goroutinesAtMost(t *testing.T, what string, n int) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 20*time.Second, true,
		func(context.Context) (bool, error) { return runtime.NumGoroutine() <= n, nil })
	if err != nil {
		buf := make([]byte, 1<<20)
		t.Fatalf("%s: %d goroutines, want at most %d: %v\n%s", what, runtime.NumGoroutine(), n, err, buf[:runtime.Stack(buf, true)])
	}
}

// gauge reads one sample of a registered metric (a counter or a gauge).
func gauge(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				match = match || (l.GetName() == label && l.GetValue() == value)
			}
			if !match {
				continue
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s{%s=%q}", name, label, value)
	return 0
}

// TestReplayPoolSheds saturates the replay pool with replays that do not
// end, and checks that kproxy keeps forwarding at once, records every
// request (the shed ones unknown, saying why), counts the sheds, holds no
// more goroutines than its workers, and, once the replays end, runs the
// queued ones and leaves nothing running.
func TestReplayPoolSheds(t *testing.T) {
	const workers, queue = 2, 3
	const gets, posts = 40, 5

	up := tlsUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusCreated)
		}
		_, _ = io.WriteString(w, `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x","resourceVersion":"5"}}`)
	})

	closed := make(chan struct{})
	close(closed)
	replayer := &gatedReplayer{gate: closed}
	sink := &records{}
	reg := prometheus.NewRegistry()
	p, err := New(Config{Upstream: up.URL, Passthrough: up.Passthrough, Replayer: replayer, Sink: sink,
		ReplayWorkers: workers, ReplayQueue: queue, Metrics: metrics.New(reg)})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewUnstartedServer(p)
	front.EnableHTTP2 = true
	front.StartTLS()
	defer front.Close()
	client := front.Client()
	client.Timeout = 10 * time.Second // forwarding must never wait for a replay
	defer client.CloseIdleConnections()

	do := func(method, path, body string) {
		t.Helper()
		req, err := http.NewRequest(method, front.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer not-a-secret-here")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v (forwarding waited for the replay?)", method, path, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if want := map[string]int{http.MethodGet: 200, http.MethodPost: 201}[method]; resp.StatusCode != want {
			t.Fatalf("%s %s: status %d, want %d", method, path, resp.StatusCode, want)
		}
	}
	getPath := "/api/v1/namespaces/default/configmaps/x"
	postPath := "/api/v1/namespaces/default/configmaps"
	postBody := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"y"},"data":{"k":"v"}}`

	// A first request opens the connections; then the baseline.
	do(http.MethodGet, getPath, "")
	poll(t, "the first record", func() bool { return len(sink.list()) == 1 })
	poll(t, "the first replay's worker ends", func() bool { return p.pool.stats().Busy == 0 })
	baseline := runtime.NumGoroutine()

	// The replays now hold their workers. Every request is still answered
	// at once: two replays run, three wait, the rest are shed.
	gate := replayer.hold()
	for range gets {
		do(http.MethodGet, getPath, "")
	}
	for range posts {
		do(http.MethodPost, postPath, postBody)
	}
	shed := gets + posts - workers - queue
	poll(t, "the shed requests' records", func() bool { return len(sink.list()) == 1+shed })
	st := p.pool.stats()
	if st.Busy != workers || st.Queued != queue || st.Shed != uint64(shed) {
		t.Errorf("pool %+v, want %d busy, %d queued, %d shed", st, workers, queue, shed)
	}
	for _, rec := range sink.list()[1:] {
		if rec.Predicted.Stage != record.StageUnknown || rec.Predicted.Message != ShedMessage || rec.Predicted.Status != 0 {
			t.Errorf("shed record %s %s predicted %+v, want unknown: %q", rec.Request.Method, rec.Request.Path, rec.Predicted, ShedMessage)
		}
		if rec.Actual.Status != 200 && rec.Actual.Status != 201 {
			t.Errorf("shed record %s: actual %d, want the apiserver's answer", rec.ID, rec.Actual.Status)
		}
		if len(rec.Stages) != len(record.StageOrder) {
			t.Errorf("shed record %s: %d stages, want the nine", rec.ID, len(rec.Stages))
		}
		for i, s := range rec.Stages {
			if s.Name != record.StageOrder[i] || s.Outcome != record.Skip {
				t.Errorf("shed record %s: stage %d is %s %s, want %s skip", rec.ID, i, s.Name, s.Outcome, record.StageOrder[i])
			}
		}
		if got := http.Header(rec.Request.Headers).Get("Authorization"); got == "" || strings.Contains(got, "not-a-secret-here") {
			t.Errorf("shed record %s: Authorization %q, want it redacted", rec.ID, got)
		}
		// Named as the first request's replay authenticated the token.
		if rec.Request.User != "dev" || !slices.Equal(rec.Request.Groups, []string{"devs", user.AllAuthenticated}) {
			t.Errorf("shed record %s: user %q in %v, want dev as the first replay authenticated the token", rec.ID, rec.Request.User, rec.Request.Groups)
		}
		if e := rec.Stages[0].Explanation; !strings.Contains(e, `the caller is named as kproxy's replay authenticated the same bearer token`) {
			t.Errorf("shed record %s: authentication says %q, want where its user came from", rec.ID, e)
		}
	}
	if got := gauge(t, reg, "kproxy_replays_total", "result", "shed"); got != float64(shed) {
		t.Errorf("kproxy_replays_total{result=shed} = %v, want %d", got, shed)
	}
	if got := gauge(t, reg, "kproxy_replay_queue_depth", "", ""); got != queue {
		t.Errorf("kproxy_replay_queue_depth = %v, want %d", got, queue)
	}
	if got := gauge(t, reg, "kproxy_replay_workers_busy", "", ""); got != workers {
		t.Errorf("kproxy_replay_workers_busy = %v, want %d", got, workers)
	}
	// The held replays hold their workers' goroutines, and nothing else:
	// not one goroutine per request.
	goroutinesAtMost(t, "while the pool is full", baseline+workers+2)

	// The replays end: the queued ones run, every record is written, and
	// nothing is left running.
	close(gate)
	p.Drain()
	recs := sink.list()
	if len(recs) != 1+gets+posts {
		t.Fatalf("%d records, want one per request (%d)", len(recs), 1+gets+posts)
	}
	if n := replayer.ran.Load(); n != 1+workers+queue {
		t.Errorf("%d replays ran, want %d", n, 1+workers+queue)
	}
	var predicted int
	for _, rec := range recs {
		if rec.Predicted.Stage != record.StageUnknown {
			predicted++
			if rec.Predicted.Status != rec.Actual.Status {
				t.Errorf("record %s: predicted %d, actual %d", rec.ID, rec.Predicted.Status, rec.Actual.Status)
			}
		}
	}
	if predicted != 1+workers+queue {
		t.Errorf("%d records predicted, want %d", predicted, 1+workers+queue)
	}
	if got := gauge(t, reg, "kproxy_replays_total", "result", "run"); got != 1+workers+queue {
		t.Errorf("kproxy_replays_total{result=run} = %v, want %d", got, 1+workers+queue)
	}
	if got := gauge(t, reg, "kproxy_records_total", "", ""); got != 1+gets+posts {
		t.Errorf("kproxy_records_total = %v, want %d", got, 1+gets+posts)
	}
	if got := gauge(t, reg, "kproxy_replay_queue_depth", "", ""); got != 0 {
		t.Errorf("kproxy_replay_queue_depth = %v after the drain, want 0", got)
	}
	// Drain waits for the records; a worker counts itself idle just
	// after its replay's record is written.
	poll(t, "the pool idle after the drain", func() bool { st := p.pool.stats(); return st.Busy == 0 && st.Queued == 0 })
	goroutinesAtMost(t, "after the drain", baseline)
}

// TestReplayPoolRunsEachAcceptedReplayOnce submits from many goroutines
// at once, with replays that end at once: every replay the pool accepts
// runs exactly once (none is queued just as the last worker leaves), at
// most `workers` at a time, and the pool ends idle.
func TestReplayPoolRunsEachAcceptedReplayOnce(t *testing.T) {
	const workers, queue, submitters, each = 3, 4, 16, 200
	before := runtime.NumGoroutine()
	q := newReplayPool(workers, queue, clock.RealClock{}, nil)
	var accepted, ran, running, peak atomic.Int64
	var wg sync.WaitGroup
	for range submitters {
		wg.Go(func() {
			for range each {
				ok := q.submit(func() {
					n := running.Add(1)
					for {
						p := peak.Load()
						if n <= p || peak.CompareAndSwap(p, n) {
							break
						}
					}
					runtime.Gosched()
					running.Add(-1)
					ran.Add(1)
				}, false)
				if ok {
					accepted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	poll(t, "every accepted replay runs", func() bool { return ran.Load() == accepted.Load() && q.stats().Busy == 0 })
	st := q.stats()
	if got := st.Ran + st.Shed; got != submitters*each {
		t.Errorf("ran %d + shed %d = %d, want %d submitted", st.Ran, st.Shed, got, submitters*each)
	}
	if st.Ran != uint64(ran.Load()) {
		t.Errorf("pool counted %d run, %d ran", st.Ran, ran.Load())
	}
	if p := peak.Load(); p > workers {
		t.Errorf("%d replays ran at once, want at most %d", p, workers)
	}
	goroutinesAtMost(t, "after the replays", before)
}

// TestReplayPoolDefaults sizes the pool from GOMAXPROCS.
func TestReplayPoolDefaults(t *testing.T) {
	q := newReplayPool(0, 0, clock.RealClock{}, nil)
	if w := runtime.GOMAXPROCS(0); q.workers != w || q.capacity != replayQueuePerWorker*w {
		t.Errorf("defaults: %d workers, queue %d; want %d and %d", q.workers, q.capacity, w, replayQueuePerWorker*w)
	}
	if got := fmt.Sprint(DefaultReplayQueue(DefaultReplayWorkers())); got != fmt.Sprint(q.capacity) {
		t.Errorf("DefaultReplayQueue %s, pool %d", got, q.capacity)
	}
}

// TestReplayPoolRestsWhenOverloaded: a worker takes queued replays back
// to back while nothing is shed, and rests between them (restPerRun times
// as long as the replay ran, bounded) once the pool has shed one.
func TestReplayPoolRestsWhenOverloaded(t *testing.T) {
	for _, overload := range []bool{false, true} {
		q := newReplayPool(1, 2, clock.RealClock{}, nil)
		var mu sync.Mutex
		var rests []time.Duration
		q.rest = func(d time.Duration) { mu.Lock(); rests = append(rests, d); mu.Unlock() }
		gate := make(chan struct{})
		var done sync.WaitGroup
		job := func() { defer done.Done(); <-gate; time.Sleep(2 * time.Millisecond) }
		done.Add(3)
		for range 3 { // one runs, two wait
			if !q.submit(job, false) {
				t.Fatal("shed within the pool's bounds")
			}
		}
		if overload && q.submit(func() {}, false) {
			t.Fatal("a fourth replay was not shed")
		}
		close(gate)
		done.Wait()
		poll(t, "the worker ends", func() bool { return q.stats().Busy == 0 })
		mu.Lock()
		got := slices.Clone(rests)
		mu.Unlock()
		switch {
		case !overload && len(got) != 0:
			t.Errorf("rested %v with nothing shed", got)
		case overload && len(got) != 2:
			t.Errorf("rested %v after a shed, want a rest before each of the two queued replays", got)
		}
		for _, d := range got {
			if d < restPerRun*2*time.Millisecond || d > maxRest {
				t.Errorf("rested %v, want %d times the replay's own time (>= %v), at most %v", d, restPerRun, restPerRun*2*time.Millisecond, maxRest)
			}
		}
	}
}

// TestReplayPoolWritesFirst: a queued write's replay runs before the reads
// queued ahead of it (it reads the state the write met; late, it may find
// a later write's).
func TestReplayPoolWritesFirst(t *testing.T) {
	q := newReplayPool(1, 8, clock.RealClock{}, nil)
	gate := make(chan struct{})
	var mu sync.Mutex
	var order []string
	var done sync.WaitGroup
	job := func(name string) func() {
		done.Add(1)
		return func() {
			defer done.Done()
			<-gate
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
		}
	}
	q.submit(job("running"), false)
	q.submit(job("read 1"), false)
	q.submit(job("read 2"), false)
	q.submit(job("write 1"), true)
	q.submit(job("read 3"), false)
	q.submit(job("write 2"), true)
	close(gate)
	done.Wait()
	if got, want := strings.Join(order, ", "), "running, write 1, write 2, read 1, read 2, read 3"; got != want {
		t.Errorf("ran %s; want %s", got, want)
	}
}

// TestReplayPoolOneWorkerWhenOverloaded: after a shed, the pool starts no
// worker beyond one until the overload window has passed, and of the
// workers it had, one goes on.
func TestReplayPoolOneWorkerWhenOverloaded(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	q := newReplayPool(2, 1, clk, nil)
	q.rest = func(time.Duration) {}
	gate := make(chan struct{})
	var done sync.WaitGroup
	job := func() { defer done.Done(); <-gate }
	done.Add(3)
	for range 3 { // two run, one waits
		q.submit(job, false)
	}
	if q.submit(func() {}, false) {
		t.Fatal("a fourth replay was not shed")
	}
	if got := q.limit(clk.Now()); got != 1 {
		t.Errorf("limit right after a shed: %d workers, want 1", got)
	}
	close(gate)
	done.Wait()
	poll(t, "the workers end", func() bool { return q.stats().Busy == 0 })
	// Still overloaded: a new replay gets one worker, then a queue.
	gate2 := make(chan struct{})
	done.Add(2)
	job2 := func() { defer done.Done(); <-gate2 }
	q.submit(job2, false)
	q.submit(job2, false)
	if st := q.stats(); st.Busy != 1 || st.Queued != 1 {
		t.Errorf("while overloaded: %d busy, %d queued; want 1 and 1", st.Busy, st.Queued)
	}
	close(gate2)
	done.Wait()
	poll(t, "the worker ends", func() bool { return q.stats().Busy == 0 })
	clk.SetTime(clk.Now().Add(2 * overloadWindow))
	if got := q.limit(clk.Now()); got != 2 {
		t.Errorf("limit once the overload passed: %d, want 2", got)
	}
}

// tlsUpstream is an upstream over TLS serving h, and kproxy's transports
// to it (trusting its certificate); both closed when the test ends.
func tlsUpstream(t *testing.T, h http.HandlerFunc) *Upstream {
	t.Helper()
	return upstreamOf(t, httptest.NewTLSServer(h))
}

// upstreamOf is kproxy's Upstream for a started TLS test server, which
// it closes when the test ends.
func upstreamOf(t *testing.T, upstream *httptest.Server) *Upstream {
	t.Helper()
	t.Cleanup(upstream.Close)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: upstream.Certificate().Raw})
	up, err := NewUpstream(&rest.Config{Host: upstream.URL, TLSClientConfig: rest.TLSClientConfig{CAData: caPEM}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(up.Passthrough.CloseIdleConnections)
	return up
}

// TestReplayPoolWorkerLingers: a worker whose queue ran out waits for
// the next replay, which it runs on the same goroutine (no new one, no
// stack grown again), and ends once none came for workerLinger; an idle
// worker is not counted busy, and is not handed a replay while the pool
// is overloaded and another works.
func TestReplayPoolWorkerLingers(t *testing.T) {
	q := newReplayPool(2, 4, clock.RealClock{}, nil)
	ran := make(chan struct{}, 8)
	job := func() { ran <- struct{}{} }
	q.submit(job, false)
	<-ran
	poll(t, "the worker goes idle", func() bool { return q.stats().Busy == 0 })
	q.mu.Lock()
	running, idle := q.running, q.idle
	q.mu.Unlock()
	if running != 1 || idle != 1 {
		t.Fatalf("after its replay: %d workers, %d idle; want the one worker idle", running, idle)
	}
	for range 3 { // one at a time: the idle worker takes each
		q.submit(job, false)
		<-ran
		poll(t, "the worker goes idle", func() bool { return q.stats().Busy == 0 })
		q.mu.Lock()
		running = q.running
		q.mu.Unlock()
		if running != 1 {
			t.Fatalf("%d workers for one replay at a time, want the lingering one", running)
		}
	}
	// Overloaded (a shed a moment ago), one replay runs: the idle worker
	// is not handed a second, which waits in the queue.
	gate := make(chan struct{})
	q.submit(func() { <-gate }, false) // the idle worker takes it
	q.mu.Lock()
	q.lastShed = time.Now()
	q.mu.Unlock()
	q.submit(job, false)
	if st := q.stats(); st.Busy != 1 || st.Queued != 1 {
		t.Errorf("overloaded: %d busy, %d queued; want 1 and 1", st.Busy, st.Queued)
	}
	close(gate)
	<-ran
	begin := time.Now()
	poll(t, "the lingering worker ends", func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.running == 0
	})
	if d := time.Since(begin); d < workerLinger/2 {
		t.Errorf("the worker ended %v after its last replay, want about %v", d, workerLinger)
	}
}

// TestRecorder: records completed after their replay (a shed request's,
// every request's under overload) are written by one goroutine, in the
// order their relays ended, all of them past the recorder's buffer too,
// and the goroutine ends once none comes.
func TestRecorder(t *testing.T) {
	for _, n := range []int{1, 3, recorderBuffer * 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			sink := &records{}
			u, _ := url.Parse("https://apiserver.example")
			p, err := New(Config{Upstream: u, Passthrough: namedTransport("upstream"), Sink: sink})
			if err != nil {
				t.Fatal(err)
			}
			baseline := runtime.NumGoroutine()
			for i := range n {
				p.pending.Add(1)
				p.completeLater(&exchange{
					rec:       &record.Record{ID: fmt.Sprint(i)},
					span:      trace.SpanFromContext(context.Background()),
					replayReq: &stages.Request{HTTP: httptest.NewRequest(http.MethodGet, "/api/v1/pods", nil)},
				})
			}
			p.Drain()
			recs := sink.list()
			if len(recs) != n {
				t.Fatalf("%d records, want %d", len(recs), n)
			}
			if n <= recorderBuffer {
				for i, rec := range recs {
					if rec.ID != fmt.Sprint(i) {
						t.Fatalf("record %d is %s: not in the order the relays ended", i, rec.ID)
					}
				}
			}
			goroutinesAtMost(t, "the recorder ends", baseline)
		})
	}
}
