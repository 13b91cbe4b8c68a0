package apiserver

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// TestCompactionsExpired: a list's revision is known gone from the
// apiserver's watch cache only past a compaction kproxy saw at least
// cacherCompactLag before the request.
func TestCompactionsExpired(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	c := &compactions{clock: clk}
	c.add(100)
	first := clk.Now()
	clk.Step(time.Minute)
	c.add(200)
	c.add(150) // older than the last: nothing
	second := clk.Now()
	for _, tc := range []struct {
		name    string
		rv      int64
		arrival time.Time
		want    bool
	}{
		{"past the first compaction, long after it", 50, first.Add(cacherCompactLag), true},
		{"past the first compaction, just after it", 50, first.Add(cacherCompactLag - time.Second), false},
		{"past the second only, just after it", 120, second.Add(time.Second), false},
		{"past the second only, long after it", 120, second.Add(cacherCompactLag + time.Second), true},
		{"not compacted", 250, second.Add(time.Hour), false},
		{"no arrival (kproxy explain)", 50, time.Time{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, got := c.expired(tc.rv, tc.arrival); got != tc.want {
				t.Errorf("expired(%d) = %v, want %v", tc.rv, got, tc.want)
			}
		})
	}
	var none *compactions
	if _, ok := none.expired(1, second); ok {
		t.Error("no etcd access: expired")
	}
}

func TestCompactionsReachedBefore(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	c := &compactions{clock: clk}
	c.add(100)
	seen := clk.Now()
	for _, tc := range []struct {
		name string
		rv   int64
		t    time.Time
		want bool
	}{
		{"before the compaction's revision, after it was seen", 90, seen.Add(time.Second), true},
		{"at the compaction's revision", 100, seen.Add(time.Second), true},
		{"past it", 101, seen.Add(time.Hour), false},
		{"before it was seen", 90, seen, false},
		{"no time", 90, time.Time{}, false},
	} {
		if got := c.reachedBefore(tc.rv, tc.t); got != tc.want {
			t.Errorf("%s: reachedBefore(%d) = %v, want %v", tc.name, tc.rv, got, tc.want)
		}
	}
	var none *compactions
	if none.reachedBefore(1, seen.Add(time.Hour)) {
		t.Error("no etcd access: reached")
	}
}
