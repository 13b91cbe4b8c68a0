package stages

import (
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/record"
)

func TestSummarizeUnchanged(t *testing.T) {
	ok := func(name string, ns int64) record.StageResult {
		return record.StageResult{Name: name, Outcome: record.Pass, Explanation: admittedUnchanged, DurationNs: ns}
	}
	for _, tc := range []struct {
		name string
		in   []record.StageResult
		want []string // child names, in order
	}{
		{"all unchanged fold into one", []record.StageResult{ok("A", 10), ok("B", 20), ok("C", 30)}, []string{"3 more plugins"}},
		{"one alone stays itself", []record.StageResult{ok("A", 10)}, []string{"A"}},
		{"a change, a refusal and a slow plugin stay", []record.StageResult{
			ok("A", 10),
			{Name: "Mutator", Outcome: record.Pass, Explanation: "changed the object: ..."},
			ok("Slow", 2_000_000),
			ok("B", 10),
			{Name: "PodSecurity", Outcome: record.Reject, Explanation: "forbidden"},
		}, []string{"Mutator", "Slow", "PodSecurity", "2 more plugins"}},
		{"nothing", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := summarizeUnchanged(tc.in)
			var names []string
			for _, c := range got {
				names = append(names, c.Name)
			}
			if strings.Join(names, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("children %v, want %v", names, tc.want)
			}
			if len(got) == 0 {
				return
			}
			if last := got[len(got)-1]; strings.HasSuffix(last.Name, "more plugins") {
				for _, c := range tc.in {
					if c.Explanation == admittedUnchanged && c.DurationNs < slowPlugin.Nanoseconds() && !strings.Contains(last.Explanation, c.Name) {
						t.Errorf("the summary does not name %s: %q", c.Name, last.Explanation)
					}
				}
			}
		})
	}
	if got := summarizeUnchanged([]record.StageResult{ok("A", 10), ok("B", 20)}); got[0].DurationNs != 30 {
		t.Errorf("the summary's duration %d, want the sum 30", got[0].DurationNs)
	}
}
