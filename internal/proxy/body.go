package proxy

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// bodyBudget bounds the request body bytes kproxy holds for replays at
// once: copies being received, waiting in the replay queue and being
// replayed. A write's replay holds its body and what the apiserver's
// code decodes from it, so without a bound eight concurrent 2.9 MB
// writes took kproxy from 134 MB to 640 MB. Past the budget, a body is
// not copied (it still goes upstream untouched) and its replay is shed:
// the record says unknown, never a guess from part of a body.
type bodyBudget struct {
	limit int64 // 0: no bound
	mu    sync.Mutex
	used  int64
}

// reserve takes n bytes of the budget, or reports false and takes
// nothing when they do not fit.
func (b *bodyBudget) reserve(n int64) bool {
	if b == nil || b.limit <= 0 {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.limit {
		return false
	}
	b.used += n
	return true
}

func (b *bodyBudget) release(n int64) {
	if b == nil || b.limit <= 0 || n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
}

// held is how many bytes are reserved now.
func (b *bodyBudget) held() int64 {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// teeBody passes the request body upstream untouched and keeps a copy of
// its first limit bytes for the replay, within the body budget. done
// runs once, when the body has been read to the end or closed, or when
// the exchange ends, whichever is first: the replay needs the whole
// body, and must start even if the transport never reads it. After done,
// the copy is the replay's: nothing is appended to it any more.
type teeBody struct {
	rc     io.ReadCloser
	limit  int
	budget *bodyBudget
	once   sync.Once
	done   func(teeResult)

	mu         sync.Mutex // the copy vs finish on another goroutine
	buf        []byte
	n          int64
	reserved   int64 // bytes of the budget this copy holds
	truncated  bool
	overBudget bool
	eof        bool
	finished   bool
}

// teeResult is what the replay gets: the copy, whether it is short of
// the body (a longer body than limit, or one not read to the end), and
// whether the budget refused to hold it.
type teeResult struct {
	body       []byte
	truncated  bool
	overBudget bool
}

// newTeeBody copies rc's first limit bytes. A declared length (HTTP/1.1
// Content-Length, or HTTP/2's content-length) sizes the copy, and takes
// its share of the budget, at once: one allocation, and a body that
// cannot fit is known before its first byte.
func newTeeBody(rc io.ReadCloser, limit int, declared int64, budget *bodyBudget, done func(teeResult)) *teeBody {
	t := &teeBody{rc: rc, limit: limit, budget: budget, done: done}
	if declared > 0 {
		want := min(declared, int64(limit))
		if budget.reserve(want) {
			t.reserved = want
			t.buf = make([]byte, 0, want)
		} else {
			t.overBudget = true
		}
	}
	return t
}

func (t *teeBody) Read(p []byte) (int, error) {
	n, err := t.rc.Read(p)
	if n > 0 {
		t.mu.Lock()
		t.n += int64(n)
		t.keep(p[:n])
		t.mu.Unlock()
	}
	if err == io.EOF {
		t.mu.Lock()
		t.eof = true
		t.mu.Unlock()
		t.finish()
	}
	return n, err
}

// keep appends p to the copy, within limit and the budget; t.mu is held.
func (t *teeBody) keep(p []byte) {
	if t.finished || t.overBudget {
		return
	}
	room := t.limit - len(t.buf)
	if room <= 0 {
		t.truncated = true
		return
	}
	k := min(room, len(p))
	if k < len(p) {
		t.truncated = true
	}
	if need := int64(len(t.buf)+k) - t.reserved; need > 0 {
		if !t.budget.reserve(need) {
			t.overBudget = true
			return
		}
		t.reserved += need
	}
	t.buf = append(t.buf, p[:k]...)
}

func (t *teeBody) Close() error {
	t.finish()
	return t.rc.Close()
}

// finish hands the body copy to done, once. A body that was not read to
// the end is reported truncated: the replay must not guess at the rest.
func (t *teeBody) finish() {
	t.once.Do(func() {
		t.mu.Lock()
		t.finished = true
		r := teeResult{body: t.buf, truncated: t.truncated || !t.eof, overBudget: t.overBudget}
		if r.overBudget {
			r.body = nil
		}
		t.mu.Unlock()
		t.done(r)
	})
}

// readWhole reads the body to its end (through the idle timeout) and
// returns it to forward from the copy it kept for the replay, which
// holds it whole (the caller checks it fits the limit and the budget): a
// small body is not copied twice (proxy.go, smallBody). A read that
// fails is forwarded as it failed, after what came before it.
func (t *teeBody) readWhole() io.ReadCloser {
	_, err := io.Copy(io.Discard, t)
	t.mu.Lock()
	kept := t.buf // the replay's after finish, and only read: shared
	t.mu.Unlock()
	r := io.Reader(bytes.NewReader(kept))
	if err != nil {
		r = io.MultiReader(r, errorReader{err})
	}
	return readCloser{r, t}
}

// readCloser reads from one reader and closes another.
type readCloser struct {
	io.Reader
	c io.Closer
}

func (r readCloser) Close() error { return r.c.Close() }

// errorReader fails every read with err.
type errorReader struct{ err error }

func (e errorReader) Read([]byte) (int, error) { return 0, e.err }

// release gives the copy's share of the budget back, once the replay is
// over with it (a re-run keeps it under a bound of its own).
func (t *teeBody) release() {
	t.mu.Lock()
	n := t.reserved
	t.reserved = 0
	t.mu.Unlock()
	t.budget.release(n)
}

// sentNothing is told that the request went upstream without a body (an
// HTTP/2 request whose stream ended with its headers still has a Body to
// read, but ReverseProxy sends none when ContentLength is 0): the
// apiserver saw an empty body, and so does the replay.
func (t *teeBody) sentNothing() {
	t.mu.Lock()
	t.eof = true
	t.mu.Unlock()
	t.finish()
}

// bytesRead is how many body bytes went upstream.
func (t *teeBody) bytesRead() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// idleBody ends a request body that stops arriving: each read must bring
// bytes within idle, or it fails with a timeout (and the request with it),
// so a client that never finishes its body cannot hold a connection for
// ever. The deadline is the connection's (or, over HTTP/2, the stream's)
// and is cleared once the body ends.
type idleBody struct {
	io.ReadCloser
	ctl  *http.ResponseController
	idle time.Duration
	now  func() time.Time
	// stalled is set when a read failed on the deadline: the request
	// ends because of the client, which errorHandler must say.
	stalled atomic.Bool
}

func (b *idleBody) Read(p []byte) (int, error) {
	// A writer that cannot take deadlines (a test recorder) reads as before.
	_ = b.ctl.SetReadDeadline(b.now().Add(b.idle))
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			b.stalled.Store(true)
		}
		_ = b.ctl.SetReadDeadline(time.Time{})
	}
	return n, err
}
