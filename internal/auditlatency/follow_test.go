package auditlatency

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/servertrace"
)

// The lines of auditLog: 0 a RequestReceived event, 1-3 annotated
// creates, 4 a fast list.
const (
	lineReceived = 0
	lineSlow1    = 1
	lineSlow2    = 2
	lineSlow3    = 3
	lineFast     = 4
)

// follow runs FollowLog on path with a test's ticks: each poll is one
// tick, and returns once everything there was has been read.
type follow struct {
	t     *testing.T
	ticks chan time.Time
	idle  chan struct{}
	got   chan servertrace.Observation
	stats *Stats
	done  chan error
}

func startFollow(t *testing.T, path string, o FollowOptions) *follow {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f := &follow{t: t, ticks: make(chan time.Time), idle: make(chan struct{}), got: make(chan servertrace.Observation, 64),
		stats: &Stats{}, done: make(chan error, 1)}
	o.Ticks, o.Stats = f.ticks, f.stats
	o.Idle = func() {
		select {
		case f.idle <- struct{}{}:
		case <-ctx.Done():
		}
	}
	go func() { f.done <- FollowLog(ctx, path, func(o servertrace.Observation) { f.got <- o }, o) }()
	t.Cleanup(func() {
		cancel()
		if err := <-f.done; err != nil {
			t.Errorf("FollowLog: %v", err)
		}
	})
	f.waitIdle()
	return f
}

func (f *follow) waitIdle() {
	f.t.Helper()
	select {
	case <-f.idle:
	case err := <-f.done:
		f.t.Fatalf("FollowLog ended: %v", err)
	case <-time.After(10 * time.Second):
		f.t.Fatal("FollowLog did not finish reading")
	}
}

func (f *follow) poll() {
	f.t.Helper()
	f.ticks <- time.Now()
	f.waitIdle()
}

// expect checks the audit IDs offered since the last call, in order.
func (f *follow) expect(ids ...string) {
	f.t.Helper()
	var got []string
	for len(f.got) > 0 {
		got = append(got, (<-f.got).AuditID)
	}
	if strings.Join(got, " ") != strings.Join(ids, " ") {
		f.t.Errorf("offered %v, want %v", got, ids)
	}
}

func (f *follow) counts(want Counts) {
	f.t.Helper()
	if got := f.stats.Counts(); got != want {
		f.t.Errorf("counts %+v, want %+v", got, want)
	}
}

// fixture returns the lines of auditLog, each with its newline, and the
// audit IDs of the annotated ones.
func fixture(t *testing.T) (lines []string, ids map[int]string) {
	t.Helper()
	ids = map[int]string{}
	for i, l := range logLines(t) {
		lines = append(lines, string(l)+"\n")
		if i >= lineSlow1 && i <= lineSlow3 {
			ids[i] = string(realEvent(t, i).AuditID)
		}
	}
	return lines, ids
}

func appendTo(t *testing.T, path string, s ...string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(strings.Join(s, "")); err != nil {
		t.Fatal(err)
	}
}

func TestFollowAppend(t *testing.T) {
	lines, ids := fixture(t)
	path := filepath.Join(t.TempDir(), "audit.log")
	appendTo(t, path, lines[lineReceived], lines[lineSlow1])
	f := startFollow(t, path, FollowOptions{})
	f.expect() // from the end: what was there is old
	appendTo(t, path, lines[lineSlow2], lines[lineFast], lines[lineSlow3][:100])
	f.poll()
	f.expect(ids[lineSlow2])
	appendTo(t, path, lines[lineSlow3][100:])
	f.poll()
	f.expect(ids[lineSlow3])
	f.counts(Counts{Events: 3, Observations: 2})
}

func TestFollowFromStart(t *testing.T) {
	_, ids := fixture(t)
	f := startFollow(t, auditLog, FollowOptions{FromStart: true})
	f.expect(ids[lineSlow1], ids[lineSlow2], ids[lineSlow3])
	f.counts(Counts{Events: 5, Observations: 3})
}

func TestFollowTruncation(t *testing.T) {
	lines, ids := fixture(t)
	path := filepath.Join(t.TempDir(), "audit.log")
	appendTo(t, path)
	f := startFollow(t, path, FollowOptions{})
	appendTo(t, path, lines[lineReceived], lines[lineSlow1], lines[lineFast])
	f.poll()
	f.expect(ids[lineSlow1])
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	appendTo(t, path, lines[lineSlow2])
	f.poll()
	f.expect(ids[lineSlow2])
}

