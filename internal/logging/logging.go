// Package logging keeps kproxy's logs readable under load: a line that
// repeats (the same level and message, whatever its attributes) is written
// once per window, and the next one written says how many were held back.
// A rejected client certificate or an unreachable trace collector then
// costs one line every few seconds, not one per request.
package logging

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// DefaultWindow is how long a repeated line stays quiet.
const DefaultWindow = 10 * time.Second

// maxKeys bounds the lines remembered; past it the table starts again.
const maxKeys = 4096

type key struct {
	level slog.Level
	msg   string
}

type seen struct {
	last       time.Time // when it was last written
	suppressed int
}

type state struct {
	mu     sync.Mutex
	window time.Duration
	clock  clock.PassiveClock
	lines  map[key]*seen
}

// RateLimit wraps h so that each (level, message) is written at most once
// per window; the line written after a quiet spell carries
// "repeated=N" for the N held back.
func RateLimit(h slog.Handler, window time.Duration, clk clock.PassiveClock) slog.Handler {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &handler{inner: h, st: &state{window: window, clock: clk, lines: map[key]*seen{}}}
}

type handler struct {
	inner slog.Handler
	st    *state
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	st := h.st
	k := key{r.Level, r.Message}
	now := st.clock.Now()
	st.mu.Lock()
	s, ok := st.lines[k]
	if ok && now.Sub(s.last) < st.window {
		s.suppressed++
		st.mu.Unlock()
		return nil
	}
	if !ok {
		if len(st.lines) >= maxKeys {
			st.lines = map[key]*seen{}
		}
		s = &seen{}
		st.lines[k] = s
	}
	held := s.suppressed
	s.last, s.suppressed = now, 0
	st.mu.Unlock()
	if held > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("repeated", held))
	}
	return h.inner.Handle(ctx, r)
}

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &handler{inner: h.inner.WithAttrs(as), st: h.st}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{inner: h.inner.WithGroup(name), st: h.st}
}

// Gate lets a line through at most once per window, decided before slog
// builds the line: a caller that would log on every request under load
// (a replay shed) asks Open first. Building a record only for the rate
// limiter to drop it (the caller's frames, the attributes) cost about
// 8 µs a request under overload. The zero Gate is open.
type Gate struct{ next atomic.Int64 }

// Open reports whether the line may be written now, and if so closes the
// gate for window.
func (g *Gate) Open(now time.Time, window time.Duration) bool {
	next := g.next.Load()
	return now.UnixNano() >= next && g.next.CompareAndSwap(next, now.Add(window).UnixNano())
}
