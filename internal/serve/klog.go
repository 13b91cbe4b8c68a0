package serve

import (
	"context"
	"log/slog"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
)

// RouteKlog sends the log lines of the apiserver code the replay runs
// (klog) to kproxy's logger at debug level: "Unable to authenticate the
// request" is the replay doing its job, not a kproxy error.
func RouteKlog(log *slog.Logger) {
	klog.SetLogger(logr.FromSlogHandler(debugOnly{log.Handler()}))
}

// debugOnly lowers every record to debug.
type debugOnly struct{ h slog.Handler }

func (d debugOnly) Enabled(ctx context.Context, _ slog.Level) bool {
	return d.h.Enabled(ctx, slog.LevelDebug)
}

func (d debugOnly) Handle(ctx context.Context, r slog.Record) error {
	if !d.h.Enabled(ctx, slog.LevelDebug) {
		return nil // logr's Error bypasses Enabled
	}
	r.Level = slog.LevelDebug
	return d.h.Handle(ctx, r)
}

func (d debugOnly) WithAttrs(as []slog.Attr) slog.Handler { return debugOnly{d.h.WithAttrs(as)} }
func (d debugOnly) WithGroup(g string) slog.Handler       { return debugOnly{d.h.WithGroup(g)} }
