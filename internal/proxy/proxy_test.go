package proxy_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/client-go/rest"

	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/stages"
)

// collect is a record.Sink for tests.
type collect struct {
	mu   sync.Mutex
	recs []*record.Record
}

func (c *collect) Write(r *record.Record) {
	c.mu.Lock()
	c.recs = append(c.recs, r)
	c.mu.Unlock()
}

// upgradeUpstream stands in for a kubelet behind the apiserver, which
// cannot run here: it switches protocols and echoes every byte.
func upgradeUpstream(t testing.TB, seen chan<- http.Header) *httptest.Server {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		if !strings.EqualFold(r.Header.Get("Connection"), "Upgrade") {
			http.Error(w, "not an upgrade", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		proto := r.Header.Get("Upgrade")
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n", proto)
		if sub := r.Header.Get("Sec-WebSocket-Protocol"); sub != "" {
			fmt.Fprintf(brw, "Sec-WebSocket-Protocol: %s\r\n", strings.TrimSpace(strings.Split(sub, ",")[0]))
		} else {
			fmt.Fprintf(brw, "X-Stream-Protocol-Version: %s\r\n", r.Header.Get("X-Stream-Protocol-Version"))
		}
		brw.WriteString("\r\n")
		brw.Flush()
		// Echo until the client closes, or sends "bye" (the process
		// ends, and the apiserver closes the connection).
		buf := make([]byte, 64<<10)
		for {
			n, err := brw.Read(buf)
			if n > 0 {
				if string(buf[:n]) == "bye" {
					return
				}
				if _, err := conn.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}))
	srv.EnableHTTP2 = false
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func startProxy(t testing.TB, upstream *httptest.Server, sink record.Sink) (addr string, pool *x509.CertPool) {
	return startProxyWith(t, upstream, sink, nil)
}

func startProxyWith(t testing.TB, upstream *httptest.Server, sink record.Sink, tp trace.TracerProvider) (addr string, pool *x509.CertPool) {
	t.Helper()
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: upstream.Certificate().Raw})
	up, err := proxy.NewUpstream(&rest.Config{Host: upstream.URL, TLSClientConfig: rest.TLSClientConfig{CAData: caPEM}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := proxy.New(proxy.Config{Upstream: up.URL, Passthrough: up.Passthrough, Sink: sink,
		Replayer: stages.New(context.Background(), stages.Config{TracerProvider: tp}), TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewUnstartedServer(p)
	front.EnableHTTP2 = true
	front.StartTLS()
	t.Cleanup(func() { front.Close(); p.Drain() })
	pool = x509.NewCertPool()
	pool.AddCert(front.Certificate())
	return front.Listener.Addr().String(), pool
}

// TestUpgrades passes exec/attach (SPDY/3.1), WebSocket v5.channel.k8s.io
// and port-forward tunnelled over WebSocket through kproxy, and checks the
// bytes flow both ways unchanged and the credentials reach the upstream.
func TestUpgrades(t *testing.T) {
	cases := []struct {
		name, method, path string
		headers            map[string]string
		// upstreamEnds: the apiserver's side closes the connection
		// first; otherwise the client does.
		upstreamEnds bool
	}{
		{"exec over SPDY", "POST", "/api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true&stdout=true",
			map[string]string{"Upgrade": "SPDY/3.1", "X-Stream-Protocol-Version": "v4.channel.k8s.io"}, false},
		{"exec over SPDY, ended by the apiserver", "POST", "/api/v1/namespaces/default/pods/p/exec?command=true&stdout=true",
			map[string]string{"Upgrade": "SPDY/3.1", "X-Stream-Protocol-Version": "v4.channel.k8s.io"}, true},
		{"attach over WebSocket", "GET", "/api/v1/namespaces/default/pods/p/attach?stdin=true&stdout=true",
			map[string]string{"Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
				"Sec-WebSocket-Protocol": "v5.channel.k8s.io, v4.channel.k8s.io"}, false},
		{"port-forward tunnelled over WebSocket", "GET", "/api/v1/namespaces/default/pods/p/portforward?ports=8080",
			map[string]string{"Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
				"Sec-WebSocket-Protocol": "SPDY/3.1+portforward.k8s.io"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			seen := make(chan http.Header, 1)
			sink := &collect{}
			// A recording tracer provider, as kproxy serve always has: the
			// upstream must see kproxy's traceparent.
			addr, pool := startProxyWith(t, upgradeUpstream(t, seen), sink, sdktrace.NewTracerProvider())
			conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, NextProtos: []string{"http/1.1"}})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			var b strings.Builder
			fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nAuthorization: Bearer secret-token\r\n", tc.method, tc.path, addr)
			for k, v := range tc.headers {
				fmt.Fprintf(&b, "%s: %s\r\n", k, v)
			}
			b.WriteString("\r\n")
			if _, err := io.WriteString(conn, b.String()); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("status %d, want 101", resp.StatusCode)
			}
			if got, want := resp.Header.Get("Upgrade"), tc.headers["Upgrade"]; got != want {
				t.Errorf("Upgrade %q, want %q", got, want)
			}
			h := <-seen
			if h.Get("Authorization") != "Bearer secret-token" {
				t.Errorf("upstream saw Authorization %q: the token must pass through", h.Get("Authorization"))
			}
			if h.Get("Audit-Id") == "" {
				t.Error("upstream saw no Audit-Id")
			}
			if tp := h.Get("Traceparent"); len(tp) != 55 {
				t.Errorf("upstream saw traceparent %q, want kproxy's upstream span", tp)
			}
			// Binary frames both ways, including bytes that are not text.
			for _, msg := range []string{"\x00\x01stdin-frame\xff", strings.Repeat("x", 70000)} {
				if _, err := io.WriteString(conn, msg); err != nil {
					t.Fatal(err)
				}
				got := make([]byte, len(msg))
				conn.SetReadDeadline(time.Now().Add(30 * time.Second))
				if _, err := io.ReadFull(br, got); err != nil {
					t.Fatal(err)
				}
				if string(got) != msg {
					t.Fatalf("echo differs (%d bytes)", len(msg))
				}
			}
			// The record says the apiserver switched protocols (the 101 is
			// written on the hijacked connection, past the recorder).
			if tc.upstreamEnds {
				if _, err := io.WriteString(conn, "bye"); err != nil {
					t.Fatal(err)
				}
				conn.SetReadDeadline(time.Now().Add(30 * time.Second))
				if n, err := br.Read(make([]byte, 1)); err != io.EOF {
					t.Errorf("after the apiserver ended: read %d bytes, %v; want EOF", n, err)
				}
			}
			conn.Close()
			deadline := time.Now().Add(30 * time.Second)
			for {
				sink.mu.Lock()
				n := len(sink.recs)
				sink.mu.Unlock()
				if n > 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("no record of the upgraded request")
				}
				time.Sleep(10 * time.Millisecond)
			}
			a := sink.recs[0].Actual
			if a.Status != http.StatusSwitchingProtocols {
				t.Errorf("recorded status %d, want 101", a.Status)
			}
			// Which side ended the connection (a client that drops its
			// watch or exec, or the apiserver ending it).
			wantErr := "the client closed its connection after the switch of protocols, before the apiserver closed its side"
			if tc.upstreamEnds {
				wantErr = ""
			}
			if a.Error != wantErr {
				t.Errorf("recorded error %q, want %q", a.Error, wantErr)
			}
		})
	}
}

