package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// A watch over HTTP/1.1 is a response that stays open for minutes or
// hours, mostly idle. Relayed by net/http's handler, it holds for all that
// time the connection's state (a 4 KiB read buffer, a 4 KiB write buffer,
// the response's 2 KiB chunking buffer, the parsed request), the
// handler's goroutine, whose stack the reverse proxy keeps at 8 KiB, and
// net/http's background read, another 8 KiB of stack deep in crypto/tls:
// about 80 KiB a watch in all, against 64 KiB budgeted. So once the
// apiserver has answered and the headers have gone out, kproxy takes the
// connection over (Hijack) and relays the rest of the stream on a
// goroutine of its own, as the same HTTP/1.1 chunks net/http would have
// written, with a second goroutine blocked on the bare connection to see
// the client go away. The handler returns and net/http lets go of its
// state. Both goroutines sit shallow when idle, so their stacks shrink to
// the minimum.
//
// What the client sees is unchanged but for one thing: when the stream
// ends, kproxy closes the connection instead of handing it back for the
// client's next request (net/http cannot take a hijacked connection
// back), and its answer says so (Connection: close); a client
// reconnects, as it would after an idle timeout. A
// request whose stream cannot be taken over (HTTP/2, HTTP/1.0, an error
// answer, a writer that cannot hijack) is relayed as before, by the
// reverse proxy.

// detachable is the relay's state for a request whose stream may be
// taken over: modifyResponse hands it the upstream body of a stream, and
// the cancel that ends the upstream request.
type detachable struct {
	body   io.ReadCloser // the stream's body, taken from the reverse proxy; nil: not a stream
	cancel context.CancelCauseFunc
	conn   net.Conn // the client's connection, once taken over
}

// Why a detached stream ended early: the record's error, and the span's.
var (
	errClientGone   = errors.New("the client closed its connection")
	errShuttingDown = errors.New("kproxy is shutting down")
	// errCutAtShutdown: kproxy, shutting down, closed the connections of
	// the requests still in flight after its drain.
	errCutAtShutdown = errors.New("kproxy is shutting down: the request outlasted its drain, and kproxy closed its connection")
)

// mayDetach says whether the response to r may be taken over: a watch
// over HTTP/1.1 (not 1.0: that response ends by closing the connection,
// which ReverseProxy does well enough) that asks for no upgrade, served by
// a writer that can hand its connection over.
func mayDetach(w http.ResponseWriter, r *http.Request, ex *exchange) bool {
	return ex.rec.Request.Verb == "watch" && r.ProtoMajor == 1 && r.ProtoMinor >= 1 &&
		r.Header.Get("Upgrade") == "" && hijackable(w)
}

// hijackable says whether w, or a writer it wraps, can hand its
// connection over, looking as http.ResponseController does.
func hijackable(w http.ResponseWriter) bool {
	for {
		if _, ok := w.(http.Hijacker); ok {
			return true
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return false
		}
		w = u.Unwrap()
	}
}

// takeStream is modifyResponse's part: the body of a successful stream
// (no length: chunked to the client) is kept for the detached relay, and
// the reverse proxy relays only the headers.
func takeStream(resp *http.Response, ex *exchange) {
	if ex.detach == nil || resp.StatusCode != http.StatusOK || resp.ContentLength >= 0 ||
		resp.Header.Get("Content-Length") != "" || len(resp.Trailer) > 0 {
		return
	}
	ex.detach.body, resp.Body = resp.Body, http.NoBody
	// kproxy closes the connection when the stream ends: HTTP/1.1 says a
	// server that will close says so, so that the client sends its next
	// request on a new one (found by a probe: Python's http.client sent
	// its next request on this one, which failed; the apiserver keeps it).
	resp.Header.Set("Connection", "close")
}

// forwardStream forwards r like forward, and when the answer is a stream,
// takes the connection over once the headers are out and relays the
// stream on its own goroutines. It reports whether it did: then that
// relay ends the upstream span and finishes the exchange.
func (p *Proxy) forwardStream(w http.ResponseWriter, r *http.Request, ex *exchange, span trace.Span) bool {
	// The upstream request must outlive the handler: its context is
	// canceled when the client goes away (net/http's context until the
	// takeover, the relay's watch on the connection after it), or when
	// kproxy shuts down.
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(r.Context()))
	stop := context.AfterFunc(r.Context(), func() { cancel(errClientGone) })
	ex.detach = &detachable{cancel: cancel}
	p.rpWatch.ServeHTTP(w, r.WithContext(ctx))
	body := ex.detach.body
	if body == nil {
		// Not a stream: relayed in full already.
		stop()
		cancel(nil)
		return false
	}
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// w can hijack (forward checked), so the connection failed
		// between the headers and the takeover: cut the stream, as the
		// reverse proxy does when its copy fails.
		stop()
		cancel(err)
		body.Close()
		panic(http.ErrAbortHandler)
	}
	// From here net/http has let go: the client's going away is the
	// relay's to see, and nothing may cancel the upstream request but it.
	stop()
	ex.detached = true
	ex.detach.conn = conn
	// net/http's response writer holds the connection's buffers: the
	// record needs only its headers.
	ex.rw.ResponseWriter = headersOnly(w.Header())
	p.streams.add(ex.detach)
	go p.relayDetached(ctx, ex, span)
	return true
}

