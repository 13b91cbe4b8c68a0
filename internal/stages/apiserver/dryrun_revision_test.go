package apiserver

import "testing"

// TestDryRunRevision: a dry run the apiserver admitted is read at the
// resourceVersion it answered with when the object has changed since,
// and as it is otherwise.
func TestDryRunRevision(t *testing.T) {
	for _, tc := range []struct {
		name         string
		found        bool
		rv, answered string
		want         string
	}{
		{"changed since: read at the answer's", true, "489", "488", "488"},
		{"unchanged: the latest", true, "488", "488", ""},
		{"a create's answer names none", true, "489", "", ""},
		{"deleted since: read at the answer's", false, "", "488", "488"},
		{"older than the answer: the latest", true, "480", "488", ""},
		{"not a revision", true, "489", "x", ""},
	} {
		if got := dryRunRevision(tc.found, tc.rv, tc.answered); got != tc.want {
			t.Errorf("%s: dryRunRevision(%v, %q, %q) = %q, want %q", tc.name, tc.found, tc.rv, tc.answered, got, tc.want)
		}
	}
}
