package proxy

import (
	"bytes"
	"io"
	"net/http"
	"sync"
	"time"
)

// teeBody passes the request body upstream untouched and keeps a copy of
// its first limit bytes for the replay. done runs once, when the body has
// been read to the end or closed, or when the exchange ends, whichever is
// first: the replay needs the whole body, and must start even if the
// transport never reads it.
type teeBody struct {
	rc        io.ReadCloser
	limit     int
	buf       bytes.Buffer
	n         int64
	truncated bool
	eof       bool
	once      sync.Once
	done      func(body []byte, truncated bool)
	mu        sync.Mutex // buf vs finish on another goroutine
}

func newTeeBody(rc io.ReadCloser, limit int, done func([]byte, bool)) *teeBody {
	return &teeBody{rc: rc, limit: limit, done: done}
}

func (t *teeBody) Read(p []byte) (int, error) {
	n, err := t.rc.Read(p)
	if n > 0 {
		t.mu.Lock()
		t.n += int64(n)
		if room := t.limit - t.buf.Len(); room > 0 {
			k := min(room, n)
			t.buf.Write(p[:k])
			if k < n {
				t.truncated = true
			}
		} else {
			t.truncated = true
		}
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

func (t *teeBody) Close() error {
	t.finish()
	return t.rc.Close()
}

// finish hands the body copy to done, once. A body that was not read to
// the end is reported truncated: the replay must not guess at the rest.
func (t *teeBody) finish() {
	t.once.Do(func() {
		t.mu.Lock()
		b := bytes.Clone(t.buf.Bytes())
		tr := t.truncated || !t.eof
		t.mu.Unlock()
		t.done(b, tr)
	})
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
}

func (b *idleBody) Read(p []byte) (int, error) {
	// A writer that cannot take deadlines (a test recorder) reads as before.
	_ = b.ctl.SetReadDeadline(b.now().Add(b.idle))
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		_ = b.ctl.SetReadDeadline(time.Time{})
	}
	return n, err
}
