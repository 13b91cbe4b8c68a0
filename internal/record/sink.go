package record

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
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

// FileSink appends records as JSON Lines, one record per write, so a
// reader tailing the file (or a crash) never sees half a record. A write
// that fails (a full disk) is taken back: the partial line is truncated
// away, the record is dropped and counted, the failure is logged once,
// and the next write that succeeds logs how many were lost. Should the
// truncation fail too (a full copy-on-write filesystem can refuse even
// that), records are dropped until it succeeds: none is ever appended to
// a partial line. The sink never gives up: it writes again as soon as the
// disk does.
//
// Records finished at the same time share a write (group commit): the
// first writer writes its own line at once, and the lines that arrive
// while it writes wait, whole, in a queue it writes next, in one system
// call. A reader still sees whole lines, each as soon as a write is
// free; under load there are fewer system calls than records. When
// every Write has returned, every line was written. The queue is
// bounded (maxQueued): past it, writers wait, as they did for the file.
type FileSink struct {
	q struct {
		mu      sync.Mutex
		cond    sync.Cond // on mu: the writer took the queue, or finished
		lines   []byte    // whole lines waiting for the writer
		n       int       // how many
		spare   []byte    // the last batch's buffer, for the next
		writing bool      // a Write is writing: the others queue
	}
	// mu guards the file and what follows; held by the writer for its
	// write, and by Lost, Rotations and Close.
	mu      sync.Mutex
	f       captureFile
	path    string
	log     *slog.Logger
	failing bool
	partial int    // bytes of a partial line still to take back
	stuck   bool   // a partial line could not be taken back (logged once)
	lost    uint64 // records dropped since the failure began
	total   uint64 // records dropped since the sink opened

	rot         *rotator // nil: the file is never rotated
	size        int64    // the file's size, as this sink wrote it
	notRotating bool     // a rotation failed (logged once)
	retryAt     time.Time
	rotations   uint64 // files rotated since the sink opened
	failed      uint64 // rotations that failed

	// now is the sink's clock; checkedAt when it last looked whether the
	// path still names its file (followPath).
	now       func() time.Time
	checkedAt time.Time
}

// pathCheck is how often the sink looks whether its path still names the
// file it writes (a stat of each): a file moved or removed underneath it
// (logrotate without copytruncate, an rm) is replaced within it.
const pathCheck = time.Second

// rotationRetry is how long after a failed rotation the sink tries
// again: a rotation that keeps failing (the backup's name taken, a
// read-only directory) costs a stat and a rename per interval, not per
// record.
const rotationRetry = 10 * time.Second

// captureFile is what the sink needs of its file (tests inject a full
// disk).
type captureFile interface {
	Write([]byte) (int, error)
	Stat() (os.FileInfo, error)
	Truncate(int64) error
	Close() error
}

// OpenFile opens (creating or appending to) a capture file, rotated by rot
// when rot.MaxSize is set. log receives the failures and
// recoveries; the proxy keeps serving regardless.
func OpenFile(path string, log *slog.Logger, rot Rotation) (*FileSink, error) {
	f, err := openCapture(path)
	if err != nil {
		return nil, err
	}
	s := newFileSink(f, path, log)
	// A previous kproxy may have stopped between a short write and its
	// take-back (killed, or the machine lost power): the next record must
	// not continue that partial line.
	if n, err := cutPartialLine(f, path); err != nil {
		s.log.Warn("capture file may end in a partial line; kproxy could not remove it", "file", path, "error", err)
	} else if n > 0 {
		s.log.Warn("capture file ended in a partial line (a previous writer stopped mid-record); removed it", "file", path, "bytes", n)
	}
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
		s.size = st.Size()
		if rot.MaxSize > 0 {
			s.rot = newRotator(path, rot, func(what string, err error) {
				s.log.Error("capture: "+what+" failed", "file", path, "error", err)
			})
		}
	}
	return s, nil
}

// Stdout is the --capture path that writes the records to kproxy's
// standard output (its log goes to standard error), as kubectl reads "-":
// in a pod, `kubectl logs` then carries them, and every reader skips the
// lines that are not records.
const Stdout = "-"

func openCapture(path string) (*os.File, error) {
	if path == Stdout {
		return os.Stdout, nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open capture file %s: %w (check the directory exists and is writable)", path, err)
	}
	return f, nil
}

