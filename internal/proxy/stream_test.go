package proxy_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/record"
)

// streamUpstream answers a watch with the lines it is handed, each
// flushed, and ends the stream when lines closes; it reports when the
// request's context ends (the upstream watch canceled). A path other than
// the watch gets a 404 Status.
func streamUpstream(t *testing.T, lines <-chan string, gone chan<- struct{}) *httptest.Server {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") != "1" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					return
				}
				_, _ = io.WriteString(w, l)
				http.NewResponseController(w).Flush()
			case <-r.Context().Done():
				gone <- struct{}{}
				return
			}
		}
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// streamProxy is kproxy in front of upstream, served as kproxy serves
// (NewHTTPServer), over HTTP/1.1 only.
func streamProxy(t *testing.T, upstream *httptest.Server, sink record.Sink) (*httptest.Server, *http.Client) {
	t.Helper()
	return streamProxyOver(t, upstream, sink, false)
}

// streamProxyOver is streamProxy, serving its client HTTP/2 when h2.
func streamProxyOver(t *testing.T, upstream *httptest.Server, sink record.Sink, h2 bool) (*httptest.Server, *http.Client) {
	t.Helper()
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: upstream.Certificate().Raw})
	up, err := proxy.NewUpstream(&rest.Config{Host: upstream.URL, TLSClientConfig: rest.TLSClientConfig{CAData: caPEM}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := proxy.New(proxy.Config{Upstream: up.URL, Passthrough: up.Passthrough, WatchPassthrough: up.WatchPassthrough, Sink: sink})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewUnstartedServer(nil)
	front.Config = proxy.NewHTTPServer(p, nil, slog.New(slog.DiscardHandler))
	front.EnableHTTP2 = h2
	front.StartTLS()
	t.Cleanup(func() { front.Close(); p.Drain() })
	pool := x509.NewCertPool()
	pool.AddCert(front.Certificate())
	return front, &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: h2}}
}

