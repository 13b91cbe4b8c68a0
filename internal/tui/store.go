package tui

import (
	"github.com/kproxy/kproxy/internal/filter"
	"github.com/kproxy/kproxy/internal/record"
)

// store holds the flows the TUI knows, oldest first, up to a bound (the
// oldest go first past it), and the positions of those the filter shows.
// A flow is addressed by its sequence number (seq), which stays valid when
// older flows are dropped; records are never modified.
type store struct {
	max   int
	base  int // seq of all[0]
	all   []*record.Record
	shown []int // seqs of the flows the filter matches, ascending
	expr  *filter.Expr
	text  string // the filter as typed
	marks map[string]bool
}

func newStore(max int) *store {
	if max <= 0 {
		max = 100_000
	}
	return &store{max: max, marks: map[string]bool{}}
}

// end is the seq the next flow gets.
func (s *store) end() int { return s.base + len(s.all) }

func (s *store) at(seq int) *record.Record {
	if seq < s.base || seq >= s.end() {
		return nil
	}
	return s.all[seq-s.base]
}

// add appends flows, matching each against the filter, and drops the
// oldest past the bound. It returns how many were dropped.
func (s *store) add(recs []*record.Record) int {
	for _, r := range recs {
		seq := s.end()
		s.all = append(s.all, r)
		if s.expr.Match(r) {
			s.shown = append(s.shown, seq)
		}
	}
	over := len(s.all) - s.max
	if over <= 0 {
		return 0
	}
	// Copy rather than re-slice, so the dropped records can be freed; a
	// filter running in the background keeps its own view of the old array.
	for _, r := range s.all[:over] {
		delete(s.marks, r.ID)
	}
	s.all = append([]*record.Record(nil), s.all[over:]...)
	s.base += over
	i := 0
	for i < len(s.shown) && s.shown[i] < s.base {
		i++
	}
	s.shown = append([]int(nil), s.shown[i:]...)
	return over
}

// snapshot is what a background filter reads: the records as of now.
type snapshot struct {
	base int
	all  []*record.Record
}

func (s *store) snapshot() snapshot { return snapshot{s.base, s.all} }

// filterSnapshot matches every record of the snapshot (off the UI loop).
func filterSnapshot(snap snapshot, expr *filter.Expr) []int {
	out := make([]int, 0, len(snap.all)/4)
	for i, r := range snap.all {
		if expr.Match(r) {
			out = append(out, snap.base+i)
		}
	}
	return out
}

// setFilter installs a filter whose matches over a snapshot were computed
// in the background, then matches what arrived since.
func (s *store) setFilter(text string, expr *filter.Expr, snap snapshot, matched []int) {
	s.text, s.expr = text, expr
	shown := matched[:0:0]
	for _, seq := range matched {
		if seq >= s.base {
			shown = append(shown, seq)
		}
	}
	from := snap.base + len(snap.all)
	if from < s.base {
		from = s.base
	}
	for seq := from; seq < s.end(); seq++ {
		if expr.Match(s.at(seq)) {
			shown = append(shown, seq)
		}
	}
	s.shown = shown
}

func (s *store) toggleMark(id string) {
	if s.marks[id] {
		delete(s.marks, id)
	} else {
		s.marks[id] = true
	}
}

// selection is what an export writes: the marked flows if any, else the
// ones the filter shows.
func (s *store) selection() []*record.Record {
	var out []*record.Record
	if len(s.marks) > 0 {
		for _, r := range s.all {
			if s.marks[r.ID] {
				out = append(out, r)
			}
		}
		return out
	}
	out = make([]*record.Record, 0, len(s.shown))
	for _, seq := range s.shown {
		out = append(out, s.at(seq))
	}
	return out
}
