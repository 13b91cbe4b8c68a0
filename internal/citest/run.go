package citest

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/testfile"
)

// Engine gives a case its verdict.
type Engine interface {
	// Name is local or cluster.
	Name() string
	// Run sends or replays the case. An error is the engine's failure
	// (the case could not be run at all: exit status 2); a request kproxy
	// cannot predict is a Verdict with Unknown set.
	Run(ctx context.Context, c *testfile.Case) (Verdict, error)
}

// Options for a run.
type Options struct {
	Compare CompareOptions
	// Progress, when set, is called after each case.
	Progress func(done, total int, r Result)
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Run runs every case of files through e, in order, and compares.
func Run(ctx context.Context, e Engine, files []*testfile.File, o Options) *Report {
	now := o.Now
	if now == nil {
		now = time.Now
	}
	rep := &Report{Engine: e.Name(), Started: now()}
	total := 0
	for _, f := range files {
		total += len(f.Cases)
	}
	for _, f := range files {
		for i := range f.Cases {
			c := &f.Cases[i]
			start := now()
			res := Result{File: f.Path, Line: c.Line, Name: c.Name, Method: c.Request.Method, Path: c.Request.Path}
			v, err := e.Run(ctx, c)
			res.Duration = now().Sub(start)
			if err != nil {
				res.Error = err.Error()
			} else {
				res.Got = v
				res.Failures, res.NotCompared = Compare(c.Expect, v, o.Compare)
				if v.Disagreement != "" {
					rep.Disagreements++
				}
			}
			rep.Results = append(rep.Results, res)
			if o.Progress != nil {
				o.Progress(len(rep.Results), total, res)
			}
			if ctx.Err() != nil {
				rep.Duration = now().Sub(rep.Started)
				return rep
			}
		}
	}
	rep.Duration = now().Sub(rep.Started)
	return rep
}

// Diff lists the cases whose verdict differs between two runs of the
// same suite (before: the baseline; after: with overlays or changed
// flags), in after's order. Verdicts are compared on what decides them:
// status, stage, reason and message (up to what the apiserver itself
// does not keep: an error list's order, which of several culprits it
// names; record.SameMessageAt), and warnings in any order.
func Diff(before, after *Report) []Change {
	type key struct{ file, name string }
	was := map[key]Verdict{}
	for _, r := range before.Results {
		was[key{r.File, r.Name}] = r.Got
	}
	var out []Change
	for _, r := range after.Results {
		b, ok := was[key{r.File, r.Name}]
		if !ok {
			continue
		}
		if !sameVerdict(b, r.Got) {
			out = append(out, Change{File: r.File, Name: r.Name, Before: b, After: r.Got})
		}
	}
	return out
}

func sameVerdict(a, b Verdict) bool {
	return a.Status == b.Status && a.Stage == b.Stage && a.Reason == b.Reason &&
		record.SameMessageAt(a.Stage, a.Message, b.Message) && a.Unknown == b.Unknown && sameWarnings(a.Warnings, b.Warnings)
}

// sameWarnings compares two answers' warnings in any order: the
// apiserver adds a validating webhook's as its answer comes back (they
// are called at once) and a policy's in the order it drew.
func sameWarnings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// String is a change in one line: before → after.
func (c Change) String() string {
	return fmt.Sprintf("%s: %s → %s", c.Name, c.Before.Summary(), c.After.Summary())
}