// TestExpectContinueOnce: a client that sends Expect: 100-continue gets
// one 100 Continue through kproxy, as directly: kproxy reads a small
// body whole (net/http answers the Expect then), and the apiserver's own
// 100 is not relayed again (a probe saw two).
func TestExpectContinueOnce(t *testing.T) {
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	up.EnableHTTP2 = false
	up.StartTLS()
	t.Cleanup(up.Close)
	addr, pool := startProxy(t, up, &collect{})
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}`
	fmt.Fprintf(conn, "POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", addr, len(body))
	br := bufio.NewReader(conn)
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	// The first 100 Continue, then the body, as a client waiting for it.
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100") {
		t.Fatalf("first line %q, %v; want 100 Continue", line, err)
	}
	if _, err := br.ReadString('\n'); err != nil { // the blank line
		t.Fatal(err)
	}
	io.WriteString(conn, body)
	continues := 1
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode == http.StatusContinue {
			continues++
			continue
		}
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("status %d", resp.StatusCode)
		}
		break
	}
	if continues != 1 {
		t.Errorf("%d 100 Continue responses, want 1", continues)
	}
}

// TestRefusedUpgradeCloses: the apiserver refuses an upgrade with a bare
// 403 and closes the connection; an HTTP/1.1 client through kproxy is
// told so (Connection: close), and kproxy closes it too, as directly
// (probe AD: kproxy kept the connection and served the next request
// pipelined on it).
func TestRefusedUpgradeCloses(t *testing.T) {
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusForbidden)
	}))
	upstream.EnableHTTP2 = false
	upstream.StartTLS()
	t.Cleanup(upstream.Close)
	addr, pool := startProxy(t, upstream, &collect{})
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /api/v1/namespaces/default/configmaps?watch=true HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nAuthorization: Bearer t\r\n\r\n", addr)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !resp.Close {
		t.Errorf("status %d, Connection %q: want the 403 with Connection: close", resp.StatusCode, resp.Header.Get("Connection"))
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := br.Read(make([]byte, 1)); err == nil || n > 0 {
		t.Errorf("kproxy kept the connection open after the refusal (read %d bytes, %v)", n, err)
	}
}
