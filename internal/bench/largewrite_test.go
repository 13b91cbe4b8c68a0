package bench

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// Large writes: what a write's replay holds in memory. Each request is a
// ConfigMap of ~2.9 MB, under the apiserver's 3 MiB body limit and over
// the 1 MiB a ConfigMap may hold, so the apiserver decodes it, runs it
// through admission and rejects it at validation (422): the whole write
// path, and nothing left in etcd. largeWriteClients send at once, for
// largeWriteRounds rounds.
const (
	largeWriteBytes   = 2_900_000
	largeWriteClients = 8
	largeWriteRounds  = 4
	// The target: kproxy's RSS, at its peak, at most this much over its
	// baseline (the probe saw +506 MB before the bound).
	largeWritePeakBudget = 128 << 20
)

// BenchmarkLargeWrites: 8 concurrent POSTs of ~2.9 MB each, through
// every target (target: kproxy's RSS peak <= baseline + 128 MiB, back to
// baseline after; every request answered as directly).
func BenchmarkLargeWrites(b *testing.B) {
	ensureNamespace(b, "bench-large")
	value := strings.Repeat("x", largeWriteBytes)
	body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"large"},"data":{"v":%q}}`, value)
	kp := targetNamed("kproxy")
	base, err := scrape(kp)
	if err != nil {
		b.Fatal(err)
	}
	peak := base
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for {
			if s, err := scrape(kp); err == nil {
				peak.rss = max(peak.rss, s.rss)
				peak.heap = max(peak.heap, s.heap)
				peak.goroutines = max(peak.goroutines, s.goroutines)
			}
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	elapsed := map[string]time.Duration{}
	statuses := map[string]map[int]int{}
	for range largeWriteRounds {
		for _, t := range e.targets {
			if statuses[t.name] == nil {
				statuses[t.name] = map[int]int{}
			}
			var mu sync.Mutex
			var wg sync.WaitGroup
			start := time.Now()
			for range largeWriteClients {
				wg.Go(func() {
					req, _ := http.NewRequest("POST", t.base+"/api/v1/namespaces/bench-large/configmaps", strings.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					code := 0
					if t.token {
						req.Header.Set("Authorization", "Bearer admin-token")
					}
					if resp, err := t.client.Do(req); err == nil {
						code = resp.StatusCode
						resp.Body.Close()
					}
					mu.Lock()
					statuses[t.name][code]++
					mu.Unlock()
				})
			}
			wg.Wait()
			elapsed[t.name] += time.Since(start)
		}
	}
	after, wait := waitReplayIdle(b, kp)
	close(stop)
	sampler.Wait()
	const mib = 1 << 20
	for _, t := range e.targets {
		n := largeWriteClients * largeWriteRounds
		b.Logf("%-14s %d POSTs of %.1f MB, %d at once: %.1f writes/s, statuses %v", t.name, n, float64(len(body))/1e6, largeWriteClients,
			float64(n)/elapsed[t.name].Seconds(), statuses[t.name])
		if t.name != "direct" && fmt.Sprint(statuses[t.name]) != fmt.Sprint(statuses["direct"]) {
			b.Errorf("%s answered %v, directly %v", t.name, statuses[t.name], statuses["direct"])
		}
	}
	growth := peak.rss - base.rss
	b.Logf("kproxy RSS %.0f MiB before, %.0f MiB at peak (+%.0f MiB; budget +%d MiB), %.0f MiB once the replays ended (%v); heap in use %.0f MiB before, %.0f MiB at peak; goroutines %0.f -> %0.f -> %0.f",
		base.rss/mib, peak.rss/mib, growth/mib, largeWritePeakBudget/mib, after.rss/mib, wait.Round(100*time.Millisecond), base.heap/mib, peak.heap/mib,
		base.goroutines, peak.goroutines, after.goroutines)
	if growth > largeWritePeakBudget {
		b.Logf("TARGET MISSED: kproxy's RSS grew %.0f MiB under large writes (budget %d MiB)", growth/mib, largeWritePeakBudget/mib)
	}
	b.ReportMetric(growth/mib, "kproxy-rss-growth-MiB")
	b.ReportMetric(peak.heap/mib, "kproxy-peak-heap-MiB")
}
