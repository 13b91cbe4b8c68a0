package apiserver

import (
	"testing"
	"time"
)

// TestSeenBefore: the last read of a document kproxy had by a time, from
// the few it keeps.
func TestSeenBefore(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 11, 0, 0, 0, time.UTC)
	d := &ServedDocs{}
	if _, ok := d.SeenBefore("/openapi/v3", t0); ok {
		t.Fatal("a read before any was made")
	}
	for i := range seenKept + 2 {
		d.remember("/openapi/v3", Seen{At: t0.Add(time.Duration(i) * time.Second), ETag: string(rune('a' + i))})
	}
	for _, tc := range []struct {
		name string
		at   time.Duration
		want string // ETag; "" for none
	}{
		{"before every read kept", 1 * time.Second, ""},
		{"at a read", 5 * time.Second, "f"},
		{"between two reads", 5*time.Second + time.Millisecond, "f"},
		{"after the last", time.Hour, string(rune('a' + seenKept + 1))},
	} {
		s, ok := d.SeenBefore("/openapi/v3", t0.Add(tc.at))
		if got := map[bool]string{true: s.ETag}[ok]; got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	if _, ok := d.SeenBefore("/openapi/v2", t0.Add(time.Hour)); ok {
		t.Error("a read of another document")
	}
}

// TestSettledBefore: the documents are settled for a request when what
// they list last changed discoverySettle or more before it arrived; a
// change since, or none seen yet (the informers not synced), is not.
func TestSettledBefore(t *testing.T) {
	arrival := time.Date(2026, 12, 4, 14, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		changed time.Time
		want    bool
	}{
		{"changed a minute before", arrival.Add(-time.Minute), true},
		{"changed 10s before", arrival.Add(-10 * time.Second), false},
		{"changed after", arrival.Add(time.Second), false},
		{"no change seen yet", time.Time{}, false},
	} {
		d := &ServedDocs{changed: tc.changed}
		if got := d.SettledBefore(arrival); got != tc.want {
			t.Errorf("%s: SettledBefore = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestServedDocsKeep: a read is cached only if made once the documents
// had settled after their last change; one made while the aggregator was
// still updating them, or begun before a change, is read again next time.
func TestServedDocsKeep(t *testing.T) {
	changed := time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		read time.Time
		kept bool
	}{
		{"read a second after the change", changed.Add(time.Second), false},
		{"read just inside the settle window", changed.Add(discoverySettle), false},
		{"read after it", changed.Add(discoverySettle + time.Second), true},
		{"read begun before the change", changed.Add(-time.Minute), false},
	} {
		d := &ServedDocs{changed: changed, docs: map[string]cachedDoc{}}
		d.keep("/openapi/v3 application/json", cachedDoc{ServedDoc: ServedDoc{Status: 200}, read: tc.read})
		if _, got := d.docs["/openapi/v3 application/json"]; got != tc.kept {
			t.Errorf("%s: kept %v, want %v", tc.name, got, tc.kept)
		}
	}
}
