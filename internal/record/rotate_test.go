package record

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// stepClock is a clock that moves a second each time it is read.
type stepClock struct{ t time.Time }

func (c *stepClock) now() time.Time { c.t = c.t.Add(time.Second); return c.t }

// readCapture reads every record of a capture file, gzipped or not, and
// fails on a line that is not a whole record.
func readCapture(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		r = zr
	}
	var ids []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var rec Record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("%s: a line that is not a record: %q", path, sc.Text())
		}
		ids = append(ids, rec.ID)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return ids
}

// TestFileSinkRotates: past --capture-maxsize the file is renamed
// NAME-TIME.EXT and a new one started; no record is lost or split, no
// file passes the size, and the backups past --capture-maxbackup go,
// the others compressed with --capture-compress.
func TestFileSinkRotates(t *testing.T) {
	one, _ := json.Marshal(&Record{ID: "r00"})
	line := int64(len(one) + 1)
	for _, tc := range []struct {
		name     string
		rot      Rotation
		files    int // backups left, and the file itself
		complete bool
	}{
		{name: "keep all", rot: Rotation{MaxSize: 3 * line}, files: 4, complete: true},
		{name: "keep 2, compressed", rot: Rotation{MaxSize: 3 * line, MaxBackups: 2, Compress: true}, files: 3},
		{name: "a size below one record: one record a file", rot: Rotation{MaxSize: 1}, files: 10, complete: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "capture.jsonl")
			clock := &stepClock{t: time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)}
			tc.rot.Now = clock.now
			s, err := OpenFile(path, nil, tc.rot)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 10 {
				s.Write(&Record{ID: fmt.Sprintf("r%02d", i)})
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			names, _ := filepath.Glob(filepath.Join(dir, "*"))
			sort.Strings(names)
			if len(names) != tc.files {
				t.Fatalf("files %v, want %d", names, tc.files)
			}
			var ids []string
			for _, n := range names {
				base := filepath.Base(n)
				switch {
				case base == "capture.jsonl":
				case tc.rot.Compress && strings.HasSuffix(base, ".jsonl.gz"), !tc.rot.Compress && strings.HasSuffix(base, ".jsonl"):
					if _, err := time.Parse(backupTime, strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(base, "capture-"), ".gz"), ".jsonl")); err != nil {
						t.Errorf("rotated file %s: not named capture-%s.jsonl: %v", base, backupTime, err)
					}
				default:
					t.Errorf("unexpected file %s", base)
				}
				if st, _ := os.Stat(n); !strings.HasSuffix(n, ".gz") && st.Size() > max(tc.rot.MaxSize, line) {
					t.Errorf("%s: %d bytes, past --capture-maxsize %d", base, st.Size(), tc.rot.MaxSize)
				}
				got := readCapture(t, n)
				if len(got) == 0 {
					t.Errorf("%s: no records", base)
				}
				if base != "capture.jsonl" {
					ids = append(ids, got...)
				}
			}
			ids = append(ids, readCapture(t, path)...) // the newest last
			if !sort.StringsAreSorted(ids) {
				t.Errorf("records out of order across the files: %v", ids)
			}
			if tc.complete && len(ids) != 10 {
				t.Errorf("%d records across the files, want all 10: %v", len(ids), ids)
			}
			if !tc.complete && (len(ids) == 0 || ids[len(ids)-1] != "r09") {
				t.Errorf("records kept %v: want the newest", ids)
			}
		})
	}
}

// TestFileSinkRotationFails: a rotation that cannot happen (here the
// backup's name is taken) costs no record: it goes to the file as it is,
// past its size, and the failure is logged once, its end too.
func TestFileSinkRotationFails(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "capture.jsonl")
	at := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	taken := filepath.Join(dir, "capture-"+at.Format(backupTime)+".jsonl")
	if err := os.WriteFile(taken, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	now := at
	s, err := OpenFile(path, slog.New(slog.NewTextHandler(&logs, nil)), Rotation{MaxSize: 1, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		s.Write(&Record{ID: fmt.Sprint("r", i)})
	}
	if got := readCapture(t, path); len(got) != 4 {
		t.Errorf("the capture file has %v, want all 4 records", got)
	}
	if n := strings.Count(logs.String(), "capture file not rotated"); n != 1 || !strings.Contains(logs.String(), "exists already") {
		t.Errorf("want the failure logged once, saying why: %s", logs.String())
	}
	// Tried once, not once per record: the next try is rotationRetry on.
	if done, failed := s.Rotations(); done != 0 || failed != 1 {
		t.Errorf("rotations %d, failed %d; want 0 and 1 (no retry before %v)", done, failed, rotationRetry)
	}
	now = now.Add(rotationRetry)
	s.Write(&Record{ID: "r4"})
	if done, failed := s.Rotations(); done != 1 || failed != 1 {
		t.Errorf("rotations %d, failed %d; want 1 and 1", done, failed)
	}
	s.Close()
	if !strings.Contains(logs.String(), "capture file rotating again") {
		t.Errorf("want the recovery logged: %s", logs.String())
	}
	if got := readCapture(t, path); len(got) != 1 || got[0] != "r4" {
		t.Errorf("after the rotation the file has %v, want r4", got)
	}
}

// TestFileSinkPrunesByAge: rotated files older than --capture-maxage go
// when kproxy starts (a previous run left them) and at each rotation; a
// file that merely shares the name's prefix stays.
func TestFileSinkPrunesByAge(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "capture.jsonl")
	now := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	old := filepath.Join(dir, "capture-"+now.Add(-72*time.Hour).Format(backupTime)+".jsonl.gz")
	recent := filepath.Join(dir, "capture-"+now.Add(-time.Hour).Format(backupTime)+".jsonl")
	other := filepath.Join(dir, "capture-notes.jsonl")
	for _, f := range []string{old, recent, other} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s, err := OpenFile(path, nil, Rotation{MaxSize: 1 << 20, MaxAge: 48 * time.Hour, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	for f, want := range map[string]bool{old: false, recent: true, other: true} {
		if _, err := os.Stat(f); (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", filepath.Base(f), err == nil, want)
		}
	}
}
