package servertrace

import (
	"log/slog"
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/internal/record"
)

// Observation is the apiserver's own account of one request, from its
// spans (the Receiver) or its audit events.
type Observation struct {
	AuditID string
	TraceID string   // the apiserver's trace
	Links   []string // kproxy trace IDs the root continues or links to
	Server  record.Server
}

// Offerer takes observations: a Joiner.
type Offerer interface {
	Offer(o Observation)
}

// Defaults of JoinOptions.
const (
	DefaultWait    = 3 * time.Second
	DefaultMaxHeld = 10000
)

// JoinOptions tune a Joiner.
type JoinOptions struct {
	// Wait is how long a record waits for its observation (default
	// DefaultWait); an observation that comes first waits as long for
	// its record.
	Wait time.Duration
	// MaxHeld bounds the records held, and apart from them the
	// observations waiting for a record (default DefaultMaxHeld): past
	// it a record is written at once, and the oldest observation goes.
	MaxHeld int
	// Clock times the waits (default the real clock).
	Clock clock.WithTicker
	// Log receives a warning when records wait and no observation has
	// ever come (default: discarded).
	Log *slog.Logger
	// MinUpstream, when set, lets a record whose request the apiserver
	// answered within it pass at once: when the only account comes from
	// audit annotations, which the apiserver writes only for slower
	// requests (its time is within kproxy's upstream time), waiting would
	// only delay the record.
	MinUpstream time.Duration
}

// JoinStats counts what a Joiner did.
type JoinStats struct {
	Held     int // records held now
	Matched  uint64
	TimedOut uint64 // written without an observation after Wait
	// Overflowed records were written at once: MaxHeld were held.
	Overflowed uint64
	// PassedThrough records never waited: no answer from the apiserver
	// to observe (kproxy answered, a 401 from authentication, which runs
	// before the traced chain, a re-run).
	PassedThrough uint64
	Observations  uint64 // offered
	Early         uint64 // observations that came before their record
	// Unmatched observations expired or were evicted without a record:
	// the cluster's other traffic, which does not go through kproxy.
	Unmatched uint64
}

// Joiner is a record.Sink that joins each record to the apiserver's own
// observation of the same request before writing it to next: a record
// waits for its observation at most Wait, never blocking the proxy (Write
// only files it), and is written without one after that.
type Joiner struct {
	next        record.Sink
	wait        time.Duration
	minUpstream time.Duration
	maxHeld     int
	clock       clock.WithTicker
	log         *slog.Logger

	mu       sync.Mutex
	closed   bool
	records  index[*heldRecord] // by "a:" audit ID and "t:" trace ID
	queue    fifo[*heldRecord]
	nHeld    int
	obs      index[*heldObservation] // by "a:" audit ID and "t:" each trace ID
	obsQueue fifo[*heldObservation]
	nObs     int
	stats    JoinStats
	warned   time.Time

	stop chan struct{}
	done chan struct{}
}

type heldRecord struct {
	rec      *record.Record
	auditID  string
	keys     []string
	deadline time.Time
	done     bool
}

type heldObservation struct {
	o        Observation
	auditID  string
	keys     []string
	deadline time.Time
	done     bool
}

// NewJoiner starts a Joiner writing to next.
func NewJoiner(next record.Sink, opts JoinOptions) *Joiner {
	j := &Joiner{next: next, wait: opts.Wait, minUpstream: opts.MinUpstream, maxHeld: opts.MaxHeld, clock: opts.Clock, log: opts.Log,
		records: index[*heldRecord]{}, obs: index[*heldObservation]{},
		stop: make(chan struct{}), done: make(chan struct{})}
	if j.wait <= 0 {
		j.wait = DefaultWait
	}
	if j.maxHeld <= 0 {
		j.maxHeld = DefaultMaxHeld
	}
	if j.clock == nil {
		j.clock = clock.RealClock{}
	}
	if j.log == nil {
		j.log = slog.New(slog.DiscardHandler)
	}
	// A record waits Wait plus at most a tick.
	tick := min(max(j.wait/10, 5*time.Millisecond), 250*time.Millisecond)
	t := j.clock.NewTicker(tick)
	go j.sweep(t)
	return j
}

