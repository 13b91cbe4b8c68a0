package auditlatency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"time"

	"github.com/kproxy/kproxy/internal/servertrace"
)

// Defaults of FollowOptions.
const (
	// PollInterval is how often a followed audit log is checked for new
	// lines, truncation and rotation.
	PollInterval = 250 * time.Millisecond
	// DefaultMaxLine bounds one line (one event). Events of level Request
	// or RequestResponse carry bodies and can be large; longer lines are
	// skipped (counted).
	DefaultMaxLine = 16 << 20
)

// readChunk is how much of the file one read takes.
const readChunk = 256 << 10

// marker is in every line worth decoding.
var marker = []byte(AnnotationPrefix)

// FollowOptions tune FollowLog; the zero value is usable.
type FollowOptions struct {
	// Ticks drives the polling; nil makes a ticker of PollInterval.
	Ticks <-chan time.Time
	// Idle, when set, is called each time everything there was has been
	// read and FollowLog waits for the next tick (tests wait for it).
	Idle func()
	// FromStart reads the file as it is from its beginning; by default
	// FollowLog starts at its end, as tail -F -n 0 does: the events
	// already there belong to requests long finished. Files that appear
	// later (rotation) are always read from their beginning.
	FromStart bool
	// MaxLine bounds one line; 0: DefaultMaxLine.
	MaxLine int
	// Stats, when set, counts what is read.
	Stats *Stats
	Log   *slog.Logger
}

// FollowLog follows the apiserver's JSON audit log at path
// (--audit-log-path, with --audit-log-format=json, the default), one
// audit.k8s.io/v1 Event per line, as tail -F does: it reads what is
// appended (a line once its newline is written), reads the file again
// from the start when it shrinks (truncated), finishes the old file and
// reads the new one when the path names another file (the apiserver's
// rotation renames the file and creates a new one), and waits for a file
// that does not exist (yet, or between the two steps of a rotation).
// Each ResponseComplete event with latency annotations is passed to
// offer, on FollowLog's goroutine. Lines that are not audit events are
// skipped and counted (the first one is logged). It returns nil when ctx
// ends, and an error only when the file cannot be read at all.
func FollowLog(ctx context.Context, path string, offer func(servertrace.Observation), o FollowOptions) error {
	if o.MaxLine <= 0 {
		o.MaxLine = DefaultMaxLine
	}
	if o.Stats == nil {
		o.Stats = &Stats{}
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Idle == nil {
		o.Idle = func() {}
	}
	ticks := o.Ticks
	if ticks == nil {
		t := time.NewTicker(PollInterval)
		defer t.Stop()
		ticks = t.C
	}
	f := &follower{path: path, offer: offer, o: o, dec: newDecoder(), buf: make([]byte, readChunk)}
	defer f.close()
	err := f.run(ctx, ticks)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// follower is the audit log being followed.
type follower struct {
	path  string
	offer func(servertrace.Observation)
	o     FollowOptions
	dec   *decoder

	f    *os.File
	info os.FileInfo // f's, to tell when the path names another file
	off  int64       // how far f has been read
	buf  []byte
	// partial is a line whose newline has not been read yet; overlong is
	// set while the rest of a line too long to keep is being skipped.
	partial  []byte
	overlong bool
	// gone is set while the path does not exist (it was said once);
	// statErr is the last failure to stat it (said once).
	gone    bool
	statErr string
	// warned is set once a skipped line has been logged.
	warned bool
}

func (f *follower) close() {
	if f.f != nil {
		f.f.Close()
	}
}

func (f *follower) run(ctx context.Context, ticks <-chan time.Time) error {
	first := true
	for {
		err := f.open(!first || f.o.FromStart)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if first {
			f.o.Log.Info("waiting for the audit log to be created", "path", f.path)
		}
		first = false
		f.o.Idle()
		select {
		case <-ctx.Done():
			return nil
		case <-ticks:
		}
	}
	f.o.Log.Info("following the audit log", "path", f.path, "offset", f.off)
	if err := f.read(); err != nil {
		return err
	}
	for {
		f.o.Idle()
		select {
		case <-ctx.Done():
			return nil
		case <-ticks:
		}
		if err := f.poll(); err != nil {
			return err
		}
	}
}

// open opens the log, at its end unless fromStart.
func (f *follower) open(fromStart bool) error {
	// Stat first: opening a named pipe would block until a writer came.
	if info, err := os.Stat(f.path); err != nil {
		return openError(f.path, err)
	} else if !info.Mode().IsRegular() {
		return fmt.Errorf("the audit log %s is not a regular file: give the file the apiserver's --audit-log-path names "+
			"(for --audit-log-path=-, its standard output, use kproxy's audit webhook instead)", f.path)
	}
	file, err := os.Open(f.path)
	if err != nil {
		return openError(f.path, err)
	}
	info, err := file.Stat()
	if err != nil {
		file.Close()
		return fmt.Errorf("audit log %s: %w", f.path, err)
	}
	var off int64
	if !fromStart {
		if off, err = file.Seek(0, io.SeekEnd); err != nil {
			file.Close()
			return fmt.Errorf("audit log %s: %w", f.path, err)
		}
	}
	f.close()
	f.f, f.info, f.off = file, info, off
	f.partial, f.overlong = f.partial[:0], false
	return nil
}

func openError(path string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("audit log %s does not exist: %w", path, err)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("cannot read the audit log %s: %w (the apiserver creates it readable by its own user only: run kproxy as that user, or give it read access)", path, err)
	}
	return fmt.Errorf("open the audit log %s: %w", path, err)
}

// poll looks at the path once: new lines, truncation, rotation.
func (f *follower) poll() error {
	cur, err := os.Stat(f.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// Removed, or between the rename and the create of a rotation:
		// what was written to the old file is still read.
		if !f.gone {
			f.gone = true
			f.o.Log.Info("the audit log was removed; waiting for it to be created again", "path", f.path)
		}
		return f.read()
	case err != nil:
		if msg := err.Error(); msg != f.statErr {
			f.statErr = msg
			f.o.Log.Warn("cannot check the audit log; retrying", "path", f.path, "error", err)
		}
		return f.read()
	}
	f.statErr, f.gone = "", false
	if !os.SameFile(cur, f.info) {
		// Rotated: finish the old file, then read the new one.
		if err := f.read(); err != nil {
			return err
		}
		f.finish()
		if err := f.open(true); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // gone again; the next poll sees
			}
			return err
		}
		f.o.Log.Info("the audit log was rotated; reading the new file", "path", f.path)
		return f.read()
	}
	if cur.Size() < f.off {
		if _, err := f.f.Seek(0, io.SeekStart); err != nil {
			return fmt.Errorf("the audit log %s was truncated and cannot be read again from the start: %w", f.path, err)
		}
		f.off, f.partial, f.overlong = 0, f.partial[:0], false
		f.o.Log.Info("the audit log was truncated; reading it from the start", "path", f.path)
	}
	return f.read()
}

