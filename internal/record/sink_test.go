package record

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestFileSinkConcurrent writes from many goroutines and expects every
// line to be one whole record.
func TestFileSinkConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.jsonl")
	s, err := OpenFile(path, nil, Rotation{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			s.Write(&Record{ID: string(rune('a' + i%26)), Stages: []StageResult{{Name: "authentication", Outcome: Skip}}})
		}(i)
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %d: %v", n, err)
		}
		n++
	}
	if n != 50 {
		t.Fatalf("%d records, want 50", n)
	}
}

// TestOpenStdout: --capture - writes each record as a line of kproxy's
// standard output (here a pipe standing in for it).
func TestOpenStdout(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	t.Cleanup(func() { os.Stdout = stdout })
	s, err := OpenFile(Stdout, slog.New(slog.DiscardHandler), Rotation{})
	if err != nil {
		t.Fatal(err)
	}
	s.Write(&Record{ID: "one"})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(got), `{"id":"one",`) || strings.Count(string(got), "\n") != 1 || !strings.HasSuffix(string(got), "\n") {
		t.Fatalf("standard output got %q, want one record's line", got)
	}
}

func TestOpenFileError(t *testing.T) {
	_, err := OpenFile(filepath.Join(t.TempDir(), "missing-dir", "c.jsonl"), nil, Rotation{})
	if err == nil {
		t.Fatal("want an error for a missing directory")
	}
}

func TestStreamDropsForSlowSubscriber(t *testing.T) {
	s := NewStream()
	ch, dropped, cancel := s.Subscribe(1)
	defer cancel()
	s.Write(&Record{ID: "1"})
	s.Write(&Record{ID: "2"})
	if r := <-ch; r.ID != "1" {
		t.Fatalf("got %s", r.ID)
	}
	if dropped() != 1 {
		t.Fatalf("dropped %d, want 1", dropped())
	}
}

// fullDisk is a capture file on a disk that fills up: writes past room
// write what fits and fail, as a real ENOSPC does.
type fullDisk struct {
	bytes.Buffer
	room     int
	truncErr error // Truncate fails with it, when set
}

func (d *fullDisk) Write(b []byte) (int, error) {
	if d.Len()+len(b) <= d.room {
		return d.Buffer.Write(b)
	}
	n := max(d.room-d.Len(), 0)
	d.Buffer.Write(b[:n])
	return n, syscall.ENOSPC
}
func (d *fullDisk) Stat() (os.FileInfo, error) { return sizeInfo(d.Len()), nil }
func (d *fullDisk) Truncate(n int64) error {
	if d.truncErr != nil {
		return d.truncErr
	}
	d.Buffer.Truncate(int(n))
	return nil
}
func (d *fullDisk) Close() error { return nil }

type sizeInfo int

func (s sizeInfo) Name() string       { return "capture" }
func (s sizeInfo) Size() int64        { return int64(s) }
func (s sizeInfo) Mode() os.FileMode  { return 0o600 }
func (s sizeInfo) ModTime() time.Time { return time.Time{} }
func (s sizeInfo) IsDir() bool        { return false }
func (s sizeInfo) Sys() any           { return nil }

// TestFileSinkFullDisk: a full disk drops records without leaving a
// partial line, says so once, and writing resumes when space returns.
func TestFileSinkFullDisk(t *testing.T) {
	var logs bytes.Buffer
	one, _ := json.Marshal(&Record{ID: "r0"})
	disk := &fullDisk{room: 3*(len(one)+1) + len(one)/2} // three records and half of one
	s := newFileSink(disk, "c.jsonl", slog.New(slog.NewTextHandler(&logs, nil)))
	for i := 0; i < 10; i++ {
		s.Write(&Record{ID: fmt.Sprint("r", i)})
	}
	lines := strings.Split(strings.TrimSuffix(disk.String(), "\n"), "\n")
	for _, l := range lines {
		var r Record
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("a partial line is left: %q (%v)", l, err)
		}
	}
	written := len(lines)
	if written == 0 || written == 10 || s.Lost() != uint64(10-written) {
		t.Fatalf("%d written, %d lost: want some of each, adding up to 10", written, s.Lost())
	}
	if n := strings.Count(logs.String(), "capture write failed"); n != 1 {
		t.Errorf("the failure was logged %d times, want once:\n%s", n, logs.String())
	}

	disk.room = 1 << 20 // space returns
	s.Write(&Record{ID: "after"})
	if !strings.Contains(disk.String(), `"id":"after"`) || !strings.HasSuffix(disk.String(), "}\n") {
		t.Fatalf("no record written once space returned:\n%s", disk.String())
	}
	if !strings.Contains(logs.String(), "capture writing again") || !strings.Contains(logs.String(), fmt.Sprintf("recordsLost=%d", 10-written)) {
		t.Errorf("the recovery is not logged with the count:\n%s", logs.String())
	}
}

// wholeLines fails unless every line of the disk is a whole record, and
// returns their IDs.
func wholeLines(t *testing.T, d *fullDisk) []string {
	t.Helper()
	if d.Len() > 0 && !strings.HasSuffix(d.String(), "\n") {
		t.Fatalf("the file ends in a partial line:\n%s", d.String())
	}
	var ids []string
	for _, l := range strings.Split(strings.TrimSuffix(d.String(), "\n"), "\n") {
		if l == "" {
			continue
		}
		var r Record
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("not a whole record: %q (%v)", l, err)
		}
		ids = append(ids, r.ID)
	}
	return ids
}