// holds reports whether a record can have an observation: the request
// reached the apiserver's traced chain (and took longer than
// MinUpstream).
func (j *Joiner) holds(r *record.Record) bool {
	return r.RerunOf == "" && r.Latency.UpstreamNs > int64(j.minUpstream) && r.Actual.Error == "" && r.Actual.Status != 401
}

// Write implements record.Sink: it holds r until its observation arrives
// or Wait passes, then writes it to next.
func (j *Joiner) Write(r *record.Record) {
	j.mu.Lock()
	if j.closed || !j.holds(r) {
		j.stats.PassedThrough++
		j.mu.Unlock()
		j.next.Write(r)
		return
	}
	auditID := truncateAuditID(r.Actual.AuditID)
	if h := j.findObservationLocked(auditID, r.TraceID); h != nil {
		j.dropObservationLocked(h)
		j.stats.Early++
		j.stats.Matched++
		j.mu.Unlock()
		apply(r, h.o)
		j.next.Write(r)
		return
	}
	if j.nHeld >= j.maxHeld {
		j.stats.Overflowed++
		j.mu.Unlock()
		j.next.Write(r)
		return
	}
	h := &heldRecord{rec: r, auditID: auditID, keys: keys(auditID, r.TraceID), deadline: j.clock.Now().Add(j.wait)}
	j.nHeld++
	j.queue.push(h)
	for _, k := range h.keys {
		j.records.add(k, h)
	}
	j.mu.Unlock()
}

// Offer matches an observation to its record, by audit ID (kproxy sends
// every request upstream with one) or else by a trace ID (the record's
// trace, continued or linked by the apiserver's), and writes the record;
// with no record yet it keeps the observation for Wait.
func (j *Joiner) Offer(o Observation) {
	j.mu.Lock()
	j.stats.Observations++
	if h := j.findRecordLocked(o); h != nil {
		j.releaseRecordLocked(h)
		j.stats.Matched++
		j.mu.Unlock()
		apply(h.rec, o)
		j.next.Write(h.rec)
		return
	}
	if j.closed {
		j.stats.Unmatched++
		j.mu.Unlock()
		return
	}
	for j.nObs >= j.maxHeld {
		old, ok := j.obsQueue.pop()
		if !ok {
			break
		}
		if !old.done {
			j.dropObservationLocked(old)
			j.stats.Unmatched++
		}
	}
	h := &heldObservation{o: o, auditID: truncateAuditID(o.AuditID), deadline: j.clock.Now().Add(j.wait)}
	h.keys = keys(h.auditID, append([]string{o.TraceID}, o.Links...)...)
	for _, k := range h.keys {
		j.obs.add(k, h)
	}
	j.nObs++
	j.obsQueue.push(h)
	j.mu.Unlock()
}

// Close writes every record held, now; records written after it pass
// straight through.
func (j *Joiner) Close() {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return
	}
	j.closed = true
	var out []*record.Record
	for {
		h, ok := j.queue.pop()
		if !ok {
			break
		}
		if !h.done {
			j.releaseRecordLocked(h)
			j.stats.TimedOut++
			out = append(out, h.rec)
		}
	}
	j.mu.Unlock()
	close(j.stop)
	<-j.done
	for _, r := range out {
		j.next.Write(r)
	}
}

// Stats reports what the joiner has done so far.
func (j *Joiner) Stats() JoinStats {
	j.mu.Lock()
	defer j.mu.Unlock()
	s := j.stats
	s.Held = j.nHeld
	return s
}

// sweep writes the records whose wait is over and forgets the
// observations whose wait is over.
func (j *Joiner) sweep(t clock.Ticker) {
	defer close(j.done)
	defer t.Stop()
	for {
		select {
		case <-j.stop:
			return
		case <-t.C():
		}
		now := j.clock.Now()
		var out []*record.Record
		j.mu.Lock()
		for {
			h, ok := j.queue.peek()
			if !ok || (!h.done && h.deadline.After(now)) {
				break
			}
			j.queue.pop()
			if !h.done {
				j.releaseRecordLocked(h)
				j.stats.TimedOut++
				out = append(out, h.rec)
			}
		}
		for {
			h, ok := j.obsQueue.peek()
			if !ok || (!h.done && h.deadline.After(now)) {
				break
			}
			j.obsQueue.pop()
			if !h.done {
				j.dropObservationLocked(h)
				j.stats.Unmatched++
			}
		}
		warn := len(out) > 0 && j.stats.Observations == 0 && now.Sub(j.warned) >= time.Minute
		if warn {
			j.warned = now
		}
		j.mu.Unlock()
		if warn {
			j.log.Warn("records waited for the apiserver's own account of their requests and none has arrived yet: they are written without it (check that the apiserver sends its spans or audit events to kproxy)",
				"waited", j.wait, "records", len(out))
		}
		for _, r := range out {
			j.next.Write(r)
		}
	}
}

