package proxy

import (
	"runtime"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/stages"
)

// Replays run in a bounded pool: at most `workers` at once, at most
// `queue` more waiting for a worker. Past both, a replay is shed: the
// request was forwarded all the same (forwarding never waits for a
// replay) and its record is written all the same, with the prediction
// unknown (ShedMessage). So under a load the replay cannot keep up with,
// kproxy's goroutines and memory stay bounded (one goroutine per replay
// made 3,900 of them and tripled the RSS under 32 clients), and a replay
// never starves into its budget and guesses.
//
// Workers come and go with the work: a worker starts when a replay is
// submitted and fewer than `workers` run, takes the queued replays one
// after the other, and once the queue is empty waits up to workerLinger
// for the next before it ends. The wait keeps a busy proxy's workers (and
// the stacks they have grown through the apiserver's handler: regrowing
// one from scratch for every replay was 5% of a GET's CPU) while an idle
// proxy holds no replay goroutine a moment later.

// ShedMessage is the prediction's message on the record of a request
// whose replay was shed.
const ShedMessage = "replay shed: kproxy is over its replay budget"

// ShedBodyMessage is the prediction's message on the record of a write
// whose body was not kept for its replay: the bodies held for replays were
// at their bound (Config.ReplayBodyBudget).
const ShedBodyMessage = "replay shed: kproxy is over its replay budget (the request bodies held for replay are at --replay-body-budget-mib)"

// replayQueuePerWorker sizes the default queue: a short burst waits
// rather than being shed (32 clients with one request each on a 2-core
// machine), while what waits (a copy of each request, its body up to
// the apiserver's 3 MiB limit) stays bounded.
const replayQueuePerWorker = 16

// DefaultReplayWorkers is the default bound on the replays run at once:
// one per CPU Go schedules on (GOMAXPROCS). A replay runs the apiserver's
// own code and is mostly CPU: more workers than CPUs only share them.
// Fewer starve fidelity instead: with one worker on 2 CPUs, a write's
// replay waited behind a large read's (an OpenAPI document) until the
// next kubectl command had changed the object. Under overload one worker
// replays, resting between replays (see work), which leaves forwarding
// the CPU it needs then.
func DefaultReplayWorkers() int { return max(1, runtime.GOMAXPROCS(0)) }

// DefaultReplayBodyBudget is the default bound on the request body bytes
// held for replays at once: about ten writes at the apiserver's 3 MiB
// body limit, while a small write (a few KiB) is never refused for it.
// What a replay's decoding adds on top is bounded by the workers.
const DefaultReplayBodyBudget = 32 << 20

// DefaultReplayQueue is the default bound on the replays waiting for a
// worker, for that many workers.
func DefaultReplayQueue(workers int) int { return replayQueuePerWorker * max(1, workers) }

// overloadWindow is how long after a shed the pool counts as overloaded;
// while it is, a worker rests restPerRun times as long as its replay ran
// (replays of up to maxRest/restPerRun, nearly all, then take at most a
// tenth of one CPU), at most maxRest (a replay held up by a slow webhook
// or a slow read is mostly waiting, not CPU, and its time is wall time):
// still a few predictions a second, the rest said unknown. At a quarter
// of a CPU (restPerRun 3, maxRest 50ms) the replays and their spans were
// 60 of the 130 µs more that a kproxy with replay spent per forwarded
// request under overload than one without, and forwarding kept 0.83x to
// 0.85x of its throughput (issue 16 wants 0.90x).
const (
	overloadWindow = time.Second
	restPerRun     = 10
	maxRest        = 200 * time.Millisecond
	workerLinger   = time.Second
)

