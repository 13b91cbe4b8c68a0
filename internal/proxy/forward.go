package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/elazarl/goproxy"
)

// ForwardServer is kproxy in forward mode: clients keep the apiserver's URL
// and reach it through kproxy as an HTTP proxy (HTTPS_PROXY, or proxy-url in
// the kubeconfig). goproxy handles the proxy protocol; a CONNECT to the
// apiserver is taken over, TLS is terminated with a certificate for the
// apiserver's name signed by kproxy's CA, and the decrypted requests go to
// the same handler as reverse mode. CONNECTs to any other host are refused:
// kproxy is not a general-purpose proxy.
type ForwardServer struct {
	proxy  *goproxy.ProxyHttpServer
	inner  *http.Server
	ln     *connListener
	target string // host:port of the apiserver
	log    *slog.Logger
}

// NewForwardServer builds the forward proxy. target is the apiserver's
// host:port as clients name it; tlsCfg serves the MITM certificate for it.
func NewForwardServer(h http.Handler, target string, tlsCfg *tls.Config, addr net.Addr, log *slog.Logger) *ForwardServer {
	f := &ForwardServer{
		proxy:  goproxy.NewProxyHttpServer(),
		target: target,
		ln:     newConnListener(addr),
		log:    log,
	}
	f.inner = NewHTTPServer(h, tlsCfg, log)
	f.proxy.Logger = slog.NewLogLogger(log.Handler(), slog.LevelDebug)
	f.proxy.OnRequest().HandleConnectFunc(f.handleConnect)
	f.proxy.NonproxyHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "kproxy is running in forward mode: use it as an HTTPS proxy (HTTPS_PROXY or the kubeconfig's proxy-url) for "+target, http.StatusBadRequest)
	})
	f.proxy.OnRequest().DoFunc(func(r *http.Request, ctx *goproxy.ProxyCtx) (*http.Request, *http.Response) {
		return r, goproxy.NewResponse(r, goproxy.ContentTypeText, http.StatusForbidden,
			"kproxy forwards only HTTPS (CONNECT) to the apiserver "+target+"\n")
	})
	return f
}

func (f *ForwardServer) handleConnect(host string, ctx *goproxy.ProxyCtx) (*goproxy.ConnectAction, string) {
	if !sameHostPort(host, f.target) {
		//nolint:bodyclose // goproxy writes and closes the refusal it is handed
		ctx.Resp = goproxy.NewResponse(ctx.Req, goproxy.ContentTypeText, http.StatusForbidden,
			fmt.Sprintf("kproxy forwards only to the apiserver %s, not %s\n", f.target, host))
		return goproxy.RejectConnect, host
	}
	return &goproxy.ConnectAction{Action: goproxy.ConnectHijack, Hijack: f.hijack}, host
}

func (f *ForwardServer) hijack(_ *http.Request, client net.Conn, _ *goproxy.ProxyCtx) {
	if _, err := client.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		client.Close()
		return
	}
	// The inner server terminates TLS on the tunnel itself, so HTTP/2,
	// client certificates and r.TLS work exactly as in reverse mode.
	if err := f.ln.push(client); err != nil {
		client.Close()
	}
}

// Serve runs the proxy on ln until ctx is done.
func (f *ForwardServer) Serve(ctx context.Context, ln net.Listener) error {
	outer := &http.Server{Handler: f.proxy, ReadHeaderTimeout: f.inner.ReadHeaderTimeout, ErrorLog: f.inner.ErrorLog}
	innerErr := make(chan error, 1)
	go func() { innerErr <- f.inner.ServeTLS(f.ln, "", "") }()
	outerErr := make(chan error, 1)
	go func() { outerErr <- waitAndShutdown(ctx, outer, serve(outer, ln)) }()
	var err error
	select {
	case err = <-outerErr:
	case err = <-innerErr:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = outer.Shutdown(sctx)
	_ = f.inner.Shutdown(sctx)
	_ = f.ln.Close()
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

func serve(srv *http.Server, ln net.Listener) <-chan error {
	c := make(chan error, 1)
	go func() { c <- srv.Serve(ln) }()
	return c
}

// sameHostPort compares host:port pairs, treating "localhost" and the
// loopback address as distinct names but ignoring case.
func sameHostPort(a, b string) bool {
	return strings.EqualFold(a, b)
}
