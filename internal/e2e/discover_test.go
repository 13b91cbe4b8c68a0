package e2e

import (
	"context"
	"log/slog"
	"os"
	"testing"

	"github.com/kproxy/kproxy/internal/serve"
)

// TestDiscover reads the apiserver's version and feature gates with
// kproxy's own (least-privileged) identity.
func TestDiscover(t *testing.T) {
	d := serve.Discover(context.Background(), cluster.UserConfig("kproxy"), slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if d.Version != "v1.37.2" {
		t.Errorf("version %q, want v1.37.2", d.Version)
	}
	if on, ok := d.Features["ConstrainedImpersonation"]; !ok || !on {
		t.Errorf("feature gates from /metrics: ConstrainedImpersonation = %v, %v (read %d gates)", on, ok, len(d.Features))
	}
}