// TestFollowRotation rotates as the apiserver's lumberjack does: the file
// renamed, a new one created at the path.
func TestFollowRotation(t *testing.T) {
	lines, ids := fixture(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	appendTo(t, path)
	f := startFollow(t, path, FollowOptions{})
	appendTo(t, path, lines[lineSlow1])
	f.poll()
	f.expect(ids[lineSlow1])
	// Written before the rotation, not read yet: still read, from the
	// old file, before the new one.
	appendTo(t, path, lines[lineSlow2])
	if err := os.Rename(path, filepath.Join(dir, "audit-2026-12-01T10-00-00.000.log")); err != nil {
		t.Fatal(err)
	}
	appendTo(t, path, lines[lineSlow3])
	f.poll()
	f.expect(ids[lineSlow2], ids[lineSlow3])

	// Removed, then created again: nothing lost either.
	if err := os.Rename(path, filepath.Join(dir, "audit-2026-12-01T10-00-01.000.log")); err != nil {
		t.Fatal(err)
	}
	f.poll()
	appendTo(t, path, lines[lineSlow1])
	f.poll()
	f.expect(ids[lineSlow1])
	f.counts(Counts{Events: 4, Observations: 4})
}

func TestFollowWaitsForTheFile(t *testing.T) {
	lines, ids := fixture(t)
	path := filepath.Join(t.TempDir(), "audit.log")
	f := startFollow(t, path, FollowOptions{})
	f.poll()
	appendTo(t, path, lines[lineSlow1])
	f.poll() // a file that appears is new: read from its start
	f.expect(ids[lineSlow1])
}

func TestFollowSkipsWhatIsNotAnEvent(t *testing.T) {
	lines, ids := fixture(t)
	path := filepath.Join(t.TempDir(), "audit.log")
	appendTo(t, path)
	f := startFollow(t, path, FollowOptions{MaxLine: len(lines[lineSlow1]) + 100})
	legacy := `2026-12-01T09:52:15.991285Z AUDIT: id="768d193f" stage="ResponseComplete" ip="127.0.0.1" method="create" user="admin"` + "\n"
	broken := strings.Replace(lines[lineSlow2], `"kind":"Event"`, `"kind":"Event`, 1)
	// A real annotated event, but over MaxLine.
	long := strings.Replace(lines[lineSlow3], `"level":"Metadata"`, `"level":"Metadata","pad":"`+strings.Repeat("x", 200)+`"`, 1)
	appendTo(t, path, "not json\n", legacy, "\n", broken, long, lines[lineSlow1], `{"kind":"Policy","apiVersion":"audit.k8s.io/v1","annotations":{"apiserver.latency.k8s.io/total":"1s"}}`+"\n", lines[lineFast])
	f.poll()
	f.expect(ids[lineSlow1])
	f.counts(Counts{Events: 2, Observations: 1, Skipped: 5})
}

func TestFollowRefuses(t *testing.T) {
	dir := t.TempDir()
	err := FollowLog(context.Background(), dir, func(servertrace.Observation) {}, FollowOptions{Ticks: make(chan time.Time)})
	if err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("following a directory: %v", err)
	}
	if os.Geteuid() == 0 {
		return // root reads anything
	}
	path := filepath.Join(dir, "audit.log")
	if err := os.WriteFile(path, nil, 0o000); err != nil {
		t.Fatal(err)
	}
	err = FollowLog(context.Background(), path, func(servertrace.Observation) {}, FollowOptions{Ticks: make(chan time.Time)})
	if err == nil || !strings.Contains(err.Error(), "run kproxy as that user") {
		t.Errorf("following an unreadable file: %v", err)
	}
}

// TestFollowLongLineAcrossReads: a line longer than one read is put
// together.
func TestFollowLongLineAcrossReads(t *testing.T) {
	lines, ids := fixture(t)
	path := filepath.Join(t.TempDir(), "audit.log")
	appendTo(t, path)
	f := startFollow(t, path, FollowOptions{})
	pad := bytes.Repeat([]byte("x"), 3*readChunk)
	slow := strings.Replace(lines[lineSlow1], `"level":"Metadata"`, `"level":"Metadata","pad":"`+string(pad)+`"`, 1)
	appendTo(t, path, slow)
	f.poll()
	f.expect(ids[lineSlow1])
}
