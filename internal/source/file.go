package source

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"
)

// PollInterval is how often a followed capture file is checked for new
// lines, truncation and replacement.
const PollInterval = 200 * time.Millisecond

// readChunk is how much of a file one read takes.
const readChunk = 256 << 10

// File reads the capture file at path ("-" reads standard input, until it
// ends). Without follow it reads the file once and ends (Done). With
// follow it behaves as tail -F: it reads what is there, then every
// PollInterval what was appended (a line only once its newline is
// written), starts again from the beginning when the file shrinks
// (truncated), finishes the old file and reads the new one from the start
// when the path names another file (rotated, or removed and created
// again), and waits for a file that does not exist yet. A path that is not
// a regular file (a named pipe, /dev/stdin) is read to its end.
func File(path string, follow bool) Source {
	if path == "-" {
		return Reader("stdin", os.Stdin)
	}
	return &fileSource{path: path, follow: follow}
}

type fileSource struct {
	path   string
	follow bool
	// ticks drives the polling of a followed file; nil makes a ticker of
	// PollInterval. Tests send on it to poll exactly when they mean to.
	ticks <-chan time.Time
	// idle, when set, is called each time the source has said all it had
	// to and waits for the next tick (tests wait for it).
	idle func()
}

func (s *fileSource) Name() string { return s.path }

// Run implements Source.
func (s *fileSource) Run(ctx context.Context, out chan<- Event) error {
	b := &batcher{out: out}
	ticks := s.ticks
	if ticks == nil && s.follow {
		t := time.NewTicker(PollInterval)
		defer t.Stop()
		ticks = t.C
	}
	f, info, err := s.open()
	if errors.Is(err, fs.ErrNotExist) && s.follow {
		if err := b.status(ctx, fmt.Sprintf("waiting for %s to be created", s.path)); err != nil {
			return nil
		}
		for errors.Is(err, fs.ErrNotExist) {
			s.waiting()
			select {
			case <-ctx.Done():
				return nil
			case <-ticks:
			}
			f, info, err = s.open()
		}
	}
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		// A pipe or a device grows until its writer closes it: read it
		// as a stream.
		defer f.Close()
		return (&readerSource{name: s.path, r: f}).Run(ctx, out)
	}
	if gz, err := gzipped(f); err != nil {
		f.Close()
		return fmt.Errorf("capture file %s: %w", s.path, err)
	} else if gz {
		// A capture file rotated with --capture-compress: whole, it no
		// longer grows.
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			return fmt.Errorf("capture file %s: %w (a gzip file cut short? decompress what is there with gunzip -c)", s.path, err)
		}
		return (&readerSource{name: s.path, r: zr}).Run(ctx, out)
	}
	t := &tail{path: s.path, b: b, f: f, info: info, lines: lines{max: MaxLine}, buf: make([]byte, readChunk), idle: s.waiting}
	defer func() { t.f.Close() }()
	err = t.run(ctx, s.follow, ticks)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// gzipped reports a gzip file (its magic number), leaving f at its start.
