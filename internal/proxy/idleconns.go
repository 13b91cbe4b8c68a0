package proxy

import (
	"net/http"
	"runtime/debug"
	"sync/atomic"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/utils/clock"
)

// After a burst, kproxy hands its upstream connections back at once.
//
// The upstream pool keeps up to 512 idle connections per host for 30s
// (upstream.go), so that a burst reuses connections instead of opening
// a TLS connection per request. Once the burst is over, that pool is
// what it leaves behind: after 512 requests in flight, about 1000
// goroutines (each connection's read and write loops), their buffers
// and TLS state in kproxy, and as many idle connections held open on an
// apiserver that may be the one in trouble. The overload bench saw
// kproxy's goroutines back to their baseline only 17 to 32 seconds after
// the load, and its RSS up to two minutes after.
//
// burstReaper watches the number of requests being forwarded. Once it
// has reached burstInFlight, a goroutine (the only one, and only until
// the burst is over) looks every burstTick; after two looks in a row
// with no more than a quarter of that in flight, it closes the idle
// connections of every upstream transport and returns the memory the
// burst left free to the OS. Ordinary traffic never gets there: fewer
// than burstInFlight requests at once keep their pool as it is, timed
// out idle after 30s.
type burstReaper struct {
	inFlight  atomic.Int64
	watching  atomic.Bool
	clock     clock.WithTicker
	closeIdle func()
	// freeMemory returns freed memory to the OS (debug.FreeOSMemory).
	freeMemory func()
	// freedAt is when freeMemory last ran: a forced collection costs
	// CPU in proportion to the live heap, so it runs at most once per
	// freeEvery, however often bursts come and go.
	freedAt atomic.Int64 // UnixNano; 0: never
	// looks and reaped count the watcher's looks (tests read them) and
	// the bursts ended (kproxy_upstream_idle_closes_total).
	looks, reaped atomic.Int64
}

const (
	// burstInFlight is the concurrency that leaves enough idle
	// connections behind to be worth closing early (a hundred
	// goroutines, a few MiB): well past a controller's or a CI job's
	// handful, reached by a thundering herd or a load test.
	burstInFlight = 64
	// burstTick is how often the reaper looks while a burst lasts.
	burstTick = 500 * time.Millisecond
	// freeEvery bounds how often a burst's end returns memory to the
	// OS: a load that keeps rising and falling costs a collection per
	// ten seconds at most (tens of milliseconds of CPU for a heap of
	// 100 MiB), not one per burst.
	freeEvery = 10 * time.Second
)

// newBurstReaper closes the idle connections of the given transports
// (nil ones skipped) once a burst is over.
func newBurstReaper(c clock.PassiveClock, transports ...http.RoundTripper) *burstReaper {
	tc, ok := c.(clock.WithTicker)
	if !ok {
		tc = clock.RealClock{}
	}
	return &burstReaper{
		clock: tc,
		closeIdle: func() {
			for _, t := range transports {
				if tr, ok := t.(*http.Transport); t == nil || (ok && tr == nil) {
					continue // none configured (a nil in an interface too)
				}
				utilnet.CloseIdleConnectionsFor(t)
			}
		},
		freeMemory: debug.FreeOSMemory,
	}
}

// begin counts a request forwarded; end must follow.
func (r *burstReaper) begin() {
	if r.inFlight.Add(1) >= burstInFlight && !r.watching.Load() && r.watching.CompareAndSwap(false, true) {
		go r.watch()
	}
}

func (r *burstReaper) end() { r.inFlight.Add(-1) }

// watch waits for the burst to end, then closes what it left idle.
func (r *burstReaper) watch() {
	defer r.watching.Store(false)
	t := r.clock.NewTicker(burstTick)
	defer t.Stop()
	quiet := 0
	for range t.C() {
		r.looks.Add(1)
		if r.inFlight.Load() > burstInFlight/4 {
			quiet = 0
			continue
		}
		if quiet++; quiet < 2 {
			continue
		}
		r.closeIdle()
		if now, last := r.clock.Now(), r.freedAt.Load(); last == 0 || now.Sub(time.Unix(0, last)) >= freeEvery {
			r.freedAt.Store(now.UnixNano())
			r.freeMemory()
		}
		r.reaped.Add(1)
		return
	}
}
