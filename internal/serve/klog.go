package serve

import (
	"context"
	"log/slog"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/record"
)

// RouteKlog sends the log lines of the apiserver code the replay runs
// (klog) to kproxy's logger at debug level: "Unable to authenticate the
// request" is the replay doing its job, not a kproxy error.
func RouteKlog(log *slog.Logger) {
	klog.SetLogger(logr.FromSlogHandler(debugOnly{log.Handler()}))
}

// debugOnly lowers every record to debug, and keeps out of it the values
// the apiserver's errors quote in Go's rendering (a server-side apply's
// "got &value.valueUnstructured{Value:...}", a Secret's data: its
// "Unhandled Error" lines quote them; found by a probe).
type debugOnly struct{ h slog.Handler }

func (d debugOnly) Enabled(ctx context.Context, _ slog.Level) bool {
	return d.h.Enabled(ctx, slog.LevelDebug)
}

func (d debugOnly) Handle(ctx context.Context, r slog.Record) error {
	if !d.h.Enabled(ctx, slog.LevelDebug) {
		return nil // logr's Error bypasses Enabled
	}
	out := slog.NewRecord(r.Time, slog.LevelDebug, record.RedactEchoes(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(redactAttr(a))
		return true
	})
	return d.h.Handle(ctx, out)
}

// redactAttr applies record.RedactEchoes to an attribute's text:
// a string or an error's message (klog's "err"); other values pass as
// they are.
func redactAttr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, record.RedactEchoes(v.String()))
	case slog.KindAny:
		if err, ok := v.Any().(error); ok {
			return slog.String(a.Key, record.RedactEchoes(err.Error()))
		}
	case slog.KindGroup:
		attrs := v.Group()
		out := make([]any, len(attrs))
		for i, g := range attrs {
			out[i] = redactAttr(g)
		}
		return slog.Group(a.Key, out...)
	}
	return slog.Attr{Key: a.Key, Value: v}
}

func (d debugOnly) WithAttrs(as []slog.Attr) slog.Handler { return debugOnly{d.h.WithAttrs(as)} }
func (d debugOnly) WithGroup(g string) slog.Handler       { return debugOnly{d.h.WithGroup(g)} }