// findRecordLocked is the oldest held record with the observation's
// audit ID, or else with one of its trace IDs and no other audit ID (a
// client may send many requests under one trace, or reuse an audit ID).
func (j *Joiner) findRecordLocked(o Observation) *heldRecord {
	a := truncateAuditID(o.AuditID)
	if a != "" {
		if h, ok := j.records.first("a:"+a, nil); ok {
			return h
		}
	}
	for _, id := range append([]string{o.TraceID}, o.Links...) {
		if id == "" {
			continue
		}
		if h, ok := j.records.first("t:"+id, func(h *heldRecord) bool { return a == "" || h.auditID == "" || h.auditID == a }); ok {
			return h
		}
	}
	return nil
}

// releaseRecordLocked takes a held record out of the index (its queue
// entry is skipped when reached).
func (j *Joiner) releaseRecordLocked(h *heldRecord) {
	h.done = true
	j.nHeld--
	for _, k := range h.keys {
		j.records.remove(k, h)
	}
}

// findObservationLocked is findRecordLocked the other way round.
func (j *Joiner) findObservationLocked(auditID, traceID string) *heldObservation {
	if auditID != "" {
		if h, ok := j.obs.first("a:"+auditID, nil); ok {
			return h
		}
	}
	if traceID != "" {
		if h, ok := j.obs.first("t:"+traceID, func(h *heldObservation) bool { return auditID == "" || h.auditID == "" || h.auditID == auditID }); ok {
			return h
		}
	}
	return nil
}

func (j *Joiner) dropObservationLocked(h *heldObservation) {
	h.done = true
	j.nObs--
	for _, k := range h.keys {
		j.obs.remove(k, h)
	}
}

// keys are the index keys of an audit ID and trace IDs.
func keys(auditID string, traceIDs ...string) []string {
	var ks []string
	if auditID != "" {
		ks = append(ks, "a:"+auditID)
	}
	for _, t := range traceIDs {
		if t != "" && !slices.Contains(ks, "t:"+t) {
			ks = append(ks, "t:"+t)
		}
	}
	return ks
}

// index maps a key to its values, oldest first.
type index[T comparable] map[string][]T

func (m index[T]) add(k string, v T) { m[k] = append(m[k], v) }

// first is the oldest value under k that ok accepts (nil: any).
func (m index[T]) first(k string, ok func(T) bool) (T, bool) {
	for _, v := range m[k] {
		if ok == nil || ok(v) {
			return v, true
		}
	}
	var zero T
	return zero, false
}

func (m index[T]) remove(k string, v T) {
	vs := m[k]
	for i, x := range vs {
		if x == v {
			vs = append(vs[:i:i], vs[i+1:]...)
			break
		}
	}
	if len(vs) == 0 {
		delete(m, k)
	} else {
		m[k] = vs
	}
}

// apply puts the observation on the record.
func apply(r *record.Record, o Observation) {
	s := o.Server
	r.Server = &s
	r.Latency.ServerNs = s.TotalNs
}

// truncateAuditID is the audit ID as the apiserver's spans carry it.
func truncateAuditID(id string) string {
	if len(id) > maxAuditIDLength {
		return id[:maxAuditIDLength]
	}
	return id
}

// fifo is a queue that reuses its front once half of it is consumed.
type fifo[T any] struct {
	items []T
	head  int
}

func (q *fifo[T]) push(v T) { q.items = append(q.items, v) }

func (q *fifo[T]) peek() (T, bool) {
	if q.head >= len(q.items) {
		var zero T
		return zero, false
	}
	return q.items[q.head], true
}

func (q *fifo[T]) pop() (T, bool) {
	v, ok := q.peek()
	if !ok {
		return v, false
	}
	var zero T
	q.items[q.head] = zero
	q.head++
	if q.head > len(q.items)/2 {
		q.items = append(q.items[:0], q.items[q.head:]...)
		q.head = 0
	}
	return v, true
}