func gzipped(f *os.File) (bool, error) {
	var magic [2]byte
	n, err := f.ReadAt(magic[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	return n == 2 && magic == [2]byte{0x1f, 0x8b}, nil
}

// waiting calls the idle hook, if any.
func (s *fileSource) waiting() {
	if s.idle != nil {
		s.idle()
	}
}

// open opens the capture file, saying what to do when it cannot.
func (s *fileSource) open() (*os.File, os.FileInfo, error) {
	f, err := os.Open(s.path)
	if err != nil {
		return nil, nil, openError(s.path, err)
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("capture file %s: %w", s.path, err)
	}
	if info.IsDir() {
		f.Close()
		return nil, nil, fmt.Errorf("%s is a directory: give a capture file (the one kproxy serve --capture FILE writes)", s.path)
	}
	return f, info, nil
}

func openError(path string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("capture file %s does not exist: check the path (kproxy serve --capture FILE writes it), or follow it to wait until it is created: %w", path, err)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("cannot read capture file %s: %w (kproxy serve creates it readable by its own user only: read it as that user, or chmod it)", path, err)
	}
	return fmt.Errorf("open capture file %s: %w", path, err)
}

// tail is a capture file being read, and followed.
type tail struct {
	path  string
	b     *batcher
	f     *os.File
	info  os.FileInfo // f's, to tell when the path names another file
	off   int64       // how far f has been read
	lines lines
	buf   []byte
	// gone is set while the path does not exist (the status was sent).
	gone bool
	// statErr is the last failure to stat the path (its status was sent).
	statErr string
	// idle is called before each wait for a tick.
	idle func()
}

func (t *tail) run(ctx context.Context, follow bool, ticks <-chan time.Time) error {
	if err := t.b.status(ctx, "reading "+t.path); err != nil {
		return err
	}
	if err := t.read(ctx); err != nil {
		return err
	}
	if !follow {
		if err := t.finish(ctx); err != nil {
			return err
		}
		return t.b.done(ctx)
	}
	if err := t.b.status(ctx, "following "+t.path); err != nil {
		return err
	}
	for {
		t.idle()
		select {
		case <-ctx.Done():
			return nil
		case <-ticks:
		}
		if err := t.poll(ctx); err != nil {
			return err
		}
	}
}

// read reads f from where it was left to its current end; a line without
// its newline yet is held back.
func (t *tail) read(ctx context.Context) error {
	for {
		n, err := t.f.Read(t.buf)
		if n > 0 {
			t.off += int64(n)
			over, ferr := t.lines.feed(t.buf[:n], func(l []byte) error { return t.b.line(ctx, l) })
			t.b.skipped += over
			if ferr != nil {
				return ferr
			}
		}
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case err != nil:
			return fmt.Errorf("read capture file %s: %w", t.path, err)
		case n == 0:
			return nil
		}
	}
}

// finish takes the last line of a file that will not grow any more, even
// without its newline.
func (t *tail) finish(ctx context.Context) error {
	rest, overlong := t.lines.rest()
	if overlong {
		t.b.skipped++
		return nil
	}
	return t.b.line(ctx, rest)
}

// poll looks at the path once: new lines, truncation, replacement.
func (t *tail) poll(ctx context.Context) error {
	cur, err := os.Stat(t.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// Removed, or between the two steps of a rotation: what was
		// written to the old file before is still read; the new file is
		// read when it appears.
		if err := t.read(ctx); err != nil {
			return err
		}
		if !t.gone {
			t.gone = true
			return t.b.status(ctx, t.path+" was removed; waiting for it to be created again")
		}
		return t.b.flush(ctx)
	case err != nil:
		// Not fatal: a directory made unreadable for a moment, a network
		// filesystem away. Say it once and keep trying.
		if err := t.read(ctx); err != nil {
			return err
		}
		if msg := err.Error(); msg != t.statErr {
			t.statErr = msg
			return t.b.status(ctx, fmt.Sprintf("cannot check %s: %v; retrying", t.path, err))
		}
		return t.b.flush(ctx)
	}
	t.statErr = ""
	if !os.SameFile(cur, t.info) {
		return t.reopen(ctx)
	}
	t.gone = false
	if cur.Size() < t.off {
		if _, err := t.f.Seek(0, io.SeekStart); err != nil {
			return fmt.Errorf("capture file %s was truncated and cannot be read again from the start: %w", t.path, err)
		}
		t.off = 0
		t.lines.reset()
		if err := t.b.status(ctx, t.path+" was truncated; reading it from the start"); err != nil {
			return err
		}
	}
	if err := t.read(ctx); err != nil {
		return err
	}
	return t.b.flush(ctx)
}

// reopen finishes the old file and reads the new one from the start.
func (t *tail) reopen(ctx context.Context) error {
	if err := t.read(ctx); err != nil {
		return err
	}
	if err := t.finish(ctx); err != nil {
		return err
	}
	f, info, err := (&fileSource{path: t.path}).open()
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// Gone again between the stat and the open: the next poll sees.
		return t.b.flush(ctx)
	case err != nil:
		return err
	}
	t.f.Close()
	t.f, t.info, t.off, t.gone = f, info, 0, false
	t.lines.reset()
	if err := t.b.status(ctx, t.path+" was replaced (rotated); reading the new file"); err != nil {
		return err
	}
	if err := t.read(ctx); err != nil {
		return err
	}
	return t.b.flush(ctx)
}
