package apiserver

import (
	"strings"
	"testing"
)

// TestReplayReadsShed: a write replay's reads through the apiserver are
// shed past their rate (bursts of twice it), saying which flag bounds
// them, rather than queued behind client-go's throttle.
func TestReplayReadsShed(t *testing.T) {
	s := &ClusterState{}
	if err := s.admitRead(); err != nil {
		t.Fatalf("no limit set: %v", err)
	}
	s.SetReplayReadQPS(1)
	for i := range 2 {
		if err := s.admitRead(); err != nil {
			t.Fatalf("read %d within the burst: %v", i, err)
		}
	}
	err := s.admitRead()
	if err == nil || !strings.Contains(err.Error(), "--replay-apiserver-qps=1") {
		t.Errorf("a read past the burst: %v, want it shed naming --replay-apiserver-qps", err)
	}
}
