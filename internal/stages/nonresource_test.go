package stages

import (
	"testing"
	"time"
)

// TestChangedSinceArrival: an OpenAPI index last modified at or after a
// request's arrival (an HTTP date, whole seconds; a second more for the
// clocks) may not be what the apiserver answered from.
func TestChangedSinceArrival(t *testing.T) {
	arrival := time.Date(2026, 12, 2, 11, 0, 10, 500_000_000, time.UTC)
	for _, tc := range []struct {
		name    string
		mod     time.Time
		arrival time.Time
		want    bool
	}{
		{"long before", arrival.Add(-time.Minute), arrival, false},
		{"two seconds before", arrival.Add(-2 * time.Second), arrival, false},
		{"in the same second", arrival.Truncate(time.Second), arrival, true},
		{"after", arrival.Add(3 * time.Second), arrival, true},
		{"no arrival (kproxy explain)", arrival.Add(time.Hour), time.Time{}, false},
	} {
		if got := changedSinceArrival(tc.mod, tc.arrival); got != tc.want {
			t.Errorf("%s: changedSinceArrival = %v, want %v", tc.name, got, tc.want)
		}
	}
}