// chunkHead is room for a chunk's size in hex and its CRLF, ahead of the
// data in the copy buffer: a chunk goes out in one write (one TLS record).
const chunkHead = 8

// relayDetached relays the stream of a detached exchange to conn in
// HTTP/1.1 chunks until the upstream ends it (the last chunk, then the
// connection closes), the client goes away, or kproxy shuts down (the
// connection closes without the last chunk: the client sees the stream
// cut, as from the apiserver). Then it finishes the exchange.
func (p *Proxy) relayDetached(ctx context.Context, ex *exchange, span trace.Span) {
	d := ex.detach
	conn := d.conn
	// Watch the client: its connection ending (EOF or an error) means it
	// is done. The bare connection under TLS is read: a goroutine blocked
	// there is shallow, and reading it takes nothing from what TLS
	// writes. What the client sends meanwhile (a request pipelined behind
	// the watch) is read and dropped: the watch goes on, as it does at the
	// apiserver (found by a probe: the watch had been cut at the first
	// byte and recorded as the client gone); the response said the
	// connection closes after it, so that request goes unanswered.
	raw := conn
	if tc, ok := conn.(*tls.Conn); ok {
		raw = tc.NetConn()
	}
	go func() {
		var b [64]byte
		for {
			if _, err := raw.Read(b[:]); err != nil {
				break
			}
		}
		d.cancel(errClientGone)
	}()

	bp := smallCopyBuffers.Get().(*[]byte)
	buf := *bp
	var failed error
	for {
		n, err := d.body.Read(buf[chunkHead : len(buf)-2])
		if n > 0 {
			var sz [chunkHead]byte
			size := strconv.AppendUint(sz[:0], uint64(n), 16)
			start := chunkHead - len(size) - 2
			copy(buf[start:], size)
			buf[chunkHead-2], buf[chunkHead-1] = '\r', '\n'
			buf[chunkHead+n], buf[chunkHead+n+1] = '\r', '\n'
			if _, werr := conn.Write(buf[start : chunkHead+n+2]); werr != nil {
				failed = errClientGone
				break
			}
			ex.rw.bytes += int64(n)
			if ex.rw.tally != nil {
				ex.rw.tally.Write(buf[chunkHead : chunkHead+n])
			}
		}
		if err == io.EOF {
			if _, werr := io.WriteString(conn, "0\r\n\r\n"); werr != nil {
				failed = errClientGone
			}
			break
		}
		if err != nil {
			if failed = context.Cause(ctx); failed == nil {
				failed = fmt.Errorf("the apiserver's stream failed: %w", err)
			}
			break
		}
	}
	smallCopyBuffers.Put(bp)
	d.cancel(failed)
	d.body.Close()
	conn.Close() // also ends the watch on the client
	p.streams.remove(d)

	ex.upEnd = p.clock.Now()
	abort := ""
	if failed != nil {
		abort = "response aborted: " + failed.Error()
		span.SetStatus(codes.Error, abort)
	}
	span.End()
	p.finishExchange(ex, ex.rw, abort)
}

// headersOnly stands in for the response writer of a detached stream:
// the headers as sent, and nothing more may be written through it.
type headersOnly http.Header

func (h headersOnly) Header() http.Header { return http.Header(h) }
func (headersOnly) WriteHeader(int)       {}
func (headersOnly) Write([]byte) (int, error) {
	return 0, errors.New("proxy: the stream was taken over: its relay writes to the connection")
}

// detachedStreams are the streams relayed off net/http, which
// http.Server.Shutdown neither waits for nor closes.
type detachedStreams struct {
	mu      sync.Mutex
	open    map[*detachable]struct{}
	closing bool
}

func (s *detachedStreams) add(d *detachable) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		d.end(errShuttingDown)
		return
	}
	if s.open == nil {
		s.open = map[*detachable]struct{}{}
	}
	s.open[d] = struct{}{}
}

func (s *detachedStreams) remove(d *detachable) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.open, d)
}

// CutInFlight marks the requests still in flight as cut by kproxy's
// shutdown: the server calls it when the drain is over, before it closes
// their connections, so that their records say so rather than blame the
// client (found by a probe).
func (p *Proxy) CutInFlight() { p.cutting.Store(true) }

// EndStreams cuts the streams kproxy relays off net/http (watches over
// HTTP/1.1), and any taken over from now on: the server calls it when it
// shuts down (http.Server.RegisterOnShutdown), so that Drain does not
// wait for watches that would last for minutes.
func (p *Proxy) EndStreams() {
	s := &p.streams
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing = true
	for d := range s.open {
		d.end(errShuttingDown)
	}
}

// end cuts a detached stream: the upstream request, and the client's
// connection, in case the relay is blocked writing to a client that
// stopped reading.
func (d *detachable) end(cause error) {
	d.cancel(cause)
	d.conn.Close()
}
