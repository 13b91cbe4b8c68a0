package proxy

import (
	"context"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/stages"
)

// Re-runs: the flow API's "replay this flow again, now".
//
// A capture record deliberately holds no credentials and no body, so it
// cannot be replayed from. The replay's own copy of the request (the
// clone begin makes, headers with credentials and the body) can: the
// proxy keeps it, in memory only, for the newest flows, bounded by count
// and by total body bytes. It is never written anywhere, and it is kept
// only when Config.Rerun asks for it, which kproxy serve does only while
// the flow API is on.

// RerunLimits bound what the proxy keeps to re-run flows.
type RerunLimits struct {
	// Flows is how many of the newest flows can be re-run; 0 keeps
	// nothing (re-runs are off).
	Flows int
	// Bytes bounds the total size of the request bodies kept (0: no
	// bound beyond Flows × the apiserver's 3 MiB body limit).
	Bytes int64
}

// RerunUnavailableError says a flow cannot be re-run: its request is not
// (or no longer) kept.
type RerunUnavailableError struct {
	ID     string
	Limits RerunLimits
}

func (e *RerunUnavailableError) Error() string {
	if e.Limits.Flows <= 0 {
		return fmt.Sprintf("flow %s cannot be re-run: kproxy keeps requests for re-runs only while its flow API is on (--api-listen) and --api-rerun-keep is above 0", e.ID)
	}
	return fmt.Sprintf("flow %s is older than the newest %d kproxy keeps for re-runs (--api-rerun-keep, bodies within --api-rerun-keep-mib), or not a flow this kproxy has seen", e.ID, e.Limits.Flows)
}

// NotFound marks the error as "no such flow to re-run" (the flow API
// answers 404).
func (e *RerunUnavailableError) NotFound() bool { return true }

// rerunStore keeps the replay's requests of the newest flows, with their
// records, oldest first.
//
// A flow becomes re-runnable in two steps: its request is pended once its
// replay is done, and adopted, with its finished record, by the sink
// wrapper just before the record reaches the other sinks. So a flow is
// re-runnable by the time anyone can see it, and the record the store
// holds is the finished one (the goroutine writing it never touches it
// again).
type rerunStore struct {
	limits  RerunLimits
	mu      sync.Mutex
	pending map[string]*stages.Request // replayed, record not yet written
	order   []string                   // a FIFO of ids: order[head:]
	head    int
	entries map[string]rerunEntry
	bytes   int64
}

type rerunEntry struct {
	req *stages.Request // never modified once kept
	rec *record.Record  // the flow's record, as written
}

// newRerunStore returns nil (re-runs off) when l keeps no flows.
func newRerunStore(l RerunLimits) *rerunStore {
	if l.Flows <= 0 {
		return nil
	}
	return &rerunStore{limits: l, pending: map[string]*stages.Request{}, entries: make(map[string]rerunEntry, l.Flows)}
}

// sink wraps the proxy's sink so that every record written adopts its
// pended request; with re-runs off it is next itself.
func (s *rerunStore) sink(next record.Sink) record.Sink {
	if s == nil {
		return next
	}
	return rerunSink{s, next}
}

type rerunSink struct {
	s    *rerunStore
	next record.Sink
}

func (k rerunSink) Write(rec *record.Record) {
	k.s.adopt(rec)
	k.next.Write(rec)
}

// pend registers a flow's request until its record is written. Every
// pended request is adopted: the proxy writes a record for every replay.
func (s *rerunStore) pend(req *stages.Request) {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.pending[req.ID] = req
	s.mu.Unlock()
}

// adopt keeps the pended request of rec's flow, evicting the oldest past
// the limits.
func (s *rerunStore) adopt(rec *record.Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	req, ok := s.pending[rec.ID]
	if !ok {
		return
	}
	delete(s.pending, rec.ID)
	s.keepLocked(req, rec)
}

// keepLocked keeps a request and its record. Callers hold mu.
func (s *rerunStore) keepLocked(req *stages.Request, rec *record.Record) {
	size := int64(len(req.Body))
	if s.limits.Bytes > 0 && size > s.limits.Bytes {
		return // larger than the whole budget
	}
	if _, dup := s.entries[rec.ID]; dup {
		return
	}
	for len(s.entries) > 0 && (len(s.entries) >= s.limits.Flows || (s.limits.Bytes > 0 && s.bytes+size > s.limits.Bytes)) {
		s.evictOldest()
	}
	s.entries[rec.ID] = rerunEntry{req: req, rec: rec}
	s.order = append(s.order, rec.ID)
	s.bytes += size
}

