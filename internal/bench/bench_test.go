package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/localcluster"
)

// count scales a workload's request count by $KPROXY_BENCH_SCALE (default
// 1). Each benchmark runs once (-benchtime=1x) and sets its own count, so
// the interleaving of targets stays in its hands.
func count(n int) int {
	if s, err := strconv.ParseFloat(os.Getenv("KPROXY_BENCH_SCALE"), 64); err == nil && s > 0 {
		return max(1, int(float64(n)*s))
	}
	return n
}

// result is one target's measurements in one workload.
type result struct {
	lat      []time.Duration
	elapsed  time.Duration
	requests int
	cpu      time.Duration // apiserver CPU spent during the phase
	own      time.Duration // the proxy's own CPU (0 for direct)
	tracing  time.Duration // Jaeger's CPU (ingesting kproxy's spans)
}

func (r *result) median() time.Duration { return r.quantile(0.5) }

// quantile is the latency below which a share q of the requests finished.
func (r *result) quantile(q float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	s := slices.Clone(r.lat)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func (r *result) rps() float64 { return float64(r.requests) / r.elapsed.Seconds() }

// request builds one request for a target.
type request func(t *target, i int) *http.Request

func send(t *target, req *http.Request) error {
	if t.token {
		req.Header.Set("Authorization", "Bearer admin-token")
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: status %d", req.Method, req.URL.Path, resp.StatusCode)
	}
	return err
}

// interleave runs n requests per target with the given concurrency, in
// rounds that rotate through the targets so that drift in the machine's
// load hits every target alike.
func interleave(b *testing.B, n, concurrency, rounds int, mk request) map[string]*result {
	b.Helper()
	res := map[string]*result{}
	for _, t := range e.targets {
		res[t.name] = &result{}
	}
	per := max(1, n/rounds)
	apiPID := e.cluster.APIServerPID()
	for round := 0; round < rounds; round++ {
		for k := range e.targets {
			t := e.targets[(k+round)%len(e.targets)]
			r := res[t.name]
			cpu0, _ := procStat(apiPID)
			own0, _ := procStat(t.pid)
			jg0, _ := procStat(e.jaeger.PID())
			start := time.Now()
			var mu sync.Mutex
			var wg sync.WaitGroup
			var firstErr error
			next := make(chan int)
			for w := 0; w < concurrency; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range next {
						t0 := time.Now()
						err := send(t, mk(t, round*per+i))
						d := time.Since(t0)
						mu.Lock()
						if err != nil && firstErr == nil {
							firstErr = err
						}
						r.lat = append(r.lat, d)
						mu.Unlock()
					}
				}()
			}
			for i := 0; i < per; i++ {
				next <- i
			}
			close(next)
			wg.Wait()
			r.elapsed += time.Since(start)
			r.requests += per
			cpu1, _ := procStat(apiPID)
			r.cpu += cpu1 - cpu0
			if t.pid != 0 {
				own1, _ := procStat(t.pid)
				r.own += own1 - own0
			}
			jg1, _ := procStat(e.jaeger.PID())
			r.tracing += jg1 - jg0
			if firstErr != nil {
				b.Fatalf("%s: %v", t.name, firstErr)
			}
		}
	}
	return res
}

