package servertrace

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kproxy/kproxy/internal/record"
)

// collect is a sink that remembers what it got.
type collect struct {
	mu   sync.Mutex
	recs []*record.Record
	got  chan *record.Record
}

func newCollect() *collect { return &collect{got: make(chan *record.Record, 100)} }

func (c *collect) Write(r *record.Record) {
	c.mu.Lock()
	c.recs = append(c.recs, r)
	c.mu.Unlock()
	c.got <- r
}

func (c *collect) n() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.recs)
}

// next waits for the next record written (the sweeper runs in its own
// goroutine).
func (c *collect) next(t *testing.T) *record.Record {
	t.Helper()
	select {
	case r := <-c.got:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("no record written")
		return nil
	}
}

func (c *collect) none(t *testing.T) {
	t.Helper()
	select {
	case r := <-c.got:
		t.Fatalf("record %s written, want it held", r.ID)
	case <-time.After(20 * time.Millisecond):
	}
}

func rec(id, auditID, traceID string) *record.Record {
	return &record.Record{ID: id, TraceID: traceID, Actual: record.Actual{Status: 200, AuditID: auditID},
		Latency: record.Latency{TotalNs: 10, UpstreamNs: 9}}
}

func obs(auditID, traceID string, links ...string) Observation {
	return Observation{AuditID: auditID, TraceID: traceID, Links: links,
		Server: record.Server{Source: record.ServerFromTrace, TraceID: traceID, TotalNs: 7, Summary: "7 ns: " + auditID}}
}

func newTestJoiner(t *testing.T, opts JoinOptions) (*Joiner, *collect, *clocktesting.FakeClock) {
	t.Helper()
	c := newCollect()
	fc := clocktesting.NewFakeClock(t0)
	opts.Clock = fc
	j := NewJoiner(c, opts)
	t.Cleanup(j.Close)
	return j, c, fc
}

// step moves the fake clock on once the sweeper waits on its ticker.
func step(t *testing.T, fc *clocktesting.FakeClock, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !fc.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("the joiner's sweeper is not waiting on the clock")
		}
		time.Sleep(time.Millisecond)
	}
	fc.Step(d)
}

