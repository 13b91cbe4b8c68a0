package stages

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// TestReloadedConfig: a file the apiserver reloads says nothing while its
// content is what kproxy read at start, and says it changed, naming the
// flag and the fix, once it is not (a rewrite of the same bytes is no
// change).
func TestReloadedConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "authz.yaml")
	if err := os.WriteFile(path, []byte("kind: AuthorizationConfiguration\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no background checks: the test calls check
	now := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	r := watchReloaded(ctx, clocktesting.NewFakePassiveClock(now), "--authorization-config", path)
	r.check(now)
	if why := r.why(); why != "" {
		t.Fatalf("unchanged: %q", why)
	}
	if err := os.WriteFile(path, []byte("kind: AuthorizationConfiguration\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.check(now)
	if why := r.why(); why != "" {
		t.Fatalf("rewritten with the same bytes: %q", why)
	}
	if err := os.WriteFile(path, []byte("kind: AuthorizationConfiguration\nauthorizers: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.check(now.Add(time.Second))
	why := r.why()
	for _, want := range []string{"--authorization-config " + path + " changed", "2026-12-07T10:00:01Z", "restart kproxy"} {
		if !strings.Contains(why, want) {
			t.Errorf("changed: %q lacks %q", why, want)
		}
	}
	if (*reloadedConfig)(nil).why() != "" || watchReloaded(ctx, nil, "--authentication-config", "") != nil {
		t.Error("a flag not given is never changed")
	}
}
