package logging

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func TestRateLimit(t *testing.T) {
	var out bytes.Buffer
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	log := slog.New(RateLimit(slog.NewTextHandler(&out, nil), 10*time.Second, clk))
	for i := 0; i < 100; i++ {
		log.Info("client certificate rejected", "id", i)
	}
	log.Info("another line")
	log.Warn("client certificate rejected") // another level: its own line
	clk.SetTime(clk.Now().Add(11 * time.Second))
	log.Info("client certificate rejected", "id", 100)

	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{
		`level=INFO msg="client certificate rejected" id=0`,
		`level=INFO msg="another line"`,
		`level=WARN msg="client certificate rejected"`,
		`level=INFO msg="client certificate rejected" id=100 repeated=99`,
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), out.String())
	}
	for i, w := range want {
		if !strings.HasSuffix(lines[i], w) {
			t.Errorf("line %d: %q, want it to end with %q", i, lines[i], w)
		}
	}
}

func TestRateLimitWithAttrsSharesTheTable(t *testing.T) {
	var out bytes.Buffer
	clk := clocktesting.NewFakePassiveClock(time.Now())
	log := slog.New(RateLimit(slog.NewTextHandler(&out, nil), time.Minute, clk))
	log.With("component", "a").Info("x")
	log.With("component", "b").Info("x")
	if n := strings.Count(out.String(), "msg=x"); n != 1 {
		t.Errorf("%d lines, want 1:\n%s", n, out.String())
	}
}

// TestGate: a gated line passes once per window.
func TestGate(t *testing.T) {
	var g Gate
	t0 := time.Unix(1000, 0)
	for _, c := range []struct {
		at   time.Duration
		want bool
	}{{0, true}, {time.Millisecond, false}, {999 * time.Millisecond, false}, {time.Second, true}, {1500 * time.Millisecond, false}, {5 * time.Second, true}} {
		if got := g.Open(t0.Add(c.at), time.Second); got != c.want {
			t.Errorf("at +%v: open %v, want %v", c.at, got, c.want)
		}
	}
}
