package apiserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestReadFailedWhy: a read of etcd out of time says etcd is slow,
// stalled or out of reach; a read through the apiserver, or another
// failure, says only what failed.
func TestReadFailedWhy(t *testing.T) {
	late := fmt.Errorf("etcd get: %w", context.DeadlineExceeded)
	for _, tc := range []struct {
		name string
		read StorageRead
		etcd bool
	}{
		{"etcd out of time", StorageRead{Path: "/api/v1/namespaces/a/configmaps/b", Err: late}, true},
		{"through the apiserver, out of time", StorageRead{Path: "/api/v1/namespaces/a/configmaps/b", Err: late, NoEtcd: " (kproxy was not given --etcd-servers)"}, false},
		{"etcd refusing", StorageRead{Path: "/api/v1/namespaces/a/configmaps/b", Err: errors.New("etcdserver: permission denied")}, false},
	} {
		got := readFailedWhy(tc.read)
		if !strings.HasPrefix(got, "could not read "+tc.read.Path+": "+tc.read.Err.Error()) {
			t.Errorf("%s: %q does not say what failed", tc.name, got)
		}
		if strings.Contains(got, "kproxy's read of etcd did not finish") != tc.etcd {
			t.Errorf("%s: %q, naming etcd out of time: want %v", tc.name, got, tc.etcd)
		}
	}
}
