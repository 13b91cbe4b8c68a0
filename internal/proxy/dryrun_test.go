package proxy

import "testing"

// TestDryRunQuery: only dryRun=All asks for a dry run (the apiserver
// refuses any other value before it writes anything).
func TestDryRunQuery(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want bool
	}{
		{"", false},
		{"dryRun=All", true},
		{"fieldManager=kubectl&dryRun=All", true},
		{"dryRun=", false},
		{"dryRun=Nope", false},
		{"fieldValidation=Strict", false},
		{"dryRun=%zz", false},
	} {
		if got := dryRunQuery(tc.raw); got != tc.want {
			t.Errorf("dryRunQuery(%q) = %v, want %v", tc.raw, got, tc.want)
		}
	}
}
