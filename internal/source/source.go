// Package source delivers capture records to the readers that show them
// (the TUI, kproxy flows): from a capture file, read whole or followed as
// tail -F follows it, from standard input, or from kproxy serve's live flow
// API. Every source speaks the same Event: a batch of records (coalesced,
// so a 100,000-record file arrives in about a hundred batches), counts of
// what could not be delivered, and changes of state worth a status line.
package source

import (
	"bytes"
	"context"
	"encoding/json"

	"github.com/kproxy/kproxy/internal/record"
)

// Event is one delivery: a batch of records, or a change of state.
type Event struct {
	// Records are the records read since the previous event, in order.
	Records []*record.Record
	// Skipped counts the capture lines since the previous event that are
	// not records (not JSON, no "id", longer than MaxLine): counted, never
	// fatal.
	Skipped int
	// Missed counts the records the live API dropped for this reader
	// because it read too slowly.
	Missed int
	// Status is a human-readable change of state: "reading FILE",
	// "following FILE", "FILE was truncated; reading it from the start",
	// "FILE was replaced (rotated); reading the new file", "connected to
	// URL", "connection lost: ...; reconnecting in 2s".
	Status string
	// Done says a source that does not follow reached its end: no event
	// follows.
	Done bool
}

// Source is where flows come from.
type Source interface {
	// Name names the source for a status bar: the file's path, "stdin",
	// or the API's URL.
	Name() string
	// Run sends events to out until the source ends (a last event with
	// Done) or ctx ends (Run then returns nil). It returns an error only
	// for what stops the source for good, such as a capture file that
	// does not exist, and the error names the fix. Run never closes out.
	Run(ctx context.Context, out chan<- Event) error
}

// BatchSize is the most records one Event carries.
const BatchSize = 1000

// MaxLine is the longest capture line read as a record (records with large
// explanations reach about 1 MiB); a longer line is skipped and counted.
const MaxLine = 64 << 20

// parseLine decodes one capture line. ok is false for a line that is not a
// record (skipped and counted); blank is true for an empty line, which is
// neither a record nor counted.
func parseLine(line []byte) (r *record.Record, ok, blank bool) {
	if len(bytes.TrimSpace(line)) == 0 {
		return nil, false, true
	}
	r = &record.Record{}
	// Every record has an id, a start and a method: a JSON line without
	// them (another program's log in the same stream) is not one.
	if err := json.Unmarshal(line, r); err != nil || r.ID == "" || r.Start.IsZero() || r.Request.Method == "" {
		return nil, false, false
	}
	return r, true, false
}

// send delivers ev unless ctx ends first.
func send(ctx context.Context, out chan<- Event, ev Event) error {
	select {
	case out <- ev:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// batcher collects records and counts into Events of at most BatchSize
// records.
type batcher struct {
	out     chan<- Event
	recs    []*record.Record
	skipped int
	missed  int
}

// add queues a record, sending a full batch.
func (b *batcher) add(ctx context.Context, r *record.Record) error {
	b.recs = append(b.recs, r)
	if len(b.recs) >= BatchSize {
		return b.flush(ctx)
	}
	return nil
}

// line parses and queues one capture line.
func (b *batcher) line(ctx context.Context, line []byte) error {
	r, ok, blank := parseLine(line)
	switch {
	case blank:
		return nil
	case !ok:
		b.skipped++
		return nil
	}
	return b.add(ctx, r)
}

// pending reports whether a flush would send anything.
func (b *batcher) pending() bool {
	return len(b.recs) > 0 || b.skipped > 0 || b.missed > 0
}

// flush sends what is queued, if anything.
func (b *batcher) flush(ctx context.Context) error {
	if !b.pending() {
		return nil
	}
	ev := Event{Records: b.recs, Skipped: b.skipped, Missed: b.missed}
	b.recs, b.skipped, b.missed = nil, 0, 0
	return send(ctx, b.out, ev)
}

// status sends what is queued, then a change of state (in that order, so
// a reader sees the records read before the change first).
func (b *batcher) status(ctx context.Context, s string) error {
	if err := b.flush(ctx); err != nil {
		return err
	}
	return send(ctx, b.out, Event{Status: s})
}

// done sends what is queued and the end.
func (b *batcher) done(ctx context.Context) error {
	ev := Event{Records: b.recs, Skipped: b.skipped, Missed: b.missed, Done: true}
	b.recs, b.skipped, b.missed = nil, 0, 0
	return send(ctx, b.out, ev)
}

// lines splits a byte stream into lines, holding back a line until its
// newline arrives and dropping (and counting) lines longer than max.
type lines struct {
	max     int
	partial []byte
	// overlong is set while the current line has passed max: its bytes
	// are dropped until the newline that ends it.
	overlong bool
}

// feed splits chunk, calling fn for each complete line (without its
// newline); it returns how many overlong lines ended in chunk.
func (l *lines) feed(chunk []byte, fn func([]byte) error) (overlong int, err error) {
	for len(chunk) > 0 {
		i := bytes.IndexByte(chunk, '\n')
		if i < 0 {
			l.hold(chunk)
			return overlong, nil
		}
		part := chunk[:i]
		chunk = chunk[i+1:]
		if l.overlong || len(l.partial)+len(part) > l.max {
			l.partial, l.overlong = l.partial[:0], false
			overlong++
			continue
		}
		line := part
		if len(l.partial) > 0 {
			line = append(l.partial, part...)
		}
		if err := fn(line); err != nil {
			return overlong, err
		}
		l.partial = l.partial[:0]
	}
	return overlong, nil
}

// hold keeps an unfinished line's bytes.
func (l *lines) hold(b []byte) {
	if l.overlong {
		return
	}
	if len(l.partial)+len(b) > l.max {
		l.partial, l.overlong = l.partial[:0], true
		return
	}
	l.partial = append(l.partial, b...)
}

// rest returns the unfinished line (at the end of a stream that will not
// grow) and forgets it; overlong reports that it was too long to keep.
func (l *lines) rest() (line []byte, overlong bool) {
	line, overlong = l.partial, l.overlong
	l.partial, l.overlong = nil, false
	return line, overlong
}

// reset forgets the unfinished line (its file was truncated).
func (l *lines) reset() { l.partial, l.overlong = l.partial[:0], false }