// replayPool runs replays on at most workers goroutines, with a queue of
// at most capacity replays waiting.
type replayPool struct {
	workers  int
	capacity int
	clock    clock.PassiveClock
	m        *metrics.Metrics
	// nice, when over 0, is the nice value of the workers' threads
	// (replaynice_linux.go): the replays then yield the CPU to the
	// apiserver, etcd and forwarding whenever those want it.
	nice int

	// rest pauses a worker (time.Sleep; tests inject their own).
	rest func(time.Duration)
	// pressure, when on, tells when the machine's CPUs are contended;
	// demand is how many requests wait for their answer through kproxy.
	// With more of them than CPUs, and the CPUs contended, the pool is
	// overloaded as after a shed (see cpupressure.go).
	pressure *cpuPressure
	demand   func() int64
	cpus     int64

	mu       sync.Mutex
	lastShed time.Time // when a replay was last shed: the pool is overloaded
	running  int       // worker goroutines alive, busy or idle
	// idle workers wait on handoff for their next replay; submit hands
	// one over (idle counts those not yet handed one).
	idle    int
	handoff chan queuedReplay
	// Two queues, at most capacity replays in both: writes, whose replay
	// reads the state the write met, go first; a write replayed behind
	// reads may find the object changed by a later write, and can then
	// only say unknown.
	urgent, queue []queuedReplay
	n             int // len(urgent) + len(queue)
	shed          uint64
	ran           uint64
}

type queuedReplay struct {
	run func()
	at  time.Time // when it was submitted
}

// replayPoolStats is a snapshot of the pool.
type replayPoolStats struct {
	Workers, Capacity int // the bounds
	Busy, Queued      int
	Ran, Shed         uint64
}

func newReplayPool(workers, capacity int, clk clock.PassiveClock, m *metrics.Metrics) *replayPool {
	if workers <= 0 {
		workers = DefaultReplayWorkers()
	}
	if capacity <= 0 {
		capacity = DefaultReplayQueue(workers)
	}
	m.ReplayPool(workers, capacity)
	return &replayPool{workers: workers, capacity: capacity, clock: clk, m: m, rest: time.Sleep, cpus: int64(runtime.GOMAXPROCS(0)),
		handoff: make(chan queuedReplay, workers)}
}

// submit runs run on a worker, now or once one is free (before the
// queued replays that are not urgent, when it is), and reports true; or,
// when every worker is busy and the queue is full, sheds it and reports
// false. It never blocks.
func (q *replayPool) submit(run func(), urgent bool) bool {
	job := queuedReplay{run: run, at: q.clock.Now()}
	q.mu.Lock()
	free := q.running-q.idle < q.limit(job.at)
	switch {
	case free && q.idle > 0:
		q.idle--
		q.handoff <- job // never blocks: it holds at most the idle workers' jobs
		q.mu.Unlock()
		return true
	case free && q.running < q.workers:
		q.running++
		q.mu.Unlock()
		go q.work(job)
		return true
	case q.n == q.capacity:
		q.shed++
		q.lastShed = job.at
		q.mu.Unlock()
		q.m.ReplayShed()
		return false
	}
	if urgent {
		q.urgent = append(q.urgent, job)
	} else {
		q.queue = append(q.queue, job)
	}
	q.n++
	q.mu.Unlock()
	q.m.ReplayQueued(1)
	return true
}

// work runs job, then the queued replays, and ends when none is left.
// Taking the next replay and ending are decided under the lock that
// submit queues under, so a replay is never queued just as the last
// worker leaves.
//
// While the pool is overloaded (it shed a replay within overloadWindow, or
// more requests wait for kproxy than it has CPUs, which are contended),
// one worker replays, and it rests restPerRun times as long as its replay
// ran before it takes the next: the replays then use at most a tenth of a
// CPU, and the rest goes to forwarding (and to the apiserver, on a shared
// machine), which is short of CPU exactly then. More replays are shed,
// and said unknown.
func (q *replayPool) work(job queuedReplay) {
	if q.nice > 0 {
		// Never unlocked: the thread ends with the worker.
		_ = lowerThreadPriority(q.nice)
	}
	var idle *time.Timer // the worker's linger timer, made once and reset
	for {
		q.m.ReplayStarted(q.clock.Since(job.at))
		began := q.clock.Now()
		job.run()
		ran := q.clock.Since(began)
		q.m.ReplayFinished()
		q.mu.Lock()
		q.ran++
		now := q.clock.Now()
		if q.running-q.idle > q.limit(now) {
			// Overloaded: one busy worker goes on, the others end.
			q.running--
			q.mu.Unlock()
			return
		}
		if q.n > 0 && q.overloaded(now) {
			q.mu.Unlock()
			q.rest(min(restPerRun*ran, maxRest))
			q.mu.Lock()
		}
		if q.n == 0 {
			var ok bool
			if job, ok = q.linger(&idle); !ok {
				return
			}
			continue
		}
		from := &q.queue
		if len(q.urgent) > 0 {
			from = &q.urgent
		}
		job = (*from)[0]
		(*from)[0] = queuedReplay{} // the replay's request can go
		*from = (*from)[1:]
		if len(*from) == 0 {
			*from = nil // and so can the array under it
		}
		q.n--
		q.mu.Unlock()
		q.m.ReplayQueued(-1)
	}
}

