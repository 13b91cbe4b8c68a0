package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/record"
)

// TestSoak runs kproxy (its own process, as deployed) under a mixed load
// over HTTP/2 for a fixed time: reads, lists, writes and deletes, watches
// opened and closed, from 16 clients. Afterwards its goroutines, open
// files and resident memory must return to their level before the load,
// every request must have exactly one record, and no prediction may be a
// status the apiserver did not give (under overload kproxy sheds replays:
// unknown, never a guess). make test runs it for 20 s; make soak for
// $KPROXY_SOAK_DURATION (default 10m).
func TestSoak(t *testing.T) {
	duration := 20 * time.Second
	if d, err := time.ParseDuration(os.Getenv("KPROXY_SOAK_DURATION")); err == nil && d > 0 {
		duration = d
	}
	capture := filepath.Join(t.TempDir(), "capture.jsonl")
	k := startKproxyProcess(t, processOptions{capture: capture})
	addr, metricsAddr, pid := k.addr, k.metricsAddr, k.cmd.Process.Pid
	ctx := context.Background()
	h2 := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: k.pool}, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 32}
	if err := http2.ConfigureTransport(h2); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: h2, Timeout: time.Minute}
	// sent counts the requests whose headers went out: one the load's end
	// canceled before it left the client never reached kproxy, and has no
	// record to count.
	var sent atomic.Int64
	trace := &httptrace.ClientTrace{WroteHeaders: func() { sent.Add(1) }}
	send := func(ctx context.Context, method, path, body string) (int, error) {
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), method, "https://"+addr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+localcluster.TokenOf("admin"))
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	ensureNamespaceThrough(t, send, "soak")

	// Warm up, then the baseline.
	for i := range 20 {
		if _, err := send(ctx, "GET", fmt.Sprintf("/api/v1/namespaces/soak/configmaps?limit=%d", i+1), ""); err != nil {
			t.Fatal(err)
		}
	}
	base := kproxyState(t, pid, metricsAddr)

	lctx, stop := context.WithTimeout(ctx, duration)
	defer stop()
	var wg sync.WaitGroup
	var errs atomic.Int64
	var firstErr atomic.Value
	fail := func(err error) {
		if errs.Add(1) == 1 {
			firstErr.Store(err)
		}
	}
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; lctx.Err() == nil; i++ {
				name := fmt.Sprintf("soak-%d-%d", w, i)
				var err error
				switch i % 5 {
				case 0:
					_, err = send(lctx, "POST", "/api/v1/namespaces/soak/configmaps", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"`+name+`"},"data":{"a":"b"}}`)
					if err == nil {
						_, err = send(lctx, "DELETE", "/api/v1/namespaces/soak/configmaps/"+name, "")
					}
				case 1:
					_, err = send(lctx, "GET", "/api/v1/namespaces/soak/configmaps", "")
				case 2:
					_, err = send(lctx, "GET", "/api/v1/namespaces/soak", "")
				case 3:
					// A watch, held for a moment, then dropped by the client.
					wctx, cancel := context.WithTimeout(lctx, 500*time.Millisecond)
					_, err = send(wctx, "GET", "/api/v1/namespaces/soak/configmaps?watch=true", "")
					cancel()
					if wctx.Err() != nil {
						err = nil
					}
				default:
					_, err = send(lctx, "GET", "/apis/apps/v1/namespaces/soak/deployments", "")
				}
				if err != nil && lctx.Err() == nil {
					fail(err)
				}
			}
		}()
	}
	peak := kproxyState(t, pid, metricsAddr)
	for lctx.Err() == nil {
		time.Sleep(time.Second)
		if s := kproxyState(t, pid, metricsAddr); s.goroutines > peak.goroutines {
			peak = s
		}
	}
	wg.Wait()
	if n := errs.Load(); n > 0 {
		t.Errorf("%d requests failed, first: %v", n, firstErr.Load())
	}
	h2.CloseIdleConnections()

	// Back to baseline once the replays in flight have drained.
	var after state
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		after = kproxyState(t, pid, metricsAddr)
		return after.queue == 0 && after.busy == 0 && after.goroutines <= base.goroutines+16, nil
	})
	t.Logf("soak %v, %d requests: goroutines %d → peak %d → %d; open files %d → %d; RSS %.1f → %.1f MiB; replays shed %d",
		duration, sent.Load(), base.goroutines, peak.goroutines, after.goroutines, base.fds, after.fds,
		float64(base.rss)/(1<<20), float64(after.rss)/(1<<20), after.shed)
	if err != nil {
		t.Errorf("goroutines did not return to baseline: %d before the load, %d after (replay queue %d, busy %d)", base.goroutines, after.goroutines, after.queue, after.busy)
	}
	if after.fds > base.fds+16 {
		t.Errorf("open files: %d before the load, %d after", base.fds, after.fds)
	}
	if after.rss > base.rss+base.rss/2+64<<20 {
		t.Errorf("resident memory: %.1f MiB before the load, %.1f MiB after", float64(base.rss)/(1<<20), float64(after.rss)/(1<<20))
	}

	// Stop kproxy (flushing its capture), then count the records.
	k.stop(t, time.Minute)
	f, err := os.Open(capture)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	records, wrong, unknown := 0, 0, 0
	for sc.Scan() {
		var r record.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("capture line %d: %v", records+1, err)
		}
		records++
		switch {
		case r.Predicted.Stage == record.StageUnknown:
			unknown++
		case r.Actual.Error == "" && r.Actual.Status != 0 && r.Predicted.Status != r.Actual.Status:
			wrong++
			if wrong <= 5 {
				t.Errorf("%s %s: predicted %d at %s, the apiserver answered %d", r.Request.Method, r.Request.Path, r.Predicted.Status, r.Predicted.Stage, r.Actual.Status)
			}
		}
	}
	if int64(records) != sent.Load() {
		t.Errorf("%d records for %d requests", records, sent.Load())
	}
	t.Logf("%d records (%d unknown), %d predictions the apiserver did not give", records, unknown, wrong)
}

type state struct {
	goroutines, fds, queue, busy, shed int
	rss                                int64
}

// kproxyState reads kproxy's goroutines, replay queue and sheds from its
// metrics, and its open files and resident memory from /proc.
func kproxyState(t *testing.T, pid int, metricsAddr string) state {
	t.Helper()
	var s state
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "go_goroutines":
			s.goroutines = int(v)
		case "kproxy_replay_queue_depth":
			s.queue = int(v)
		case "kproxy_replay_workers_busy":
			s.busy = int(v)
		case `kproxy_replays_total{result="shed"}`:
			s.shed = int(v)
		case "process_resident_memory_bytes":
			s.rss = int64(v)
		}
	}
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		s.fds = len(ents)
	}
	return s
}

// scrapeSeries reads a metric's series from kproxy's /metrics, by their
// labels as Prometheus's text format writes them ({a="x",b="y"}).
func scrapeSeries(t *testing.T, metricsAddr, name string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	series := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 || !strings.HasPrefix(f[0], name) {
			continue
		}
		labels := strings.TrimPrefix(f[0], name)
		if labels != "" && labels[0] != '{' {
			continue // another metric, named longer
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		series[labels] = v
	}
	return series
}

// ensureNamespaceThrough creates a namespace through kproxy (201, or 409
// when it is there already).
func ensureNamespaceThrough(t *testing.T, send func(context.Context, string, string, string) (int, error), name string) {
	t.Helper()
	code, err := send(context.Background(), "POST", "/api/v1/namespaces", `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"`+name+`"}}`)
	if err != nil || (code != http.StatusCreated && code != http.StatusConflict) {
		t.Fatalf("create namespace %s: %d %v", name, code, err)
	}
}