// report prints the comparison and records it as benchmark metrics.
func report(b *testing.B, res map[string]*result, cpu bool) {
	b.Helper()
	d := res["direct"]
	var lines []string
	for _, t := range e.targets {
		r := res[t.name]
		b.ReportMetric(float64(r.median().Microseconds()), t.name+"-p50-µs")
		b.ReportMetric(r.rps(), t.name+"-req/s")
		b.ReportMetric(float64(r.quantile(0.99).Microseconds()), t.name+"-p99-µs")
		line := fmt.Sprintf("%-16s p50 %8v  p99 %8v  %8.1f req/s", t.name, r.median().Round(time.Microsecond), r.quantile(0.99).Round(time.Microsecond), r.rps())
		if t.name != "direct" {
			added := r.median() - d.median()
			ratio := r.rps() / d.rps()
			b.ReportMetric(float64(added.Microseconds()), t.name+"-added-p50-µs")
			b.ReportMetric(ratio, t.name+"-throughput-x")
			line += fmt.Sprintf("  added p50 %8v  throughput %.2fx direct", added.Round(time.Microsecond), ratio)
		}
		if t.pid != 0 {
			own := r.own / time.Duration(r.requests)
			b.ReportMetric(float64(own.Microseconds()), t.name+"-cpu-µs/req")
			line += fmt.Sprintf("  own CPU %v/req", own.Round(time.Microsecond))
		}
		if tr := r.tracing / time.Duration(r.requests); tr > 0 {
			line += fmt.Sprintf("  jaeger CPU %v/req", tr.Round(time.Microsecond))
		}
		if cpu {
			perReq := r.cpu / time.Duration(r.requests)
			b.ReportMetric(float64(perReq.Microseconds())/1000, t.name+"-apiserver-cpu-ms/req")
			line += fmt.Sprintf("  apiserver CPU %v/req", perReq.Round(10*time.Microsecond))
			if t.name != "direct" {
				ratio := float64(r.cpu) / float64(r.requests) / (float64(d.cpu) / float64(d.requests))
				b.ReportMetric(ratio, t.name+"-apiserver-cpu-x")
				line += fmt.Sprintf(" (%.2fx)", ratio)
			}
		}
		lines = append(lines, line)
	}
	b.Logf("\n%s", strings.Join(lines, "\n"))
}

func ensureNamespace(b *testing.B, name string) {
	b.Helper()
	ctx := context.Background()
	if _, err := e.admin.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{}); err == nil {
		return
	}
	if _, err := e.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	if err := localcluster.EnsureDefaultServiceAccount(ctx, e.admin, name); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkGetPod: GET one pod, concurrency 1 (target: added p50 <= 0.35 ms).
func BenchmarkGetPod(b *testing.B) { benchGetPod(b, count(500), 1) }

// BenchmarkGetPodConcurrent: GET one pod, concurrency 16 (target:
// throughput >= 0.80x direct). At this rate the replays of every GET do
// not keep up on 2 cores: the row says how many were predicted, and
// kproxy-filtered shows the hop without them.
func BenchmarkGetPodConcurrent(b *testing.B) { benchGetPod(b, count(4000), 16) }

// benchGetPod sends n GETs of the bench pod to each target, concurrency
// at a time, and reports them.
func benchGetPod(b *testing.B, n, concurrency int) {
	ensureBenchPod(b)
	start := time.Now()
	defer withFiltered(b)()
	res := interleave(b, n, concurrency, 5, func(t *target, _ int) *http.Request {
		req, _ := http.NewRequest("GET", t.base+benchPodPath, nil)
		return req
	})
	report(b, res, false)
	reportPredicted(b, "bench", start, res["kproxy"].requests)
}

// filteredName is the kproxy whose --replay-filter leaves the GET and
// POST benchmarks' requests out: forwarded, recorded and traced, not
// replayed. Beside "kproxy" (every request replayed) it shows what the
// replay costs, and what an operator saves by narrowing it.
const filteredName = "kproxy-filtered"

var filtered *target

// withFiltered adds the kproxy-filtered target to the benchmark's
// targets, started on first use, and returns the function that takes it
// out again.
func withFiltered(b *testing.B) func() {
	b.Helper()
	if filtered == nil {
		var err error
		filtered, err = e.startKproxy(filteredName, true, "--replay-filter=~n elsewhere",
			"--capture="+filepath.Join(e.dir, filteredName+"-capture.jsonl"))
		if err != nil {
			b.Fatal(err)
		}
	}
	saved := e.targets
	e.targets = append(slices.Clone(saved), filtered)
	return func() { e.targets = saved }
}