// linger waits, q.mu held on entry and released, up to workerLinger for
// a replay submit hands over; false: none came, and the worker ends. t is
// the worker's timer: one per worker, not one per replay.
func (q *replayPool) linger(t **time.Timer) (queuedReplay, bool) {
	q.idle++
	q.mu.Unlock()
	if *t == nil {
		*t = time.NewTimer(workerLinger)
	} else {
		(*t).Reset(workerLinger) // stopped or fired and drained (Go 1.23 timers)
	}
	select {
	case job := <-q.handoff:
		(*t).Stop()
		return job, true
	case <-(*t).C:
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	// A replay handed over as the wait ended is taken all the same: submit
	// counted it against this worker or another one still waiting.
	select {
	case job := <-q.handoff:
		return job, true
	default:
	}
	q.idle--
	q.running--
	return queuedReplay{}, false
}

// overloaded reports a shed within overloadWindow of now, or more
// requests waiting for their answer than CPUs while the CPUs are
// contended past --replay-cpu-pressure; q.mu is held.
func (q *replayPool) overloaded(now time.Time) bool {
	if !q.lastShed.IsZero() && now.Sub(q.lastShed) < overloadWindow {
		return true
	}
	return q.demand != nil && q.demand() > q.cpus && q.pressure.contended(now)
}

// limit is how many workers may run now: all of them, or one while the
// pool is overloaded; q.mu is held.
func (q *replayPool) limit(now time.Time) int {
	if q.overloaded(now) {
		return 1
	}
	return q.workers
}

func (q *replayPool) stats() replayPoolStats {
	q.mu.Lock()
	defer q.mu.Unlock()
	return replayPoolStats{Workers: q.workers, Capacity: q.capacity, Busy: q.running - q.idle, Queued: q.n, Ran: q.ran, Shed: q.shed}
}

// shedOutcome is the replay's outcome when it was shed: unknown, every
// stage skipped (not replayed), as the contract wants all nine. Under
// overload nearly every request is shed, so the two outcomes are built
// once and shared by their records, which nothing changes once written
// (the stages' slice is full: an append copies).
func shedOutcome(msg string) stages.Outcome {
	return unreplayed(msg, "not replayed: "+msg)
}

// unreplayed is an outcome with nothing replayed: the prediction unknown
// (msg), every stage skipped (why).
func unreplayed(msg, why string) stages.Outcome {
	o := stages.Outcome{Predicted: record.Prediction{Stage: record.StageUnknown, Message: msg}}
	o.Stages = make([]record.StageResult, 0, len(record.StageOrder))
	for _, name := range record.StageOrder {
		o.Stages = append(o.Stages, record.StageResult{Name: name, Outcome: record.Skip, Explanation: why})
	}
	o.Stages = o.Stages[:len(o.Stages):len(o.Stages)]
	return o
}

var (
	shedQueueOutcome = shedOutcome(ShedMessage)
	shedBodyOutcome  = shedOutcome(ShedBodyMessage)
	// disabledOutcome is every record's with --replay=false.
	disabledOutcome = unreplayed("cannot predict: the replay is disabled", "not replayed: the replay is disabled (--replay=false)")
)
