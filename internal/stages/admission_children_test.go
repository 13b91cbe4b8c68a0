package stages

import (
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/record"
)

func TestSummarizeUnchanged(t *testing.T) {
	ok := func(name string, ns int64) record.StageResult {
		return record.StageResult{Name: name, Outcome: record.Pass, Explanation: admittedUnchanged, DurationNs: ns}
	}
	for _, tc := range []struct {
		name   string
		in     []record.StageResult
		want   []string // child names, in order
		folded int
	}{
		{"all unchanged fold into one", []record.StageResult{ok("A", 10), ok("B", 20), ok("C", 30)}, []string{"3 more plugins"}, 3},
		{"one alone stays itself", []record.StageResult{ok("A", 10)}, []string{"A"}, 0},
		{"a change, a refusal and a slow plugin stay", []record.StageResult{
			ok("A", 10),
			{Name: "Mutator", Outcome: record.Pass, Explanation: "changed the object: ..."},
			ok("Slow", 2_000_000),
			ok("B", 10),
			{Name: "PodSecurity", Outcome: record.Reject, Explanation: "forbidden"},
		}, []string{"Mutator", "Slow", "PodSecurity", "2 more plugins"}, 2},
		{"nothing", nil, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, folded := summarizeUnchanged(tc.in)
			var names []string
			for _, c := range got {
				names = append(names, c.Name)
			}
			if strings.Join(names, ",") != strings.Join(tc.want, ",") || folded != tc.folded {
				t.Fatalf("children %v, %d folded; want %v, %d", names, folded, tc.want, tc.folded)
			}
			if folded == 0 {
				return
			}
			// The summary counts the plugins it folds and does not list
			// them: they are the same in every record.
			last := got[len(got)-1]
			if last.Outcome != record.Pass || last.Explanation != "admitted without change, each in under 1ms" {
				t.Errorf("the summary: %+v", last)
			}
			for _, c := range tc.in {
				if strings.Contains(last.Explanation, c.Name) {
					t.Errorf("the summary names %s: %q", c.Name, last.Explanation)
				}
			}
		})
	}
	if got, _ := summarizeUnchanged([]record.StageResult{ok("A", 10), ok("B", 20)}); got[0].DurationNs != 30 {
		t.Errorf("the summary's duration %d, want the sum 30", got[0].DurationNs)
	}
}

// TestAdmitted checks the explanation of a phase every plugin admitted:
// a lone summary child is dropped for a sentence that says the same.
func TestAdmitted(t *testing.T) {
	ok := func(name string) record.StageResult {
		return record.StageResult{Name: name, Outcome: record.Pass, Explanation: admittedUnchanged, DurationNs: 10}
	}
	all, folded := summarizeUnchanged([]record.StageResult{ok("A"), ok("B"), ok("C")})
	msg, children := admitted(3, nil, all, folded)
	if msg != "3 plugins admitted the request without change, each in under 1ms" || children != nil {
		t.Errorf("all unchanged: %q, children %v", msg, children)
	}

	mixed, folded := summarizeUnchanged([]record.StageResult{ok("A"), {Name: "Mutator", Outcome: record.Pass, Explanation: "changed the object: [...]"}, ok("B")})
	msg, children = admitted(3, []string{"Mutator"}, mixed, folded)
	if msg != "3 plugins admitted the request; changed by Mutator" || len(children) != 2 || children[0].Name != "Mutator" || children[1].Name != "2 more plugins" {
		t.Errorf("one changed: %q, children %+v", msg, children)
	}

	one, folded := summarizeUnchanged([]record.StageResult{ok("A")})
	msg, children = admitted(1, nil, one, folded)
	if msg != "1 plugins admitted the request" || len(children) != 1 || children[0].Name != "A" {
		t.Errorf("one plugin: %q, children %+v", msg, children)
	}
}

// TestFoldSpans: each run of two or more unremarkable plugins' spans
// becomes one that names each with its time and runs from the first's
// start to the last's end; a remarkable plugin keeps its own span and
// splits the runs (a folded span never covers its time); a lone
// unremarkable plugin keeps its own.
func TestFoldSpans(t *testing.T) {
	t0 := time.Unix(0, 0)
	us := time.Microsecond
	sp := func(name string, from, to time.Duration) childSpan {
		return childSpan{Name: "admission " + name, Start: t0.Add(from * us), End: t0.Add(to * us), Outcome: record.Pass}
	}
	a, b, c, slow, d, e, f := sp("A", 0, 3), sp("B", 5, 7), sp("C", 9, 20), sp("Slow", 20, 3000), sp("D", 3000, 3002), sp("E", 3003, 3004), sp("F", 3005, 3006)
	for _, tc := range []struct {
		name    string
		spans   []childSpan
		quiet   []bool
		want    []string // span names
		plugins []string // kproxy.admission.plugins of the folded spans
	}{
		{"nothing", nil, nil, nil, nil},
		{"one alone", []childSpan{a}, []bool{true}, []string{"admission A"}, nil},
		{"three fold", []childSpan{a, b, c}, []bool{true, true, true}, []string{"admission: 3 more plugins"}, []string{"A 3µs, B 2µs, C 11µs"}},
		{"a slow plugin splits the runs", []childSpan{a, b, c, slow, d, e}, []bool{true, true, true, false, true, true},
			[]string{"admission: 3 more plugins", "admission Slow", "admission: 2 more plugins"}, []string{"A 3µs, B 2µs, C 11µs", "D 2µs, E 1µs"}},
		{"a lone quiet one between two remarkable", []childSpan{slow, d, slow, e, f}, []bool{false, true, false, true, true},
			[]string{"admission Slow", "admission D", "admission Slow", "admission: 2 more plugins"}, []string{"E 1µs, F 1µs"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := foldSpans(tc.spans, tc.quiet)
			var names, plugins []string
			for _, s := range got {
				names = append(names, s.Name)
				for _, at := range s.Attrs {
					if at.Key == "kproxy.admission.plugins" {
						plugins = append(plugins, at.Value.AsString())
					}
				}
				if strings.HasSuffix(s.Name, "more plugins") && !s.Start.Before(s.End) {
					t.Errorf("folded span %q from %v to %v", s.Name, s.Start, s.End)
				}
			}
			if strings.Join(names, "|") != strings.Join(tc.want, "|") || strings.Join(plugins, "|") != strings.Join(tc.plugins, "|") {
				t.Errorf("spans %q with plugins %q; want %q with %q", names, plugins, tc.want, tc.plugins)
			}
		})
	}
	if f := foldSpans([]childSpan{a, b, c}, []bool{true, true, true})[0]; !f.Start.Equal(t0) || !f.End.Equal(t0.Add(20*us)) {
		t.Errorf("folded span from %v to %v, want the first's start to the last's end", f.Start, f.End)
	}
}