// BenchmarkCreateConfigMap: POST configmap, concurrency 8 (targets: added
// p50 <= 2 ms, throughput >= 0.75x direct).
func BenchmarkCreateConfigMap(b *testing.B) {
	ensureNamespace(b, "bench-create")
	start := time.Now()
	var seq int64
	var mu sync.Mutex
	defer withFiltered(b)()
	res := interleave(b, count(1000), 8, 5, func(t *target, _ int) *http.Request {
		mu.Lock()
		seq++
		n := seq
		mu.Unlock()
		body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm-%d-%d"},"data":{"k":"v"}}`, time.Now().UnixNano(), n)
		req, _ := http.NewRequest("POST", t.base+"/api/v1/namespaces/bench-create/configmaps", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		return req
	})
	report(b, res, false)
	reportPredicted(b, "bench-create", start, res["kproxy"].requests)
}

// populate creates count ConfigMaps of size bytes in ns, if not there yet.
func populate(b *testing.B, ns string, count, size int) {
	b.Helper()
	ensureNamespace(b, ns)
	ctx := context.Background()
	list, err := e.admin.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{Limit: 1})
	if err == nil && list.RemainingItemCount != nil && int(*list.RemainingItemCount)+len(list.Items) >= count {
		return
	}
	value := strings.Repeat("x", size)
	var wg sync.WaitGroup
	errs := make(chan error, count)
	sem := make(chan struct{}, 8)
	for i := 0; i < count; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%05d", i)}, Data: map[string]string{"v": value}}
			if _, err := e.admin.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
				errs <- err
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkList1000: LIST 1000 x 1 KiB, concurrency 4 (targets: throughput
// >= 0.75x direct; apiserver CPU per LIST <= 1.2x direct).
func BenchmarkList1000(b *testing.B) {
	populate(b, "bench-list", 1000, 1024)
	res := interleave(b, count(100), 4, 5, func(t *target, _ int) *http.Request {
		req, _ := http.NewRequest("GET", t.base+"/api/v1/namespaces/bench-list/configmaps", nil)
		req.Header.Set("Accept", "application/json")
		return req
	})
	report(b, res, true)
}

// BenchmarkListHuge: a LIST of ~200 MB (targets: time <= 1.2x direct;
// kproxy memory growth <= 16 MiB).
func BenchmarkListHuge(b *testing.B) {
	populate(b, "bench-huge", 200, 1000*1000)
	kp := targetNamed("kproxy")
	_, rss0 := procStat(kp.pid)
	resetPeakRSS(kp.pid)
	res := interleave(b, 3, 1, 3, func(t *target, _ int) *http.Request {
		req, _ := http.NewRequest("GET", t.base+"/api/v1/namespaces/bench-huge/configmaps", nil)
		req.Header.Set("Accept", "application/json")
		return req
	})
	growth := peakRSS(kp.pid) - rss0
	b.ReportMetric(float64(growth)/(1<<20), "kproxy-rss-growth-MiB")
	b.Logf("kproxy peak RSS growth during the huge LISTs: %.1f MiB", float64(growth)/(1<<20))
	report(b, res, false)
}

func targetNamed(name string) *target {
	for _, t := range e.targets {
		if t.name == name {
			return t
		}
	}
	panic(name)
}

// BenchmarkWatchLatency: one write, the event's arrival on a watch through
// each target; the comparison is paired per event (target: added p50 <=
// 0.5 ms, no event lost).
func BenchmarkWatchLatency(b *testing.B) {
	ensureNamespace(b, "bench-watch")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	list, err := e.admin.CoreV1().ConfigMaps("bench-watch").List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	type arrival struct {
		target string
		name   string
		at     time.Time
	}
	arrivals := make(chan arrival, 1024)
	for _, t := range e.targets {
		req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/api/v1/namespaces/bench-watch/configmaps?watch=1&resourceVersion=%s", t.base, list.ResourceVersion), nil)
		if t.token {
			req.Header.Set("Authorization", "Bearer admin-token")
		}
		resp, err := t.client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		go func(t *target, body io.Reader) {
			sc := bufio.NewScanner(body)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				at := time.Now()
				var ev struct {
					Object struct {
						Metadata struct{ Name string } `json:"metadata"`
					} `json:"object"`
				}
				if json.Unmarshal(sc.Bytes(), &ev) == nil {
					arrivals <- arrival{t.name, ev.Object.Metadata.Name, at}
				}
			}
		}(t, resp.Body)
	}
	n := count(200)
	added := map[string][]time.Duration{}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("w-%d-%d", time.Now().UnixNano(), i)
		if _, err := e.admin.CoreV1().ConfigMaps("bench-watch").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		got := map[string]time.Time{}
		timeout := time.After(30 * time.Second)
		for len(got) < len(e.targets) {
			select {
			case a := <-arrivals:
				if a.name == name {
					got[a.target] = a.at
				}
			case <-timeout:
				b.Fatalf("event %s lost: arrived only on %v", name, got)
			}
		}
		for _, t := range e.targets[1:] {
			added[t.name] = append(added[t.name], got[t.name].Sub(got["direct"]))
		}
	}
	var lines []string
	for _, t := range e.targets[1:] {
		r := &result{lat: added[t.name]}
		b.ReportMetric(float64(r.median().Microseconds()), t.name+"-added-p50-µs")
		lines = append(lines, fmt.Sprintf("%-14s event arrives p50 %v after direct (%d events, none lost)", t.name, r.median().Round(time.Microsecond), n))
	}
	b.Logf("\n%s", strings.Join(lines, "\n"))
}

