package proxy

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func TestParsePSITotal(t *testing.T) {
	cases := []struct {
		name, in string
		want     time.Duration
		err      string
	}{
		{"kernel format", "some avg10=1.50 avg60=0.99 avg300=2.94 total=2553696988\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", 2553696988 * time.Microsecond, ""},
		{"zero", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", 0, ""},
		{"no some line", "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", 0, `no "some" line`},
		{"no total", "some avg10=0.00 avg60=0.00 avg300=0.00\n", 0, "no total="},
		{"not a number", "some avg10=0.00 avg60=0.00 avg300=0.00 total=x\n", 0, `total="x"`},
		{"empty", "", 0, `no "some" line`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := parsePSITotal([]byte(c.in))
			switch {
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Fatalf("error %v, want one saying %q", err, c.err)
			case c.err == "" && err != nil:
				t.Fatal(err)
			case got != c.want:
				t.Errorf("total %v, want %v", got, c.want)
			}
		})
	}
}

// TestReadPSITotalOfThisMachine reads the kernel's own file where it has
// one: the format parsePSITotal expects is the one the kernel writes.
func TestReadPSITotalOfThisMachine(t *testing.T) {
	if _, err := os.Stat(PSIPath); err != nil {
		t.Logf("%s: %v (PSI off here: --replay-cpu-pressure then says so and is off)", PSIPath, err)
		return
	}
	if _, err := readPSITotal(PSIPath); err != nil {
		t.Fatalf("%s: %v", PSIPath, err)
	}
}

// fakePSI is a stall total the test moves.
type fakePSI struct {
	mu    sync.Mutex
	total time.Duration
	err   error
	reads int
}

func (f *fakePSI) read() (time.Duration, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	return f.total, f.err
}

func (f *fakePSI) stall(d time.Duration) { f.mu.Lock(); f.total += d; f.mu.Unlock() }

// TestCPUPressure: the share is the stall time over the time between two
// samples, sampled at most every pressureEvery; contended at or past the
// threshold; a failed read keeps the last share.
func TestCPUPressure(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	psi := &fakePSI{total: time.Hour}
	p, err := newCPUPressure(40, clk, psi.read)
	if err != nil || p == nil {
		t.Fatalf("newCPUPressure: %v, %v", p, err)
	}
	steps := []struct {
		advance, stall time.Duration
		fail           bool
		want           bool
		share          float64
	}{
		{advance: 50 * time.Millisecond, stall: 90 * time.Millisecond, want: false, share: 0},    // too soon to sample
		{advance: 450 * time.Millisecond, stall: 110 * time.Millisecond, want: true, share: 0.4}, // 200ms of 500ms: at the threshold
		{advance: 500 * time.Millisecond, stall: 300 * time.Millisecond, want: true, share: 0.6},
		{advance: 500 * time.Millisecond, stall: 100 * time.Millisecond, want: false, share: 0.2},
		{advance: 500 * time.Millisecond, stall: 0, fail: true, want: false, share: 0.2},
		{advance: 500 * time.Millisecond, stall: 2 * time.Second, want: true, share: 1}, // two CPUs stalled: at most all the time
		{advance: 10 * time.Second, stall: 2 * time.Second, want: false, share: 0.2},    // after a quiet spell, its average
		{advance: 200 * time.Millisecond, stall: 100 * time.Millisecond, want: true, share: 0.5},
	}
	for i, s := range steps {
		clk.SetTime(clk.Now().Add(s.advance))
		psi.stall(s.stall)
		psi.mu.Lock()
		psi.err = nil
		if s.fail {
			psi.err = errors.New("read failed")
		}
		psi.mu.Unlock()
		got := p.contended(clk.Now())
		if got != s.want || p.Share() != s.share {
			t.Errorf("step %d: contended %v, share %v; want %v, %v", i, got, p.Share(), s.want, s.share)
		}
	}
	if psi.reads != 8 { // the first (newCPUPressure) and one per sample taken, the too-soon one not
		t.Errorf("PSI read %d times, want 8", psi.reads)
	}

	if p, err := newCPUPressure(0, clk, psi.read); p != nil || err != nil {
		t.Errorf("threshold 0: %v, %v; want off (nil) without error", p, err)
	}
	if p, err := newCPUPressure(40, clk, func() (time.Duration, error) { return 0, errors.New("no PSI") }); p != nil || err == nil {
		t.Errorf("PSI unreadable: %v, %v; want off (nil) and why", p, err)
	}
	var off *cpuPressure
	if off.contended(clk.Now()) || off.Share() != 0 {
		t.Error("a nil (off) pressure is contended")
	}
}