// evictOldest drops the oldest entry. Callers hold mu.
func (s *rerunStore) evictOldest() {
	id := s.order[s.head]
	s.order[s.head] = ""
	s.head++
	if e, ok := s.entries[id]; ok {
		s.bytes -= int64(len(e.req.Body))
		delete(s.entries, id)
	}
	// Reuse the slice's front once half of it is dead, so the FIFO does
	// not grow without bound.
	if s.head > len(s.order)/2 {
		s.order = append(s.order[:0], s.order[s.head:]...)
		s.head = 0
	}
}

func (s *rerunStore) get(id string) (rerunEntry, error) {
	if s == nil {
		return rerunEntry{}, &RerunUnavailableError{ID: id}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[id]
	if !ok {
		return rerunEntry{}, &RerunUnavailableError{ID: id, Limits: s.limits}
	}
	return e, nil
}

// keepForRerun is called once a flow's replay is done, before its record
// is written: from the record's write on, the flow can be re-run.
func (p *Proxy) keepForRerun(req *stages.Request) {
	if p.reruns == nil {
		return
	}
	// Keep only what a re-run needs: not the exchange (Actual), not the
	// request's context (the server span, the connection).
	p.reruns.pend(&stages.Request{
		ID: req.ID, HTTP: req.HTTP.WithContext(context.Background()),
		Body: req.Body, BodyTruncated: req.BodyTruncated, Info: req.Info,
	})
}

// Replay re-runs kproxy's replay of flow id now: the same request, as
// kproxy received it (credentials and body included), through the same
// pipeline, against the cluster as it is now. Nothing is sent upstream.
// The new record has its own id, rerunOf naming the flow, and the flow's
// actual answer copied (what the apiserver said then, to compare with
// what the replay says now). It is returned, never written to the sinks:
// the capture holds one record per proxied request, and a re-run's copied
// answer beside a new prediction would read as a disagreement of kproxy
// with the apiserver. A write that succeeded then is now part of the state
// the re-run reads, so it may be predicted differently (AlreadyExists).
func (p *Proxy) Replay(ctx context.Context, id string) (*record.Record, error) {
	e, err := p.reruns.get(id)
	if err != nil {
		return nil, err
	}
	start := p.clock.Now()
	newID := newID()
	ctx, span := p.tracer.Start(ctx, "rerun "+spanName(e.req.HTTP, e.req.Info),
		trace.WithAttributes(attribute.String("kproxy.rerun_of", id)))
	defer span.End()
	req := &stages.Request{ID: newID, Arrival: start, HTTP: e.req.HTTP.Clone(ctx),
		Body: e.req.Body, BodyTruncated: e.req.BodyTruncated}
	if e.req.Info != nil {
		info := *e.req.Info
		req.Info = &info
	}
	// No Actual: there is no answer to this run; the replay reads the
	// latest state, as kproxy explain does.
	o := p.replay(ctx, req)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("re-running flow %s: %w", id, err)
	}
	orig := e.rec
	rec := &record.Record{
		ID: newID, Start: start, Mode: orig.Mode, Identity: orig.Identity,
		TraceID:           span.SpanContext().TraceID().String(),
		KubernetesVersion: stages.KubernetesVersion,
		Request:           orig.Request,
		Predicted:         o.Predicted,
		Stages:            o.Stages,
		Actual:            orig.Actual,
		RerunOf:           id,
	}
	rec.Request.ActingAs = ""
	if rec.Request.User == "" && o.Caller != nil {
		rec.Request.User, rec.Request.Groups = o.Caller.GetName(), o.Caller.GetGroups()
	}
	if o.ActingAs != nil && o.Caller != nil && o.ActingAs.GetName() != o.Caller.GetName() {
		rec.Request.ActingAs = o.ActingAs.GetName()
	}
	rec.Latency = record.Latency{TotalNs: p.clock.Since(start).Nanoseconds(), ReplayNs: o.Duration.Nanoseconds()}
	return rec, nil
}
