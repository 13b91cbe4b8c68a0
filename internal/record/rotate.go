package record

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// Rotation bounds a capture file the way kube-apiserver's
// --audit-log-maxsize, --audit-log-maxbackup, --audit-log-maxage and
// --audit-log-compress bound its audit log, with the same file names:
// past MaxSize the file is renamed to NAME-2006-01-02T15-04-05.000.EXT
// (the time of the rotation, UTC) and a new one is started at the path,
// which a reader following the path (kproxy flows --follow, kproxy tui)
// notices as a rotation. The apiserver uses lumberjack for this; its
// writer hides the file, and the sink needs the file itself to take back
// a partial line, so the sink rotates on its own, by the same rules.
// Without MaxSize nothing rotates.
type Rotation struct {
	// MaxSize is the size in bytes a file may reach before the record
	// that would pass it goes to a new file; 0 never rotates.
	MaxSize int64
	// MaxBackups is how many rotated files are kept (the newest); 0
	// keeps them all.
	MaxBackups int
	// MaxAge removes rotated files older than this, by the time in their
	// names; 0 keeps them.
	MaxAge time.Duration
	// Compress gzips each rotated file (NAME-TIME.EXT.gz), in the
	// background: kproxy flows and kproxy tui read it as it is.
	Compress bool
	// Now is the clock rotated files are named by (time.Now if nil).
	Now func() time.Time
}

// backupTime is the time format of a rotated file's name (lumberjack's,
// as kube-apiserver names its rotated audit logs).
const backupTime = "2006-01-02T15-04-05.000"

// rotator renames the full capture file and, in the background, compresses
// and prunes the rotated ones, one batch after another.
type rotator struct {
	Rotation
	path string
	mill chan struct{} // a rotation happened: compress and prune
	done sync.WaitGroup
	errs func(what string, err error)
}

func newRotator(path string, r Rotation, errs func(string, error)) *rotator {
	if r.Now == nil {
		r.Now = time.Now
	}
	ro := &rotator{Rotation: r, path: path, mill: make(chan struct{}, 1), errs: errs}
	ro.done.Add(1)
	go ro.run()
	if r.Compress || r.MaxBackups > 0 || r.MaxAge > 0 {
		ro.mill <- struct{}{} // what an earlier kproxy left
	}
	return ro
}

// due reports that a record of n bytes may not be appended to a file of
// size bytes.
func (r *rotator) due(size int64, n int) bool {
	return r != nil && r.MaxSize > 0 && size > 0 && size+int64(n) > r.MaxSize
}

// rotate renames the capture file to its backup name, which it returns.
// The caller opens a new one at the path, then calls rotated.
func (r *rotator) rotate() (string, error) {
	dir, name := filepath.Split(r.path)
	ext := filepath.Ext(name)
	backup := filepath.Join(dir, strings.TrimSuffix(name, ext)+"-"+r.Now().UTC().Format(backupTime)+ext)
	if _, err := os.Lstat(backup); err == nil {
		return "", fmt.Errorf("rotate %s: %s exists already (two rotations in one millisecond)", r.path, backup)
	}
	if err := os.Rename(r.path, backup); err != nil {
		return "", fmt.Errorf("rotate %s: %w", r.path, err)
	}
	return backup, nil
}

// rotated has the mill compress and prune.
func (r *rotator) rotated() {
	select {
	case r.mill <- struct{}{}:
	default: // the mill will see this one too
	}
}

// close waits for the compression and pruning under way.
func (r *rotator) close() {
	if r == nil {
		return
	}
	close(r.mill)
	r.done.Wait()
}

func (r *rotator) run() {
	defer r.done.Done()
	for range r.mill {
		r.millOnce()
	}
}

// backupFile is a rotated capture file, by the time in its name.
type backupFile struct {
	path string
	at   time.Time
	gz   bool
}

// backups lists the rotated files of the capture file, newest first.
func (r *rotator) backups() ([]backupFile, error) {
	dir, name := filepath.Split(r.path)
	if dir == "" {
		dir = "."
	}
	ext := filepath.Ext(name)
	prefix := strings.TrimSuffix(name, ext) + "-"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []backupFile
	for _, e := range entries {
		n := e.Name()
		if !e.Type().IsRegular() || !strings.HasPrefix(n, prefix) {
			continue
		}
		stamp, gz := strings.TrimPrefix(n, prefix), false
		if s, ok := strings.CutSuffix(stamp, ext+".gz"); ok {
			stamp, gz = s, true
		} else if s, ok := strings.CutSuffix(stamp, ext); ok {
			stamp = s
		} else {
			continue
		}
		at, err := time.Parse(backupTime, stamp)
		if err != nil {
			continue // another file that shares the prefix
		}
		out = append(out, backupFile{path: filepath.Join(dir, n), at: at, gz: gz})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].at.After(out[j].at) })
	return out, nil
}

// millOnce removes the rotated files past MaxBackups or MaxAge, then
// compresses those left uncompressed.
func (r *rotator) millOnce() {
	files, err := r.backups()
	if err != nil {
		r.errs("list rotated capture files", err)
		return
	}
	var keep []backupFile
	cutoff := time.Time{}
	if r.MaxAge > 0 {
		cutoff = r.Now().Add(-r.MaxAge)
	}
	for i, f := range files {
		if (r.MaxBackups > 0 && i >= r.MaxBackups) || (!cutoff.IsZero() && f.at.Before(cutoff)) {
			if err := os.Remove(f.path); err != nil && !errors.Is(err, os.ErrNotExist) {
				r.errs("remove a rotated capture file", err)
			}
			continue
		}
		keep = append(keep, f)
	}
	if !r.Compress {
		return
	}
	for _, f := range keep {
		if !f.gz {
			if err := compress(f.path); err != nil {
				r.errs("compress a rotated capture file", err)
			}
		}
	}
}

// compress gzips src to src.gz and removes src. A .gz half written (kproxy
// stopped) is written again: src is removed only once src.gz is whole.
func compress(src string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := src + ".gz.tmp"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			out.Close()
			os.Remove(tmp)
		}
	}()
	zw := gzip.NewWriter(out)
	if _, err = io.Copy(zw, in); err != nil {
		return err
	}
	if err = zw.Close(); err != nil {
		return err
	}
	if err = out.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, src+".gz"); err != nil {
		return err
	}
	return os.Remove(src)
}
