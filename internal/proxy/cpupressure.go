package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// The replay pool's second overload signal is CPU contention: more
// requests waiting for their answer through kproxy than it has CPUs,
// while some task on the machine waited for a CPU a good share of the
// time (Linux PSI, the "some" line of /proc/pressure/cpu). A pool whose
// replays keep up never sheds, so by the first signal alone it replayed
// at full speed while sixteen clients were short of CPU: its replays took
// half of it, and forwarding ran at 0.47x of direct. kproxy usually
// shares the node with the apiserver and etcd, whose time is the
// cluster's: then the pool replays as it does after a shed (one worker,
// resting), and the requests it cannot replay are shed, recorded unknown.
//
// Pressure alone does not tell a busy proxy: one client's GETs through
// kproxy on 2 CPUs kept it at 50% to 60% (client, kproxy, its replay,
// the apiserver and etcd take turns), sixteen clients' at 55% to 80%.
// What tells them apart is the requests waiting: one, or sixteen. A slow
// apiserver with many requests waiting but idle CPUs is not contention
// either: kproxy then replays everything.
//
// The share is measured over the last sampling interval, read at most
// every pressureEvery by whichever caller finds it stale (no goroutine
// of its own), so a burst is seen within a tenth of a second and an
// idle kproxy reads nothing.

// DefaultReplayCPUPressure is the default --replay-cpu-pressure: the
// share of time (percent) tasks may wait for a CPU, with more requests
// waiting than CPUs, before the replay yields.
const DefaultReplayCPUPressure = 40

// pressureEvery is how often the pressure is sampled, at most.
// Reading the file costs microseconds: ten times a second is nothing,
// and a replay pool that yields a tenth of a second late has let a
// hundred replays through on 2 CPUs.
const pressureEvery = 100 * time.Millisecond

// PSIPath is where Linux reports CPU pressure (since 4.20, with PSI on).
const PSIPath = "/proc/pressure/cpu"

// cpuPressure tells whether the machine's CPUs are contended past a
// threshold. A nil *cpuPressure is never contended (the signal is off).
type cpuPressure struct {
	threshold float64 // a share of time, 0 to 1
	// total reads PSI's cumulative "some" stall time.
	total func() (time.Duration, error)

	sampling  sync.Mutex // held by the caller that samples; others use the last share
	lastAt    time.Time
	lastTotal time.Duration
	share     atomic.Uint64 // math.Float64bits of the last share
}

// newCPUPressure returns the signal with threshold percent, reading PSI
// with total; nil (off) when percent is 0 or PSI cannot be read, with
// why.
func newCPUPressure(percent float64, clk clock.PassiveClock, total func() (time.Duration, error)) (*cpuPressure, error) {
	if percent <= 0 {
		return nil, nil
	}
	t, err := total()
	if err != nil {
		return nil, err
	}
	return &cpuPressure{threshold: percent / 100, total: total, lastAt: clk.Now(), lastTotal: t}, nil
}

// contended reports whether the share of time tasks waited for a CPU,
// over the last sample, is at or past the threshold.
func (p *cpuPressure) contended(now time.Time) bool {
	if p == nil {
		return false
	}
	p.sample(now)
	return math.Float64frombits(p.share.Load()) >= p.threshold
}

// Share is the last sampled share of time tasks waited for a CPU.
func (p *cpuPressure) Share() float64 {
	if p == nil {
		return 0
	}
	return math.Float64frombits(p.share.Load())
}

// sample reads PSI when the last sample is pressureEvery old; a caller
// that finds another sampling goes on with the last share.
func (p *cpuPressure) sample(now time.Time) {
	if !p.sampling.TryLock() {
		return
	}
	defer p.sampling.Unlock()
	elapsed := now.Sub(p.lastAt)
	if elapsed < pressureEvery {
		return
	}
	t, err := p.total()
	if err != nil {
		return // the last share stands; PSI read once does not vanish
	}
	// After a quiet spell (few requests waiting: nothing sampled) the
	// share spans it: the machine's, all the same, and the next sample
	// is a tenth of a second away.
	share := float64(t-p.lastTotal) / float64(elapsed)
	p.lastAt, p.lastTotal = now, t
	p.share.Store(math.Float64bits(min(max(share, 0), 1)))
}

// readPSITotal reads the "some" stall total of a PSI file (microseconds:
// "some avg10=0.00 avg60=0.00 avg300=0.00 total=12345").
func readPSITotal(path string) (time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return parsePSITotal(b)
}

func parsePSITotal(b []byte) (time.Duration, error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	if !bytes.HasPrefix(line, []byte("some ")) {
		return 0, errors.New(`no "some" line`)
	}
	_, v, ok := bytes.Cut(line, []byte("total="))
	if !ok {
		return 0, errors.New(`no total= on its "some" line`)
	}
	us, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("total=%q: %w", v, err)
	}
	return time.Duration(us) * time.Microsecond, nil
}
