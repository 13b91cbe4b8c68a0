package record

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sync"
)

// Sink receives finished records. Implementations must be safe for
// concurrent use and must not block the proxy for long.
type Sink interface {
	Write(*Record)
}

// Sinks fans a record out to several sinks in order.
type Sinks []Sink

// Write implements Sink.
func (s Sinks) Write(r *Record) {
	for _, k := range s {
		k.Write(r)
	}
}

// FileSink appends records as JSON Lines, one flushed line per record, so a
// reader tailing the file (or a crash) never sees half a record.
type FileSink struct {
	mu   sync.Mutex
	f    *os.File
	w    *bufio.Writer
	errs func(error)
}

// OpenFile opens (creating or appending to) a capture file. onErr is told of
// write failures; the proxy keeps serving regardless.
func OpenFile(path string, onErr func(error)) (*FileSink, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open capture file %s: %w (check the directory exists and is writable)", path, err)
	}
	if onErr == nil {
		onErr = func(error) {}
	}
	return &FileSink{f: f, w: bufio.NewWriterSize(f, 64<<10), errs: onErr}, nil
}

// Write implements Sink.
func (s *FileSink) Write(r *Record) {
	b, err := json.Marshal(r)
	if err != nil {
		s.errs(fmt.Errorf("encode capture record %s: %w", r.ID, err))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b = append(b, '\n')
	if _, err := s.w.Write(b); err != nil {
		s.errs(err)
		return
	}
	if err := s.w.Flush(); err != nil {
		s.errs(err)
	}
}

// Close flushes and closes the file.
func (s *FileSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.w.Flush(); err != nil {
		s.f.Close()
		return err
	}
	return s.f.Close()
}

// Stream is an in-process event stream: every subscriber gets every record
// written after it subscribed. A slow subscriber loses records (counted)
// rather than slowing the proxy.
type Stream struct {
	mu   sync.Mutex
	subs map[chan *Record]*uint64
}

// NewStream makes an empty stream.
func NewStream() *Stream { return &Stream{subs: map[chan *Record]*uint64{}} }

// Subscribe returns a channel of records and a cancel func. dropped reports
// how many records this subscriber lost because it fell behind.
func (s *Stream) Subscribe(buffer int) (ch <-chan *Record, dropped func() uint64, cancel func()) {
	c := make(chan *Record, buffer)
	var n uint64
	s.mu.Lock()
	s.subs[c] = &n
	s.mu.Unlock()
	return c, func() uint64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			return n
		}, func() {
			s.mu.Lock()
			if _, ok := s.subs[c]; ok {
				delete(s.subs, c)
				close(c)
			}
			s.mu.Unlock()
		}
}

// Write implements Sink.
func (s *Stream) Write(r *Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c, n := range s.subs {
		select {
		case c <- r:
		default:
			*n++
		}
	}
}