// TestFileSinkTruncateFails: when even the take-back fails (a full
// copy-on-write filesystem), no record is appended to the partial line:
// they are dropped (and counted) until it is removed, which is said once.
func TestFileSinkTruncateFails(t *testing.T) {
	var logs bytes.Buffer
	one, _ := json.Marshal(&Record{ID: "r0"})
	disk := &fullDisk{room: 2*(len(one)+1) + len(one)/2, truncErr: syscall.ENOSPC}
	s := newFileSink(disk, "c.jsonl", slog.New(slog.NewTextHandler(&logs, nil)))
	for i := 0; i < 6; i++ {
		s.Write(&Record{ID: fmt.Sprint("r", i)})
	}
	if s.Lost() != 4 {
		t.Errorf("%d lost, want 4", s.Lost())
	}
	disk.room = 1 << 20 // space returns, but the filesystem still refuses to shrink the file
	s.Write(&Record{ID: "stuck"})
	if strings.Contains(disk.String(), `"stuck"`) {
		t.Fatalf("a record was appended to a partial line:\n%s", disk.String())
	}
	disk.truncErr = nil // and now it does not
	s.Write(&Record{ID: "after"})
	if ids := wholeLines(t, disk); strings.Join(ids, ",") != "r0,r1,after" {
		t.Errorf("records %v, want r0, r1, after", ids)
	}
	for msg, n := range map[string]int{"capture write failed": 1, "cannot remove a partial line": 1, "capture writing again": 1, "recordsLost=5": 1} {
		if got := strings.Count(logs.String(), msg); got != n {
			t.Errorf("%q logged %d times, want %d:\n%s", msg, got, n, logs.String())
		}
	}
}

// TestFileSinkPartialCutAway: a partial line that something else cut
// away (the file truncated or rotated meanwhile) does not stop the sink.
func TestFileSinkPartialCutAway(t *testing.T) {
	one, _ := json.Marshal(&Record{ID: "r0"})
	disk := &fullDisk{room: len(one) + 1 + len(one)/2, truncErr: syscall.EIO}
	s := newFileSink(disk, "c.jsonl", nil)
	s.Write(&Record{ID: "r0"})
	s.Write(&Record{ID: "r1"}) // partial, not taken back
	disk.Reset()               // rotated by copy and truncate
	disk.room, disk.truncErr = 1<<20, nil
	s.Write(&Record{ID: "after"})
	if ids := wholeLines(t, disk); strings.Join(ids, ",") != "after" {
		t.Errorf("records %v, want after", ids)
	}
}

// slowDisk is a capture file whose first write waits for release, and
// which counts its writes.
type slowDisk struct {
	fullDisk
	mu      sync.Mutex
	writes  int
	entered chan struct{}
	release chan struct{}
}

func (d *slowDisk) Write(b []byte) (int, error) {
	d.mu.Lock()
	d.writes++
	first := d.writes == 1
	d.mu.Unlock()
	if first {
		close(d.entered)
		<-d.release
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.fullDisk.Write(b)
}

// TestFileSinkGroupCommit: the records finished while a write is under
// way share the next write, whole lines each, every one of them written
// once every Write has returned.
func TestFileSinkGroupCommit(t *testing.T) {
	disk := &slowDisk{fullDisk: fullDisk{room: 1 << 20}, entered: make(chan struct{}), release: make(chan struct{})}
	s := newFileSink(disk, "c.jsonl", nil)
	var wg sync.WaitGroup
	wg.Go(func() { s.Write(&Record{ID: "first"}) })
	<-disk.entered
	for i := range 20 {
		wg.Go(func() { s.Write(&Record{ID: fmt.Sprint("r", i)}) })
	}
	// The twenty queue behind the first write, which has not returned.
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.q.mu.Lock()
		n := s.q.n
		s.q.mu.Unlock()
		if n == 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d records queued behind the write; want 20", n)
		}
		time.Sleep(time.Millisecond)
	}
	close(disk.release)
	wg.Wait()
	ids := wholeLines(t, &disk.fullDisk)
	if len(ids) != 21 || ids[0] != "first" {
		t.Fatalf("records %v: want first, then the 20 others", ids)
	}
	if disk.writes != 2 {
		t.Errorf("%d writes for 21 records; want 2 (the first, then the 20 queued behind it)", disk.writes)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestFileSinkFollowsItsPath: a capture file moved away (logrotate
// without copytruncate) or removed underneath the sink is replaced by a
// new file at its path within a pathCheck, and the records after go
// there (they had gone on to the moved or deleted file).
func TestFileSinkFollowsItsPath(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "capture.jsonl")
	var logs bytes.Buffer
	s, err := OpenFile(path, slog.New(slog.NewTextHandler(&logs, nil)), Rotation{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	s.now = func() time.Time { return now }
	ids := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			return err.Error()
		}
		var out []string
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var r Record
			if json.Unmarshal([]byte(l), &r) == nil {
				out = append(out, r.ID)
			}
		}
		return strings.Join(out, ",")
	}
	s.Write(&Record{ID: "a"})
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	s.Write(&Record{ID: "b"}) // within pathCheck of the last look: the old file
	now = now.Add(2 * pathCheck)
	s.Write(&Record{ID: "c"})
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * pathCheck)
	s.Write(&Record{ID: "d"})
	now = now.Add(2 * pathCheck)
	s.Write(&Record{ID: "e"}) // the path names the sink's file: kept
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := ids(path + ".1"); got != "a,b" {
		t.Errorf("the moved file holds %q, want a,b", got)
	}
	if got := ids(path); got != "d,e" {
		t.Errorf("the file at the path holds %q, want d,e (c went to the file removed)", got)
	}
	if n := strings.Count(logs.String(), "capture file was moved or removed"); n != 2 {
		t.Errorf("%d log lines saying the file was replaced, want 2:\n%s", n, logs.String())
	}
}