// TestReplayPoolYieldsUnderCPUPressure: with more requests waiting for
// their answer than CPUs while the CPUs are contended, the pool runs one
// worker and rests between queued replays, as after a shed, though it
// shed nothing. Contention with few requests waiting (one client's, and
// kproxy's own replay) or many requests waiting on idle CPUs (a slow
// apiserver) is no reason to yield; and once the pressure falls, every
// worker runs again.
func TestReplayPoolYieldsUnderCPUPressure(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	psi := &fakePSI{}
	q := newReplayPool(2, 4, clk, nil)
	var err error
	if q.pressure, err = newCPUPressure(40, clk, psi.read); err != nil {
		t.Fatal(err)
	}
	var waiting atomic.Int64
	q.demand, q.cpus = waiting.Load, 2
	var mu sync.Mutex
	rests := 0
	q.rest = func(time.Duration) { mu.Lock(); rests++; mu.Unlock() }
	step := func(stall time.Duration, requests int64) {
		clk.SetTime(clk.Now().Add(time.Second / 2))
		psi.stall(stall)
		waiting.Store(requests)
		q.pressure.sample(clk.Now())
	}
	for _, c := range []struct {
		name      string
		stall     time.Duration
		requests  int64
		wantLimit int
	}{
		{"idle", 0, 0, 2},
		{"one client, CPUs contended", 300 * time.Millisecond, 1, 2},
		{"sixteen clients, CPUs idle", 50 * time.Millisecond, 16, 2},
		{"sixteen clients, CPUs contended", 350 * time.Millisecond, 16, 1},
	} {
		step(c.stall, c.requests)
		if got := q.limit(clk.Now()); got != c.wantLimit {
			t.Fatalf("%s: limit %d workers, want %d", c.name, got, c.wantLimit)
		}
	}
	gate := make(chan struct{})
	var done sync.WaitGroup
	job := func() { defer done.Done(); <-gate }
	done.Add(3)
	for range 3 {
		if !q.submit(job, false) {
			t.Fatal("shed within the pool's bounds")
		}
	}
	if st := q.stats(); st.Busy != 1 || st.Queued != 2 || st.Shed != 0 {
		t.Errorf("under CPU pressure: %d busy, %d queued, %d shed; want 1, 2, 0", st.Busy, st.Queued, st.Shed)
	}
	close(gate)
	done.Wait()
	poll(t, "the worker ends", func() bool { return q.stats().Busy == 0 })
	mu.Lock()
	if rests != 2 {
		t.Errorf("rested %d times under CPU pressure, want before each of the two queued replays", rests)
	}
	mu.Unlock()
	step(50*time.Millisecond, 16)
	if got := q.limit(clk.Now()); got != 2 {
		t.Errorf("limit once the pressure fell to 10%%: %d, want 2", got)
	}
}

// TestProxyCountsRequestsAnswering: the replay pool's demand counts the
// requests waiting for their answer, not the watches held open.
func TestProxyCountsRequestsAnswering(t *testing.T) {
	release := make(chan struct{})
	up := tlsUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-release
	})
	p, err := New(Config{Upstream: up.URL, Passthrough: up.Passthrough, WatchPassthrough: up.WatchPassthrough,
		ReplayCPUPressure: 40, CPUPressureTotal: (&fakePSI{}).read})
	if err != nil {
		t.Fatal(err)
	}
	if p.pool.demand == nil || p.pool.pressure == nil {
		t.Fatal("--replay-cpu-pressure given: the pool has no demand or pressure signal")
	}
	srv := httptest.NewServer(p)
	defer srv.Close()
	var wg sync.WaitGroup
	for _, path := range []string{
		"/api/v1/namespaces/a/configmaps/x",
		"/api/v1/namespaces/a/configmaps",
		"/api/v1/namespaces/a/configmaps?watch=true",
		"/api/v1/namespaces/a/pods/p/log",
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Get(srv.URL + path)
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	poll(t, "two requests answering", func() bool { return p.pool.demand() == 2 })
	close(release)
	wg.Wait()
	poll(t, "no request answering", func() bool { return p.pool.demand() == 0 })
}
