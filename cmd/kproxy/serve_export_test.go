package main

import (
	"errors"
	"strings"
	"testing"
)

// TestExportFailed: an export error names what was being exported, and
// what to check.
func TestExportFailed(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{errors.New(`failed to send logs to http://127.0.0.1:4318/v1/logs: 404 Not Found`), "record (OTLP logs) export failed"},
		{errors.New(`traces export: Post "http://127.0.0.1:4318/v1/traces": dial tcp: connection refused`), "trace export failed"},
	} {
		if got := exportFailed(tc.err); !strings.HasPrefix(got, tc.want) || !strings.Contains(got, "check --otlp-") {
			t.Errorf("exportFailed(%v) = %q, want it to begin %q and name the flag to check", tc.err, got, tc.want)
		}
	}
}