// read reads the file from where it was left to its current end.
func (f *follower) read() error {
	for {
		n, err := f.f.Read(f.buf)
		if n > 0 {
			f.off += int64(n)
			f.feed(f.buf[:n])
		}
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case err != nil:
			return fmt.Errorf("read the audit log %s: %w", f.path, err)
		case n == 0:
			return nil
		}
	}
}

// feed splits what was read into lines; a line without its newline yet is
// kept for the next read.
func (f *follower) feed(b []byte) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			f.keep(b)
			return
		}
		f.keep(b[:i])
		if !f.overlong {
			f.line(f.partial)
		}
		f.partial, f.overlong = f.partial[:0], false
		b = b[i+1:]
	}
}

// keep holds the start of a line, or drops a line over MaxLine.
func (f *follower) keep(b []byte) {
	if f.overlong {
		return
	}
	if len(f.partial)+len(b) > f.o.MaxLine {
		f.overlong, f.partial = true, f.partial[:0]
		f.skip(fmt.Sprintf("longer than %d MiB (audit at level Metadata, or set --audit-log-truncate-enabled)", f.o.MaxLine>>20))
		return
	}
	f.partial = append(f.partial, b...)
}

// finish takes the last line of a file that will not grow any more, even
// without its newline.
func (f *follower) finish() {
	if !f.overlong && len(f.partial) > 0 {
		f.line(f.partial)
	}
	f.partial, f.overlong = f.partial[:0], false
}

// line reads one line. Only lines that mention a latency annotation are
// decoded; the others are counted as events when they look like one.
func (f *follower) line(l []byte) {
	l = bytes.TrimSpace(l)
	if len(l) == 0 {
		return
	}
	if !bytes.Contains(l, marker) {
		if l[0] == '{' && bytes.Contains(l, []byte(`"auditID"`)) {
			f.o.Stats.events.Add(1)
		} else {
			f.skip("not a JSON audit event (the apiserver must write --audit-log-format=json, the default)")
		}
		return
	}
	evs, err := f.dec.events(l)
	if err != nil || len(evs) != 1 {
		why := "not one audit event"
		if err != nil {
			why = err.Error()
		}
		f.skip(why)
		return
	}
	f.o.Stats.events.Add(1)
	if o, ok := observe(&evs[0]); ok {
		f.o.Stats.observations.Add(1)
		f.offer(o)
	}
}

// skip counts a line that is not an audit event, and logs the first.
func (f *follower) skip(why string) {
	f.o.Stats.skipped.Add(1)
	if !f.warned {
		f.warned = true
		f.o.Log.Warn("skipping audit log lines that are not audit events (counted; only the first is logged)", "path", f.path, "why", why)
		return
	}
	f.o.Log.Debug("skipping an audit log line", "path", f.path, "why", why)
}
