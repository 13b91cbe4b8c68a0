package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestStalledBodyEnds: a client that sends part of its body and then
// nothing more is cut off after the idle timeout instead of holding its
// connection (and the upstream request) open.
func TestStalledBodyEnds(t *testing.T) {
	upstreamSaw := make(chan error, 1)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.Copy(io.Discard, r.Body)
		upstreamSaw <- err
		// As kube-apiserver's timeout filter answers once the request's
		// context ends: an answer to a request kproxy cut, which must not
		// reach the client as the apiserver's verdict.
		w.WriteHeader(http.StatusGatewayTimeout)
		w.(http.Flusher).Flush()
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	p, err := New(Config{Upstream: u, Passthrough: http.DefaultTransport, Replayer: &seenReplayer{}, BodyIdleTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(p)
	defer front.Close()

	body, stall := io.Pipe()
	defer stall.Close()
	go func() { _, _ = io.Copy(stall, strings.NewReader(`{"kind":"ConfigMap",`)) }() // and never the rest
	req, _ := http.NewRequest("POST", front.URL+"/api/v1/namespaces/default/configmaps", body)
	req.Header.Set("Content-Type", "application/json")
	done := make(chan *http.Response, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- nil
			return
		}
		resp.Body.Close()
		done <- resp
	}()
	// A guard, not a measurement: the request must end, and the upstream
	// must see its body fail rather than wait for the rest.
	select {
	case resp := <-done:
		if resp != nil && resp.StatusCode != http.StatusRequestTimeout {
			t.Errorf("a stalled body was answered %d, want 408 (the client's doing, not the apiserver's)", resp.StatusCode)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a stalled request body held the request open")
	}
	select {
	case err := <-upstreamSaw:
		if err == nil {
			t.Error("the upstream read the stalled body to its end")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the upstream request was never ended")
	}
	p.Drain()
}
