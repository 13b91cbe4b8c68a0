package apiserver

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// A watch over WebSocket (?watch=true with Upgrade: websocket, as browser
// clients and some dashboards send it) is served by the apiserver's
// WatchServer through golang.org/x/net/websocket, which takes the
// connection over and writes its handshake's answer on it: 101 Switching
// Protocols, or 403 Forbidden (no body) when the Origin header is not a
// URL (its checkOrigin), or 400 for a malformed handshake. The replay's
// watch never streams (its storage watch is empty), so the handshake's
// status line, read off the connection handed to the handler, is the
// answer: no kubelet is ever involved (found by a probe: said unknown,
// "then connect to the pod's kubelet", of a ConfigMaps watch).

// handshakeConn is the connection a WebSocket watch's handler takes over
// in the replay: it keeps what the handler writes up to the end of the
// handshake's headers, then refuses more; the client sends nothing.
type handshakeConn struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	code int
}

func (c *handshakeConn) Read([]byte) (int, error) { return 0, io.EOF }

func (c *handshakeConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.code != 0 {
		return 0, net.ErrClosed
	}
	c.buf.Write(p)
	if bytes.Contains(c.buf.Bytes(), []byte("\r\n\r\n")) {
		c.code = -1 // no status line net/http reads
		if resp, err := http.ReadResponse(bufio.NewReader(&c.buf), nil); err == nil {
			c.code = resp.StatusCode
			_ = resp.Body.Close() // the head only: nothing read past it
		}
	}
	return len(p), nil
}

// status is the handshake's status code, or 0 when none was written.
func (c *handshakeConn) status() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.code
}

func (c *handshakeConn) Close() error                     { return nil }
func (c *handshakeConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *handshakeConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *handshakeConn) SetDeadline(time.Time) error      { return nil }
func (c *handshakeConn) SetReadDeadline(time.Time) error  { return nil }
func (c *handshakeConn) SetWriteDeadline(time.Time) error { return nil }

// settleHandshake files a WebSocket watch's handshake as the run's
// answer: 101, or the refusal the handshake wrote (no Status body: the
// apiserver's is empty too). ok is false when no handshake was written.
func (r *Run) settleHandshake(c *handshakeConn) bool {
	code := c.status()
	switch {
	case code == 0:
		return false
	case code < 0:
		r.markUnknown("the apiserver's WebSocket handshake for this watch wrote no status line the replay could read")
		return true
	}
	r.Code = code
	if code >= 300 {
		why := "the apiserver's WebSocket handshake (golang.org/x/net/websocket, for a watch over WebSocket) refuses the request"
		if code == http.StatusForbidden {
			why += ": its Origin header is missing or not a URL (checkOrigin), answered 403 with no body"
		}
		r.Status = &metav1.Status{Status: metav1.StatusFailure, Code: int32(code), Reason: metav1.StatusReasonForbidden, Message: why}
		if code != http.StatusForbidden {
			r.Status.Reason = metav1.StatusReasonBadRequest
		}
		r.Decided = record.StageDecode
		r.Handshake = why
		return true
	}
	r.Handshake = "the apiserver's WebSocket handshake switches protocols (101) and the watch's stream starts"
	return true
}