func TestJoinByAuditID(t *testing.T) {
	j, c, _ := newTestJoiner(t, JoinOptions{Wait: time.Second})
	r := rec("r1", "audit-1", "kproxytrace1")
	j.Write(r)
	c.none(t)
	j.Offer(obs("audit-1", "apiservertrace1"))
	got := c.next(t)
	if got != r || got.Server == nil || got.Server.Summary != "7 ns: audit-1" || got.Latency.ServerNs != 7 {
		t.Fatalf("joined record: %+v server %+v", got, got.Server)
	}
	if s := j.Stats(); s.Matched != 1 || s.Held != 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestJoinByTraceLinkAndByTraceID(t *testing.T) {
	j, c, _ := newTestJoiner(t, JoinOptions{Wait: time.Second})
	// Linked: the apiserver's own trace links kproxy's.
	j.Write(rec("linked", "audit-x", "kproxy-linked"))
	j.Offer(obs("", "apiserver-own", "kproxy-linked"))
	if got := c.next(t); got.ID != "linked" || got.Server == nil {
		t.Fatalf("linked: %+v", got)
	}
	// Continued: one trace.
	j.Write(rec("continued", "audit-y", "one-trace"))
	j.Offer(obs("", "one-trace", "one-trace"))
	if got := c.next(t); got.ID != "continued" || got.Server == nil {
		t.Fatalf("continued: %+v", got)
	}
}

// TestJoinManyRequestsUnderOneTrace: a traced client sends several
// requests under one trace; each observation goes to its own record by
// audit ID, and a trace match never contradicts an audit ID.
func TestJoinManyRequestsUnderOneTrace(t *testing.T) {
	j, c, _ := newTestJoiner(t, JoinOptions{Wait: time.Second})
	j.Write(rec("first", "audit-1", "client-trace"))
	j.Write(rec("second", "audit-2", "client-trace"))
	j.Offer(obs("audit-2", "client-trace", "client-trace"))
	if got := c.next(t); got.ID != "second" {
		t.Fatalf("audit-2's observation joined %s", got.ID)
	}
	j.Offer(obs("audit-3", "client-trace", "client-trace")) // neither record's
	c.none(t)
	j.Offer(obs("audit-1", "client-trace", "client-trace"))
	if got := c.next(t); got.ID != "first" {
		t.Fatalf("audit-1's observation joined %s", got.ID)
	}
}

func TestJoinTruncatedAuditID(t *testing.T) {
	j, c, _ := newTestJoiner(t, JoinOptions{Wait: time.Second})
	long := strings.Repeat("x", 100)
	j.Write(rec("r", long, "t"))
	j.Offer(obs(long[:64], "other"))
	if got := c.next(t); got.Server == nil {
		t.Fatal("not joined by the apiserver's truncated audit ID")
	}
}

func TestObservationBeforeRecord(t *testing.T) {
	j, c, _ := newTestJoiner(t, JoinOptions{Wait: time.Second})
	j.Offer(obs("early", "t1"))
	r := rec("r", "early", "k1")
	j.Write(r) // written at once: its observation is there
	if c.n() != 1 || r.Server == nil {
		t.Fatalf("early observation: %d written, server %+v", c.n(), r.Server)
	}
	if s := j.Stats(); s.Early != 1 || s.Matched != 1 {
		t.Errorf("stats %+v", s)
	}
}

func TestRecordWaitsAtMostWait(t *testing.T) {
	j, c, fc := newTestJoiner(t, JoinOptions{Wait: time.Second})
	r := rec("r", "late", "k")
	j.Write(r)
	step(t, fc, 500*time.Millisecond)
	c.none(t)
	step(t, fc, 600*time.Millisecond)
	if got := c.next(t); got != r || got.Server != nil {
		t.Fatalf("timed-out record: %+v", got)
	}
	// Its observation comes too late: kept a while, then forgotten.
	j.Offer(obs("late", "t"))
	c.none(t)
	step(t, fc, 1100*time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for j.Stats().Unmatched != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v", j.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	if s := j.Stats(); s.TimedOut != 1 || s.Matched != 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestPassThrough(t *testing.T) {
	j, c, _ := newTestJoiner(t, JoinOptions{Wait: time.Hour})
	noUpstream := rec("kproxy-answered", "a1", "t1")
	noUpstream.Latency.UpstreamNs = 0
	unauthorized := rec("401", "a2", "t2")
	unauthorized.Actual.Status = 401
	rerun := rec("rerun", "a3", "t3")
	rerun.RerunOf = "x"
	failed := rec("502", "a4", "t4")
	failed.Actual.Error = "kproxy could not reach the apiserver"
	for _, r := range []*record.Record{noUpstream, unauthorized, rerun, failed} {
		j.Write(r)
		if got := c.next(t); got != r {
			t.Fatalf("%s held", r.ID)
		}
	}
	if s := j.Stats(); s.PassedThrough != 4 {
		t.Errorf("stats %+v", s)
	}
}

// TestMinUpstream: with audit annotations as the only account, a request
// the apiserver answered faster than they are written for passes at once;
// a slower one waits.
func TestMinUpstream(t *testing.T) {
	j, c, _ := newTestJoiner(t, JoinOptions{Wait: time.Hour, MinUpstream: 500 * time.Millisecond})
	fast := rec("fast", "a1", "t1")
	fast.Latency.UpstreamNs = int64(500 * time.Millisecond)
	j.Write(fast)
	if got := c.next(t); got != fast {
		t.Fatalf("%s held", got.ID)
	}
	slow := rec("slow", "a2", "t2")
	slow.Latency.UpstreamNs = int64(700 * time.Millisecond)
	j.Write(slow)
	c.none(t)
	j.Offer(obs("a2", "t2"))
	if got := c.next(t); got != slow || got.Server == nil {
		t.Fatalf("the slow record: %+v", got)
	}
}

func TestMaxHeld(t *testing.T) {
	j, c, _ := newTestJoiner(t, JoinOptions{Wait: time.Hour, MaxHeld: 2})
	j.Write(rec("1", "a1", "t1"))
	j.Write(rec("2", "a2", "t2"))
	c.none(t)
	j.Write(rec("3", "a3", "t3"))
	if got := c.next(t); got.ID != "3" {
		t.Fatalf("past MaxHeld: %s written", got.ID)
	}
	// Observations are bounded too: the oldest goes.
	for i := range 5 {
		j.Offer(obs("x"+string(rune('0'+i)), "tx"))
	}
	if s := j.Stats(); s.Overflowed != 1 || s.Held != 2 || s.Unmatched != 3 {
		t.Errorf("stats %+v", s)
	}
}

func TestCloseWritesEverythingHeld(t *testing.T) {
	c := newCollect()
	j := NewJoiner(c, JoinOptions{Wait: time.Hour})
	j.Write(rec("1", "a1", "t1"))
	j.Write(rec("2", "a2", "t2"))
	j.Close()
	if c.n() != 2 {
		t.Fatalf("%d written at Close, want 2", c.n())
	}
	j.Write(rec("3", "a3", "t3")) // after Close: straight through
	if c.n() != 3 {
		t.Fatal("a record written after Close was held")
	}
	j.Close()
}

// TestWriteNeverBlocks: the next sink may be slow; Write only files.
func TestWriteNeverBlocks(t *testing.T) {
	block := make(chan struct{})
	slow := sinkFunc(func(*record.Record) { <-block })
	j := NewJoiner(slow, JoinOptions{Wait: time.Hour})
	defer func() { close(block); j.Close() }()
	done := make(chan struct{})
	go func() {
		for i := range 1000 {
			j.Write(rec(string(rune(i)), "", ""))
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Write blocked")
	}
}

type sinkFunc func(*record.Record)

func (f sinkFunc) Write(r *record.Record) { f(r) }

func TestConcurrentJoins(t *testing.T) {
	c := &countSink{}
	j := NewJoiner(c, JoinOptions{Wait: time.Minute})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := range 500 {
				j.Write(rec("r", id(g, i), "k"+id(g, i)))
			}
		}()
		go func() {
			defer wg.Done()
			for i := range 500 {
				j.Offer(obs(id(g, i), "s"+id(g, i)))
			}
		}()
	}
	wg.Wait()
	j.Close()
	if c.n.Load() != 4000 || c.joined.Load() != 4000 {
		t.Errorf("written %d, joined %d; want 4000 each (stats %+v)", c.n.Load(), c.joined.Load(), j.Stats())
	}
}

func id(g, i int) string {
	return string(rune('a'+g)) + "-" + strings.Repeat("i", i%7) + string(rune(i))
}

type countSink struct{ n, joined atomic.Int64 }

func (c *countSink) Write(r *record.Record) {
	c.n.Add(1)
	if r.Server != nil {
		c.joined.Add(1)
	}
}