// cutPartialLine truncates a regular file back to just after its last
// newline and reports how many bytes it removed. Pipes and devices are
// left alone.
func cutPartialLine(f *os.File, path string) (int64, error) {
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() || st.Size() == 0 {
		return 0, nil
	}
	r, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	size := st.Size()
	buf := make([]byte, 64<<10)
	for end := size; end > 0; {
		start := max(0, end-int64(len(buf)))
		chunk := buf[:end-start]
		if _, err := r.ReadAt(chunk, start); err != nil {
			return 0, err
		}
		if i := bytes.LastIndexByte(chunk, '\n'); i >= 0 {
			keep := start + int64(i) + 1
			if keep == size {
				return 0, nil
			}
			return size - keep, f.Truncate(keep)
		}
		end = start
	}
	return size, f.Truncate(0) // one partial line and nothing else
}

func newFileSink(f captureFile, path string, log *slog.Logger) *FileSink {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &FileSink{f: f, path: path, log: log, now: time.Now}
	s.q.cond.L = &s.q.mu
	return s
}

// maxQueued bounds the lines waiting for a write (bytes): the records
// of a burst, not of a stalled disk.
const maxQueued = 1 << 20

// Write implements Sink.
func (s *FileSink) Write(r *Record) {
	buf := lineBuffers.Get().(*bytes.Buffer)
	defer putLineBuffer(buf)
	buf.Reset()
	// The encoder ends the line; encoded into a pooled buffer, a record
	// costs no allocation of its size (json.Marshal copies its result out,
	// and appending the newline copied it again).
	if err := json.NewEncoder(buf).Encode(r); err != nil {
		s.log.Error("capture record not encodable", "file", s.path, "id", r.ID, "error", err)
		return
	}
	q := &s.q
	q.mu.Lock()
	for q.writing && len(q.lines) >= maxQueued {
		q.cond.Wait()
	}
	if q.writing {
		q.lines = append(q.lines, buf.Bytes()...)
		q.n++
		q.mu.Unlock()
		return
	}
	q.writing = true
	q.mu.Unlock()
	s.writeLines(buf.Bytes(), 1)
	q.mu.Lock()
	for q.n > 0 {
		batch, n := q.lines, q.n
		q.lines, q.n = q.spare[:0], 0
		q.mu.Unlock()
		q.cond.Broadcast()
		s.writeLines(batch, n)
		q.mu.Lock()
		q.spare = nil
		if cap(batch) <= maxQueued { // not one record's captured body
			q.spare = batch[:0]
		}
	}
	q.writing = false
	q.mu.Unlock()
	q.cond.Broadcast()
}

// writeLines appends n whole lines in one write; on failure all n are
// dropped (the write's partial tail is taken back).
func (s *FileSink) writeLines(b []byte, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.partial > 0 && s.takeBack() != nil {
		// Appended now, the records would continue the partial line.
		s.drop(nil, n)
		return
	}
	if s.rot.due(s.size, len(b)) && !s.rot.Now().Before(s.retryAt) {
		s.rotate(len(b))
	}
	s.followPath()
	written, err := s.f.Write(b)
	s.size += int64(written)
	if err != nil {
		s.partial = written
		s.drop(err, n)
		if err := s.takeBack(); err != nil && !s.stuck {
			s.stuck = true
			s.log.Error("capture: cannot remove a partial line yet; records are dropped until it is removed",
				"file", s.path, "bytes", s.partial, "error", err)
		}
		return
	}
	s.stuck = false
	if s.failing {
		s.failing = false
		s.log.Warn("capture writing again", "file", s.path, "recordsLost", s.lost)
		s.lost = 0
	}
}