// BenchmarkIdleWatches: memory per idle watch in a fresh kproxy (targets:
// <= 64 KiB each over HTTP/1.1 TLS, <= 40 KiB over HTTP/2). Two figures:
// the growth of the RSS, which counts the garbage the watches' replays
// left until the next GC (the Go heap grows to twice what is live before
// it collects), and what the watches hold: the Go heap in use after a
// forced GC, and the goroutine stacks.
func BenchmarkIdleWatches(b *testing.B) {
	ensureNamespace(b, "bench-idle")
	const watches = 500
	for _, proto := range []struct {
		name string
		h2   bool
	}{{"http1", false}, {"http2", true}} {
		ports, err := localcluster.FreePorts(1)
		if err != nil {
			b.Fatal(err)
		}
		debug := "127.0.0.1:" + strconv.Itoa(ports[0])
		kp, err := e.startKproxy("kproxy-idle-"+proto.name, false, "--debug-addr="+debug)
		if err != nil {
			b.Fatal(err)
		}
		tr := kp.client.Transport.(*http.Transport).Clone()
		tr.ForceAttemptHTTP2 = proto.h2
		tr.MaxIdleConnsPerHost = watches
		client := &http.Client{Transport: tr}
		time.Sleep(time.Second)
		_, rss0 := procStat(kp.pid)
		heap0, stacks0 := liveMemory(b, kp, debug)
		if d := os.Getenv("KPROXY_BENCH_PAUSE"); d != "" {
			// Time to take a heap profile before the watches, the base
			// to diff the one taken after them against (pprof -base).
			pause, _ := time.ParseDuration(d)
			time.Sleep(pause)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var bodies []io.Closer
		for i := 0; i < watches; i++ {
			req, _ := http.NewRequestWithContext(ctx, "GET", kp.base+"/api/v1/namespaces/bench-idle/configmaps?watch=1", nil)
			req.Header.Set("Authorization", "Bearer admin-token")
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			if proto.h2 && resp.ProtoMajor != 2 {
				b.Fatalf("watch %d over %s, want HTTP/2", i, resp.Proto)
			}
			bodies = append(bodies, resp.Body)
		}
		time.Sleep(2 * time.Second)
		_, rss1 := procStat(kp.pid)
		heap1, stacks1 := liveMemory(b, kp, debug)
		if d := os.Getenv("KPROXY_BENCH_PAUSE"); d != "" {
			pause, _ := time.ParseDuration(d) // time to take a heap profile
			time.Sleep(pause)
		}
		per := float64(rss1-rss0) / watches / 1024
		heap, stacks := (heap1-heap0)/watches/1024, (stacks1-stacks0)/watches/1024
		live := heap + stacks
		b.ReportMetric(per, "KiB/watch-"+proto.name)
		b.ReportMetric(live, "live-KiB/watch-"+proto.name)
		b.Logf("%d idle watches over %s: kproxy RSS %d -> %d MiB, %.1f KiB per watch; held %.1f KiB per watch (Go heap after a GC %.1f, goroutine stacks %.1f)",
			watches, proto.name, rss0>>20, rss1>>20, per, live, heap, stacks)
		cancel()
		for _, c := range bodies {
			c.Close()
		}
		tr.CloseIdleConnections()
	}
}

// liveMemory forces a GC in kproxy (its pprof heap endpoint, gc=1) and
// returns the heap in use and the goroutine stacks, in bytes.
func liveMemory(b *testing.B, t *target, debug string) (heap, stacks float64) {
	b.Helper()
	resp, err := metricsClient.Get("http://" + debug + "/debug/pprof/heap?gc=1")
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	s, err := scrape(t)
	if err != nil {
		b.Fatal(err)
	}
	return s.heap, s.stacks
}