// recordOf waits for the one record sink gets.
func recordOf(t *testing.T, sink *collect) *record.Record {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		sink.mu.Lock()
		n := len(sink.recs)
		sink.mu.Unlock()
		if n > 0 {
			sink.mu.Lock()
			defer sink.mu.Unlock()
			if n != 1 {
				t.Fatalf("%d records, want 1", n)
			}
			return sink.recs[0]
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no record within 10s")
	return nil
}

const watchPath = "/api/v1/namespaces/default/configmaps?watch=1"

// TestDetachedWatch: a watch over HTTP/1.1, which kproxy relays off
// net/http once the headers are out (stream.go), reaches the client as the
// apiserver sent it, each event as it comes, in chunks ending as the
// stream ends; the client going away cancels the upstream watch, and
// kproxy's shutdown cuts the stream (the client sees it cut, not ended).
// Each ends in one record saying how.
func TestDetachedWatch(t *testing.T) {
	open := func(t *testing.T, client *http.Client, base string, ctx context.Context) (*http.Response, *bufio.Reader) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "GET", base+watchPath, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || resp.ProtoMajor != 1 || len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
			t.Fatalf("watch answered %d over %s, transfer encoding %v; want 200, chunked HTTP/1.1", resp.StatusCode, resp.Proto, resp.TransferEncoding)
		}
		return resp, bufio.NewReader(resp.Body)
	}
	// Each event arrives before the next is sent: nothing waits in a buffer.
	relay := func(t *testing.T, lines chan<- string, br *bufio.Reader, events ...string) {
		t.Helper()
		for _, ev := range events {
			select {
			case lines <- ev:
			case <-time.After(10 * time.Second):
				t.Fatalf("the upstream watch took no event for 10s: it ended early")
			}
			got, err := br.ReadString('\n')
			if err != nil || got != ev {
				t.Fatalf("read %q, %v; want %q", got, err, ev)
			}
		}
	}
	// ended: the upstream watch ends after what happened, and the record
	// says why.
	ended := func(t *testing.T, gone <-chan struct{}, sink *collect, after, wantErr string) {
		t.Helper()
		select {
		case <-gone:
		case <-time.After(10 * time.Second):
			t.Fatalf("the upstream watch is still open 10s after %s", after)
		}
		if rec := recordOf(t, sink); rec.Actual.Error != wantErr {
			t.Errorf("record error %q, want %q", rec.Actual.Error, wantErr)
		}
	}
	events := []string{"{\"type\":\"ADDED\"}\n", string(make([]byte, 9000)) + "\n", "{\"type\":\"DELETED\"}\n",
		`{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old resource version: 300 (1709)","reason":"Expired","code":410}}` + "\n"}
	var size int64
	for _, ev := range events {
		size += int64(len(ev))
	}

	t.Run("the apiserver ends the stream", func(t *testing.T) {
		lines, gone := make(chan string), make(chan struct{}, 1)
		sink := &collect{}
		front, client := streamProxy(t, streamUpstream(t, lines, gone), sink)
		resp, br := open(t, client, front.URL, context.Background())
		if !resp.Close {
			t.Errorf("the answer does not say the connection closes after the stream (Connection: close): %v", resp.Header)
		}
		relay(t, lines, br, events...)
		close(lines)
		if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
			t.Fatalf("after the last event: %q, %v; want a clean end", rest, err)
		}
		resp.Body.Close()
		rec := recordOf(t, sink)
		if rec.Request.Protocol != "HTTP/1.1" {
			t.Errorf("record: protocol %q, want the client's HTTP/1.1", rec.Request.Protocol)
		}
		if rec.Request.Verb != "watch" || rec.Actual.Status != 200 || rec.Actual.ResponseBytes != size || rec.Actual.Error != "" {
			t.Errorf("record: %s, status %d, %d bytes, error %q; want the watch's 200, %d bytes, no error",
				rec.Request.Verb, rec.Actual.Status, rec.Actual.ResponseBytes, rec.Actual.Error, size)
		}
		// The stream's events, and the ERROR event that ended it.
		if se := rec.Actual.StreamError; rec.Actual.Events == nil || *rec.Actual.Events != int64(len(events)) || se == nil || se.Code != 410 || se.Reason != "Expired" ||
			se.Message != "too old resource version: 300 (1709)" {
			t.Errorf("record: %v events, stream error %+v; want %d events, the 410 that ended the stream", rec.Actual.Events, se, len(events))
		}
	})

	// A request pipelined behind the watch on its connection: the watch
	// goes on until the apiserver ends it, and its record does not say
	// the client went away.
	t.Run("the client sends while the stream is open", func(t *testing.T) {
		lines, gone := make(chan string), make(chan struct{}, 1)
		sink := &collect{}
		front, client := streamProxy(t, streamUpstream(t, lines, gone), sink)
		conn, err := tls.Dial("tcp", front.Listener.Addr().String(), client.Transport.(*http.Transport).TLSClientConfig)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, "GET "+watchPath+" HTTP/1.1\r\nHost: kproxy\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("watch answered %v, %v", resp, err)
		}
		body := bufio.NewReader(resp.Body)
		relay(t, lines, body, events[0])
		if _, err := io.WriteString(conn, "GET /api HTTP/1.1\r\nHost: kproxy\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond) // for kproxy to read it
		relay(t, lines, body, events[1:]...)
		close(lines)
		if rest, err := io.ReadAll(body); err != nil || len(rest) != 0 {
			t.Fatalf("after the last event: %q, %v; want a clean end", rest, err)
		}
		if rec := recordOf(t, sink); rec.Actual.Error != "" || rec.Actual.ResponseBytes != size {
			t.Errorf("record: %d bytes, error %q; want %d bytes, no error", rec.Actual.ResponseBytes, rec.Actual.Error, size)
		}
	})

	t.Run("the client goes away", func(t *testing.T) {
		lines, gone := make(chan string), make(chan struct{}, 1)
		sink := &collect{}
		front, client := streamProxy(t, streamUpstream(t, lines, gone), sink)
		ctx, cancel := context.WithCancel(context.Background())
		resp, br := open(t, client, front.URL, ctx)
		relay(t, lines, br, events[0])
		cancel()
		resp.Body.Close()
		ended(t, gone, sink, "its client went away", "response aborted: the client closed its connection")
	})

	t.Run("kproxy shuts down", func(t *testing.T) {
		lines, gone := make(chan string), make(chan struct{}, 1)
		sink := &collect{}
		front, client := streamProxy(t, streamUpstream(t, lines, gone), sink)
		resp, br := open(t, client, front.URL, context.Background())
		defer resp.Body.Close()
		relay(t, lines, br, events[0])
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := front.Config.Shutdown(ctx); err != nil {
			t.Fatalf("shutdown: %v", err)
		}
		if _, err := io.ReadAll(br); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("the client read %v at shutdown; want the stream cut (unexpected EOF)", err)
		}
		ended(t, gone, sink, "kproxy shut down", "response aborted: kproxy is shutting down")
	})

	t.Run("an error answer is relayed as it is", func(t *testing.T) {
		sink := &collect{}
		front, client := streamProxy(t, streamUpstream(t, nil, nil), sink)
		resp, err := client.Get(front.URL + "/api/v1/namespaces/default/configmaps?watch=true")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 404 || len(body) == 0 {
			t.Fatalf("got %d %q, %v; want the upstream's 404 Status", resp.StatusCode, body, err)
		}
		if rec := recordOf(t, sink); rec.Actual.Status != 404 || rec.Actual.Error != "" {
			t.Errorf("record: status %d, error %q", rec.Actual.Status, rec.Actual.Error)
		}
	})
}

// TestRelayedWatchClientGone: a watch over HTTP/2, which kproxy relays
// through net/http, that its client stops reading says so in the record
// ("the client closed its connection", not net/http's "abort Handler"),
// with the upstream's time it ran (it had said 0; found by a probe:
// every watch curl -m ended).
func TestRelayedWatchClientGone(t *testing.T) {
	lines, gone := make(chan string), make(chan struct{}, 1)
	sink := &collect{}
	front, client := streamProxyOver(t, streamUpstream(t, lines, gone), sink, true)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", front.URL+watchPath, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.ProtoMajor != 2 {
		t.Fatalf("the watch went over %s, want HTTP/2 (relayed, not detached)", resp.Proto)
	}
	lines <- "{\"type\":\"ADDED\"}\n"
	if got, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatalf("read %q, %v", got, err)
	}
	time.Sleep(20 * time.Millisecond) // the upstream's time, past a clock tick
	cancel()
	resp.Body.Close()
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream watch is still open 10s after its client went away")
	}
	rec := recordOf(t, sink)
	if want := "response aborted: the client closed its connection"; rec.Actual.Error != want {
		t.Errorf("record error %q, want %q", rec.Actual.Error, want)
	}
	if rec.Actual.Status != 200 || rec.Latency.UpstreamNs < int64(20*time.Millisecond) {
		t.Errorf("record: status %d, upstream %v; want 200 and the 20ms+ it ran", rec.Actual.Status, time.Duration(rec.Latency.UpstreamNs))
	}
}
