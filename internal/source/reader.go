package source

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// Reader reads capture lines from r until it ends (Done), as from a pipe:
// kproxy serve --capture /dev/stdout | kproxy flows -. name names it
// ("stdin"). Records are delivered as soon as the reader has caught up
// with the writer, in batches when it has not. A line's records are
// delivered once its newline arrives, or at the end of r.
//
// Reading happens on a goroutine of its own; when ctx ends while it waits
// in r.Read, it ends when that Read returns.
func Reader(name string, r io.Reader) Source {
	return &readerSource{name: name, r: r}
}

type readerSource struct {
	name string
	r    io.Reader
}

func (s *readerSource) Name() string { return s.name }

// chunk is one read, or how reading ended.
type chunk struct {
	b   []byte
	err error
}

// Run implements Source.
func (s *readerSource) Run(ctx context.Context, out chan<- Event) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	chunks := make(chan chunk, 16)
	go func() {
		for {
			buf := make([]byte, readChunk)
			n, err := s.r.Read(buf)
			if n > 0 {
				select {
				case chunks <- chunk{b: buf[:n]}:
				case <-ctx.Done():
					return
				}
			}
			if err != nil {
				select {
				case chunks <- chunk{err: err}:
				case <-ctx.Done():
				}
				return
			}
		}
	}()
	b := &batcher{out: out}
	if err := b.status(ctx, "reading "+s.name); err != nil {
		return nil
	}
	ls := lines{max: MaxLine}
	for {
		var c chunk
		select {
		case c = <-chunks:
		case <-ctx.Done():
			return nil
		}
		if c.err != nil {
			if !errors.Is(c.err, io.EOF) {
				return fmt.Errorf("read %s: %w", s.name, c.err)
			}
			rest, overlong := ls.rest()
			if overlong {
				b.skipped++
			} else if err := b.line(ctx, rest); err != nil {
				return nil
			}
			if err := b.done(ctx); err != nil {
				return nil
			}
			return nil
		}
		over, err := ls.feed(c.b, func(l []byte) error { return b.line(ctx, l) })
		b.skipped += over
		if err != nil {
			return nil
		}
		if len(chunks) == 0 {
			// Caught up with the writer: deliver now rather than wait
			// for a full batch.
			if err := b.flush(ctx); err != nil {
				return nil
			}
		}
	}
}
