package flowapi

import (
	"sync"

	"github.com/kproxy/kproxy/internal/record"
)

// Buffer keeps the newest records in a ring. It is a record.Sink: Write
// stores a record in O(1) and never waits for a reader. Every record gets
// a sequence number (1, 2, ...) in write order; readers (List, Get and
// subscriptions) are positions in that sequence, so a slow reader costs
// the writer nothing: it only finds, when it looks again, that the records
// it had not read yet have been overwritten, and how many.
//
// Records are immutable once written: the Buffer hands out the pointers it
// was given, to any number of readers.
type Buffer struct {
	mu   sync.Mutex
	recs []*record.Record // recs[seq%len(recs)]
	// ids remembers the ids of the newest 2×capacity records, the retained
	// ones and as many evicted ones, with their sequence numbers: a client
	// resuming after an evicted record learns exactly how many it missed.
	ids   []string
	index map[string]uint64
	// last is the sequence number of the newest record (0: none yet).
	last uint64
	// wake is closed on the next Write when a subscriber waits on it.
	wake    chan struct{}
	waiting bool
}

// NewBuffer makes a buffer of the newest capacity records (at least 1).
func NewBuffer(capacity int) *Buffer {
	capacity = max(capacity, 1)
	return &Buffer{
		recs:  make([]*record.Record, capacity),
		ids:   make([]string, 2*capacity),
		index: make(map[string]uint64, 2*capacity),
		wake:  make(chan struct{}),
	}
}

// Capacity is how many records the buffer keeps.
func (b *Buffer) Capacity() int { return len(b.recs) }

// Write implements record.Sink. It never blocks on readers.
func (b *Buffer) Write(r *record.Record) {
	if r == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.last++
	seq := b.last
	b.recs[seq%uint64(len(b.recs))] = r
	slot := seq % uint64(len(b.ids))
	if old := b.ids[slot]; old != "" && b.index[old] == seq-uint64(len(b.ids)) {
		delete(b.index, old)
	}
	b.ids[slot] = r.ID
	b.index[r.ID] = seq
	if b.waiting {
		// One close wakes every waiting subscriber, however many: the
		// writer's cost does not grow with them.
		close(b.wake)
		b.wake, b.waiting = make(chan struct{}), false
	}
}

// oldest is the sequence number of the oldest retained record (last+1
// when empty). Callers hold mu.
func (b *Buffer) oldest() uint64 {
	n := min(b.last, uint64(len(b.recs)))
	return b.last - n + 1
}

// Evicted is how many records have been written and then pushed out of
// the buffer by newer ones.
func (b *Buffer) Evicted() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.oldest() - 1
}

// Len is how many records the buffer holds.
func (b *Buffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return int(b.last - b.oldest() + 1)
}

// Get returns the record with that id, if still retained.
func (b *Buffer) Get(id string) (*record.Record, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	seq, ok := b.index[id]
	if !ok || seq < b.oldest() {
		return nil, false
	}
	return b.recs[seq%uint64(len(b.recs))], true
}

// snapshot returns the retained records, oldest first, and the sequence
// number of the newest. The copy is pointers only, so the lock is held
// for a memcpy, and matching (a filter can be slow) happens outside it.
func (b *Buffer) snapshot() ([]*record.Record, uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]*record.Record, 0, b.last-b.oldest()+1)
	for seq := b.oldest(); seq <= b.last; seq++ {
		out = append(out, b.recs[seq%uint64(len(b.recs))])
	}
	return out, b.last
}

// List returns the newest limit records that match (nil matches all),
// oldest first. limit <= 0 means all.
func (b *Buffer) List(match func(*record.Record) bool, limit int) []*record.Record {
	recs, _ := b.snapshot()
	return newest(recs, match, limit)
}

// newest keeps the last limit records of recs that match, in order.
func newest(recs []*record.Record, match func(*record.Record) bool, limit int) []*record.Record {
	if limit <= 0 {
		limit = len(recs)
	}
	out := make([]*record.Record, 0, min(limit, len(recs)))
	for i := len(recs) - 1; i >= 0 && len(out) < limit; i-- {
		if match == nil || match(recs[i]) {
			out = append(out, recs[i])
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// Event is what a subscription yields: a record, or a count of records it
// lost because they were evicted before it read them.
type Event struct {
	Record *record.Record
	Missed uint64
}

// Subscription is a reader's position in a Buffer. It holds no records of
// its own: however far behind its reader falls, it costs the buffer and
// the writer nothing; the reader is told how many records it lost and
// jumps to the oldest one still retained. A Subscription is used by one
// goroutine.
type Subscription struct {
	b     *Buffer
	next  uint64
	match func(*record.Record) bool
}

// Resume says where a subscription starts.
type Resume struct {
	// AfterID starts after the record with that id. When it is no longer
	// retained the subscription starts at the oldest retained record, and
	// its first event reports how many were missed (exactly when the id is
	// among the newest 2×capacity, else every record evicted so far).
	AfterID string
	// Backlog, without AfterID, is how many of the newest retained
	// matching records come first; negative means all of them.
	Backlog int
}

// Subscribe returns a subscription yielding the records that match (nil:
// all), starting as from says, then every record written later, and the
// backlog to send before them, from one consistent snapshot.
func (b *Buffer) Subscribe(from Resume, match func(*record.Record) bool) (*Subscription, []*record.Record) {
	s := &Subscription{b: b, match: match}
	if from.AfterID != "" {
		b.mu.Lock()
		defer b.mu.Unlock()
		// The subscription starts right after the id; when that is no
		// longer retained, its first event counts the records lost. An
		// id never seen (or long gone, or from an earlier kproxy) starts
		// at the beginning: all that can be said is that everything
		// evicted so far may have been missed.
		s.next = 1
		if seq, known := b.index[from.AfterID]; known {
			s.next = seq + 1
		}
		return s, nil
	}
	recs, last := b.snapshot()
	s.next = last + 1
	if from.Backlog == 0 {
		return s, nil
	}
	return s, newest(recs, match, from.Backlog)
}

// TryNext returns the next event without waiting. When there is none yet
// it returns ok false and a channel closed by the next Write.
func (s *Subscription) TryNext() (ev Event, ok bool, wait <-chan struct{}) {
	for {
		b := s.b
		b.mu.Lock()
		if s.next > b.last {
			b.waiting = true
			w := b.wake
			b.mu.Unlock()
			return Event{}, false, w
		}
		if oldest := b.oldest(); s.next < oldest {
			missed := oldest - s.next
			s.next = oldest
			b.mu.Unlock()
			return Event{Missed: missed}, true, nil
		}
		r := b.recs[s.next%uint64(len(b.recs))]
		s.next++
		b.mu.Unlock()
		// Matching runs outside the lock: the writer never waits for it.
		if s.match == nil || s.match(r) {
			return Event{Record: r}, true, nil
		}
	}
}

// Next waits for the next event until done is closed (ok false then).
func (s *Subscription) Next(done <-chan struct{}) (Event, bool) {
	for {
		ev, ok, wait := s.TryNext()
		if ok {
			return ev, true
		}
		select {
		case <-wait:
		case <-done:
			return Event{}, false
		}
	}
}
