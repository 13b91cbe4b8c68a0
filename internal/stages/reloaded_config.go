package stages

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// reloadedConfig is a configuration file kube-apiserver reloads while it
// runs (--authentication-config, --authorization-config: it checks them
// about once a minute), which kproxy's replay read once, when it started.
// Once the file's content differs from what kproxy read, the stage that
// depends on it says unknown, naming the file, rather than replay the
// configuration the apiserver has let go (found by a probe: a webhook's
// failurePolicy and a JWT claim rule changed, the apiserver answered by
// the new ones, kproxy predicted by the old ones).
type reloadedConfig struct {
	flag, path string
	sum        [sha256.Size]byte
	changed    atomic.Pointer[time.Time]
}

// reloadedCheck is how often kproxy reads a reloaded file again.
const reloadedCheck = 5 * time.Second

// watchReloaded reads path now and then every reloadedCheck until ctx
// ends; nil when path is empty or unreadable (the build that read it
// said why).
func watchReloaded(ctx context.Context, clk clock.PassiveClock, flag, path string) *reloadedConfig {
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	r := &reloadedConfig{flag: flag, path: path, sum: sha256.Sum256(b)}
	go func() {
		t := time.NewTicker(reloadedCheck)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				r.check(clk.Now())
			}
		}
	}()
	return r
}

// check reads the file again and notes when it was first seen changed.
func (r *reloadedConfig) check(now time.Time) {
	if r.changed.Load() != nil {
		return
	}
	b, err := os.ReadFile(r.path)
	if err != nil || sha256.Sum256(b) == r.sum {
		return
	}
	r.changed.Store(&now)
}

// why says the file changed since kproxy read it, or "".
func (r *reloadedConfig) why() string {
	if r == nil {
		return ""
	}
	at := r.changed.Load()
	if at == nil {
		return ""
	}
	return fmt.Sprintf("%s %s changed (kproxy saw it at %s) since kproxy read it at its start: the apiserver reloads it while it runs, "+
		"kproxy does not, so the verdict by the configuration the apiserver now has is not known (restart kproxy to replay with it)",
		r.flag, r.path, at.UTC().Format(time.RFC3339))
}
