package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// ServerTLS is the TLS configuration kproxy terminates client connections
// with. Like the apiserver, it requests a client certificate but does not
// require one or verify it in the handshake: verification happens per
// request (identify), so a bad certificate gets the apiserver's 401 rather
// than a handshake failure. clientCAs are named in the certificate request
// exactly as the apiserver names its client and front-proxy CAs: clients
// (Go's among them) send a certificate only when it chains to one of them,
// so a certificate from a foreign CA is not sent at all and the request is
// anonymous, as it is against the apiserver.
func ServerTLS(cert tls.Certificate, clientCAs *x509.CertPool) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientCAs:    clientCAs,
		ClientAuth:   tls.RequestClientCert,
		NextProtos:   []string{"h2", "http/1.1"},
		MinVersion:   tls.VersionTLS12,
	}
}

// NewHTTPServer wraps h in an http.Server with timeouts fit for an
// apiserver front: long-running requests (watch, exec) have no write
// timeout, and headers must arrive promptly.
func NewHTTPServer(h http.Handler, tlsCfg *tls.Config, log *slog.Logger) *http.Server {
	srv := &http.Server{
		Handler:           h,
		TLSConfig:         tlsCfg,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       90 * time.Second,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	// Shutdown neither waits for nor closes the connections kproxy has
	// taken over (HTTP/1.1 watches, stream.go): it cuts them itself.
	if s, ok := h.(interface{ EndStreams() }); ok {
		srv.RegisterOnShutdown(s.EndStreams)
	}
	return srv
}

// ServeReverse serves kproxy's handler over TLS on ln until ctx is done,
// then shuts down gracefully (open watches are closed).
func ServeReverse(ctx context.Context, ln net.Listener, srv *http.Server) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	return waitAndShutdown(ctx, srv, errc)
}

// DrainTimeout is how long requests in flight have to finish once kproxy
// stops accepting connections; those still in flight are then cut.
const DrainTimeout = 5 * time.Second

func waitAndShutdown(ctx context.Context, srv *http.Server, errc <-chan error) error {
	select {
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), DrainTimeout)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			if c, ok := srv.Handler.(interface{ CutInFlight() }); ok {
				c.CutInFlight()
			}
			return srv.Close()
		}
		return nil
	}
}

// connListener is a net.Listener fed with connections from elsewhere (the
// forward proxy's CONNECT tunnels), so one http.Server, with HTTP/2 and the
// same TLS handling as reverse mode, serves them.
type connListener struct {
	conns  chan net.Conn
	addr   net.Addr
	once   sync.Once
	closed chan struct{}
}

func newConnListener(addr net.Addr) *connListener {
	return &connListener{conns: make(chan net.Conn), addr: addr, closed: make(chan struct{})}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *connListener) push(c net.Conn) error {
	select {
	case l.conns <- c:
		return nil
	case <-l.closed:
		return fmt.Errorf("kproxy is shutting down")
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *connListener) Addr() net.Addr { return l.addr }
