package proxy

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kproxy/kproxy/internal/metrics"
)

// TestBurstReaper: a burst (burstInFlight requests at once) starts one
// watcher, which closes the idle connections once two looks in a row
// find no more than a quarter of that in flight, and returns memory to
// the OS at most once per freeEvery; traffic below the burst size
// starts nothing.
func TestBurstReaper(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	var closed, freed atomic.Int64
	r := &burstReaper{clock: clk, closeIdle: func() { closed.Add(1) }, freeMemory: func() { freed.Add(1) }}
	step := func() { t.Helper(); look(t, clk, r) }

	for range burstInFlight - 1 {
		r.begin()
	}
	if r.watching.Load() {
		t.Fatalf("%d requests in flight started a watcher; want none below %d", burstInFlight-1, burstInFlight)
	}
	w := clk.Waiters()
	r.begin() // the burst
	if !r.watching.Load() {
		t.Fatalf("%d requests in flight: no watcher", burstInFlight)
	}
	ticking(t, clk, w)
	for range burstInFlight - burstInFlight/4 - 1 {
		r.end()
	}
	// burstInFlight/4 + 1 still in flight: the burst goes on.
	step()
	step()
	step()
	if closed.Load() != 0 {
		t.Fatalf("idle connections closed with %d requests in flight", r.inFlight.Load())
	}
	r.end() // a quarter left
	step()
	if closed.Load() != 0 {
		t.Fatal("idle connections closed after one quiet look; want two in a row")
	}
	step()
	poll(t, "the burst's end closes the idle connections", func() bool { return r.reaped.Load() == 1 })
	if closed.Load() != 1 || freed.Load() != 1 {
		t.Fatalf("after the first burst: idle closed %d times, memory freed %d times; want 1 and 1", closed.Load(), freed.Load())
	}
	poll(t, "the watcher ends", func() bool { return !r.watching.Load() })

	// A second burst at once: its idle connections are closed, the
	// memory is not freed again within freeEvery.
	w = clk.Waiters()
	for range burstInFlight {
		r.begin()
	}
	ticking(t, clk, w)
	for range burstInFlight {
		r.end()
	}
	step()
	step()
	poll(t, "the second burst's end", func() bool { return r.reaped.Load() == 2 })
	if closed.Load() != 2 || freed.Load() != 1 {
		t.Fatalf("after the second burst: idle closed %d times, memory freed %d times; want 2 and 1", closed.Load(), freed.Load())
	}
}

// TestBurstReaperNoTransport: transports not configured (nil, or a nil
// *http.Transport in the interface) are skipped, not called.
func TestBurstReaperNoTransport(t *testing.T) {
	var none *http.Transport
	newBurstReaper(clocktesting.NewFakeClock(time.Now()), none, nil).closeIdle()
}

// TestBurstClosesUpstreamConnections: through the proxy, the upstream
// connections a burst opened are closed once it is over (not 30s later),
// and those of fewer requests at once are kept for the next ones.
func TestBurstClosesUpstreamConnections(t *testing.T) {
	var open, arrived atomic.Int64
	release := make(chan struct{})
	var gate sync.Mutex
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gate.Lock()
		ch := release
		gate.Unlock()
		arrived.Add(1)
		<-ch
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x"}}`)
	}))
	upstream.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	upstream.StartTLS()
	up := upstreamOf(t, upstream)
	clk := clocktesting.NewFakeClock(time.Now())
	reg := prometheus.NewRegistry()
	p, err := New(Config{Upstream: up.URL, Passthrough: up.Passthrough, WatchPassthrough: up.WatchPassthrough, Clock: clk, Metrics: metrics.New(reg)})
	if err != nil {
		t.Fatal(err)
	}
	p.burst.freeMemory = func() {} // the process's memory is the test binary's
	srv := httptest.NewServer(p)
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * burstInFlight, TLSClientConfig: &tls.Config{}}}
	defer client.CloseIdleConnections()

	burst := func(n int) {
		t.Helper()
		gate.Lock()
		release = make(chan struct{})
		gate.Unlock()
		arrived.Store(0)
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				resp, err := client.Get(srv.URL + "/api/v1/namespaces/a/configmaps/x")
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			})
		}
		// Each on a connection of its own: all waiting upstream at once.
		poll(t, "every request upstream", func() bool { return arrived.Load() == int64(n) })
		if got := gauge(t, reg, "kproxy_requests_in_flight", "", ""); got != float64(n) {
			t.Fatalf("kproxy_requests_in_flight = %v; want %d", got, n)
		}
		gate.Lock()
		close(release)
		gate.Unlock()
		wg.Wait()
		poll(t, "every relay over", func() bool { return p.burst.inFlight.Load() == 0 })
	}

	// Ten at once: their ten connections stay for the next requests.
	burst(10)
	if n := open.Load(); n != 10 {
		t.Fatalf("after 10 requests at once: %d upstream connections open; want 10", n)
	}
	clk.Step(time.Second)
	if n := open.Load(); n != 10 || p.burst.watching.Load() {
		t.Fatalf("a second after 10 requests at once: %d upstream connections open (want 10, kept idle), watcher %v", n, p.burst.watching.Load())
	}

	// A burst: its connections are closed within two looks after it.
	w := clk.Waiters()
	burst(burstInFlight + 8)
	ticking(t, clk, w)
	if n := open.Load(); n < burstInFlight {
		t.Fatalf("after a burst of %d: %d upstream connections open; want at least %d", burstInFlight+8, n, burstInFlight)
	}
	look(t, clk, p.burst)
	look(t, clk, p.burst)
	poll(t, "the upstream connections closed after the burst", func() bool { return open.Load() == 0 })
	if got := gauge(t, reg, "kproxy_upstream_idle_closes_total", "", ""); got != 1 {
		t.Fatalf("kproxy_upstream_idle_closes_total = %v; want 1", got)
	}
}

// look moves the clock to the watcher's next tick and waits until it
// has looked (a fake ticker drops a tick its reader has not taken yet).
func look(t *testing.T, clk *clocktesting.FakeClock, r *burstReaper) {
	t.Helper()
	n := r.looks.Load()
	clk.Step(burstTick)
	poll(t, "the watcher looks", func() bool { return r.looks.Load() > n || !r.watching.Load() })
}

// ticking waits for the watcher's ticker: one waiter more on the clock
// than before the burst (a fake ticker stays a waiter once stopped).
func ticking(t *testing.T, clk *clocktesting.FakeClock, before int) {
	t.Helper()
	poll(t, "the watcher's ticker", func() bool { return clk.Waiters() > before })
}