// followPath, at most once per pathCheck, makes sure the sink writes the
// file its path names: one moved away or removed (logrotate without
// copytruncate, an rm) would take every record after it where no reader
// looks, or to a deleted file whose space is never freed (found by a
// probe). The sink then opens a new file at the path, and says so.
func (s *FileSink) followPath() {
	f, ok := s.f.(*os.File)
	if !ok || f == os.Stdout {
		return
	}
	now := s.now()
	if now.Sub(s.checkedAt) < pathCheck {
		return
	}
	s.checkedAt = now
	at, err := os.Stat(s.path)
	if err == nil {
		if mine, err := f.Stat(); err != nil || !mine.Mode().IsRegular() || os.SameFile(at, mine) {
			return
		}
	} else if !os.IsNotExist(err) {
		return
	}
	nf, err := openCapture(s.path)
	if err != nil {
		s.log.Error("capture file was moved or removed, and kproxy cannot open a new one at its path: records go on to the old file", "file", s.path, "error", err)
		return
	}
	_ = f.Close()
	s.f, s.size = nf, 0
	if st, err := nf.Stat(); err == nil {
		s.size = st.Size()
	}
	s.log.Warn("capture file was moved or removed (log rotation?): kproxy writes to a new file at its path", "file", s.path)
}

// lineBuffers hold records being encoded.
var lineBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// putLineBuffer returns buf to the pool, unless one record made it large
// (a big write's body captured): the pool does not keep that much.
func putLineBuffer(buf *bytes.Buffer) {
	if buf.Cap() <= 64<<10 {
		lineBuffers.Put(buf)
	}
}

// drop counts n records not written; the first failure is logged.
func (s *FileSink) drop(err error, n int) {
	s.lost += uint64(n)
	s.total += uint64(n)
	if !s.failing {
		s.failing = true
		s.log.Error("capture write failed: records are dropped (and counted) until a write succeeds again",
			"file", s.path, "error", err)
	}
}

// takeBack removes the s.partial bytes a failed write left at the end
// of the file (in append mode: they are its last bytes); nil: none
// remain.
func (s *FileSink) takeBack() error {
	if s.partial <= 0 {
		return nil
	}
	fi, err := s.f.Stat()
	if err != nil {
		return err
	}
	// Shorter than the partial line: it was cut away already (the file
	// was truncated, or rotated by copy and truncate).
	if size := fi.Size() - int64(s.partial); size >= 0 {
		if err := s.f.Truncate(size); err != nil {
			return err
		}
		s.size = size
	}
	s.partial = 0
	return nil
}

// Lost reports how many records were dropped since the sink opened.
func (s *FileSink) Lost() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// Rotations is how many times the file was rotated (--capture-maxsize),
// and how many rotations failed (the records went on to the full file).
func (s *FileSink) Rotations() (done, failed uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rotations, s.failed
}

// Close closes the file, with a last try at removing a partial line,
// once the lines queued are written.
func (s *FileSink) Close() error {
	s.q.mu.Lock()
	for s.q.writing {
		s.q.cond.Wait()
	}
	s.q.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.takeBack(); err != nil {
		s.log.Error("capture: a partial line remains at the end of the file", "file", s.path, "bytes", s.partial, "error", err)
	}
	err := s.f.Close()
	s.rot.close()
	s.rot = nil // a write after Close rotates nothing
	return err
}

// rotate moves the full file aside and starts a new one at the path, for
// a record of n bytes. Should that fail, the record goes to the file as
// it is (past its size): a rotation never costs a record.
func (s *FileSink) rotate(n int) {
	// The size this sink counted may be stale (the file truncated, or
	// rotated by copy and truncate, by someone else).
	if st, err := s.f.Stat(); err == nil {
		if s.size = st.Size(); !s.rot.due(s.size, n) {
			return
		}
	}
	backup, err := s.rot.rotate()
	var f *os.File
	if err == nil {
		if f, err = openCapture(s.path); err != nil {
			// Put the file back where readers look for it.
			if rerr := os.Rename(backup, s.path); rerr != nil {
				err = fmt.Errorf("%w; and moving %s back failed: %v", err, backup, rerr)
			}
		}
	}
	if err != nil {
		s.failed++
		s.retryAt = s.rot.Now().Add(rotationRetry)
		if !s.notRotating {
			s.notRotating = true
			s.log.Error("capture file not rotated: records go on to the file past --capture-maxsize until a rotation succeeds (tried again every "+rotationRetry.String()+")", "file", s.path, "error", err)
		}
		return
	}
	s.rotations++
	if err := s.f.Close(); err != nil {
		s.log.Warn("capture: closing the rotated file failed", "file", backup, "error", err)
	}
	s.f, s.size = f, 0
	s.rot.rotated()
	if s.notRotating {
		s.notRotating = false
		s.log.Warn("capture file rotating again", "file", s.path)
	}
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
