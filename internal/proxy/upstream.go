package proxy

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"

	"k8s.io/client-go/rest"

	"github.com/kproxy/kproxy/internal/credential"
)

// Upstream is how kproxy reaches the apiserver.
type Upstream struct {
	URL *url.URL
	// Passthrough carries the caller's own credentials, adding none.
	Passthrough *http.Transport
	// Impersonating carries kproxy's own credentials (nil without them).
	Impersonating http.RoundTripper
	// WatchPassthrough and WatchImpersonating are the same over HTTP/2,
	// for watches (see newWatchTransport).
	WatchPassthrough   *http.Transport
	WatchImpersonating http.RoundTripper
	// Config is kproxy's own client configuration (reads, SARs).
	Config *rest.Config
}

// NewUpstream builds the transports from kproxy's client configuration. The
// passthrough transport trusts the same CA but presents no credentials.
func NewUpstream(cfg *rest.Config) (*Upstream, error) {
	u, err := url.Parse(cfg.Host)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("upstream apiserver URL %q is not a URL like https://host:6443", cfg.Host)
	}
	anon := rest.AnonymousClientConfig(cfg)
	anonTLS, err := rest.TLSConfigFor(anon)
	if err != nil {
		return nil, fmt.Errorf("upstream TLS settings: %w", err)
	}
	up := &Upstream{URL: u, Passthrough: newTransport(anonTLS), WatchPassthrough: newWatchTransport(anonTLS), Config: cfg}
	if credential.InConfig(cfg) {
		ownTLS, err := rest.TLSConfigFor(cfg)
		if err != nil {
			return nil, fmt.Errorf("kproxy's upstream credentials: %w", err)
		}
		rt, err := rest.HTTPWrappersForConfig(cfg, newTransport(ownTLS))
		if err != nil {
			return nil, fmt.Errorf("kproxy's upstream credentials: %w", err)
		}
		up.Impersonating = rt
		if up.WatchImpersonating, err = rest.HTTPWrappersForConfig(cfg, newWatchTransport(ownTLS)); err != nil {
			return nil, fmt.Errorf("kproxy's upstream credentials: %w", err)
		}
	}
	return up, nil
}

// newTransport is tuned for the apiserver (see pitfalls.md):
//   - DisableCompression: Go would otherwise ask for gzip and unzip behind
//     the client's back, halving LIST throughput and doubling apiserver CPU;
//     Accept-Encoding passes through as the client sent it.
//   - HTTP/1.1 only: upgrades (exec, attach, port-forward) cannot ride
//     HTTP/2, and a pool of HTTP/1.1 connections streams big responses
//     faster than one multiplexed connection.
//   - A large idle pool per host, or bursts reconnect over TLS each time;
//     closed after 30s idle, so a burst's connections (and their
//     goroutines) are not held for 90s after it.
//   - Modest per-connection buffers: a watch holds its connection.
//   - No HTTPS_PROXY: kproxy is often the proxy itself.
func newTransport(tlsCfg *tls.Config) *http.Transport {
	if tlsCfg == nil {
		tlsCfg = &tls.Config{}
	}
	tlsCfg = tlsCfg.Clone()
	tlsCfg.NextProtos = []string{"http/1.1"}
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tlsCfg,
		TLSHandshakeTimeout:   10 * time.Second,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   512,
		IdleConnTimeout:       30 * time.Second,
		ExpectContinueTimeout: time.Second,
		// Each connection keeps its buffers for as long as it lives, and a
		// watch holds one connection: modest buffers keep idle watches
		// cheap, and big bodies bypass them (bufio reads large requests
		// straight into the caller's buffer).
		ReadBufferSize:  4 << 10,
		WriteBufferSize: 4 << 10,
	}
}

// newWatchTransport carries watches over HTTP/2: many watches share one
// connection to the apiserver (up to its limit of streams per connection,
// then another), so an idle watch no longer holds a connection of its own
// (its TLS state, buffers and two goroutines: about 40 KiB each). A watch
// is small events, streamed, where HTTP/2's reasons for HTTP/1.1 above do
// not apply; a watch asking for an upgrade (websocket) still goes over
// HTTP/1.1. Each stream's receive window is kept small: a client that
// stops reading its watch stops the apiserver's stream after 64 KiB held
// by kproxy, as a full TCP window does for HTTP/1.1, instead of HTTP/2's
// default of megabytes.
func newWatchTransport(tlsCfg *tls.Config) *http.Transport {
	t := newTransport(tlsCfg)
	t.TLSClientConfig.NextProtos = nil
	t.ForceAttemptHTTP2 = true
	t.Protocols = new(http.Protocols)
	t.Protocols.SetHTTP2(true)
	t.HTTP2 = &http.HTTP2Config{MaxReceiveBufferPerStream: 64 << 10, MaxReceiveBufferPerConnection: 1 << 20}
	return t
}
