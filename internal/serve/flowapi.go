package serve

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/kproxy/kproxy/internal/flowapi"
	"github.com/kproxy/kproxy/internal/flowview"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/record"
)

// Defaults of the flow API's flags. The re-run bodies are held in memory
// beside the replay's own (--replay-body-budget-mib): 16 MiB keeps a
// thousand ordinary writes re-runnable, and only a handful of large ones.
const (
	DefaultAPIListen         = "127.0.0.1:7070"
	DefaultAPIBuffer         = 10000
	DefaultAPIRerunKeep      = 1000
	DefaultAPIRerunKeepBytes = 16 << 20
)

// apiOn reports whether the flow API is configured.
func (o *Options) apiOn() bool { return o.APIListen != "" && o.APIListen != "off" }

func (o *Options) apiBuffer() int {
	if o.APIBuffer == 0 {
		return DefaultAPIBuffer
	}
	return o.APIBuffer
}

// rerunLimits are the proxy's re-run limits: none unless the API is on,
// since only the API re-runs flows, and the requests kept carry
// credentials.
func (o *Options) rerunLimits() proxy.RerunLimits {
	if !o.apiOn() || o.APIRerunKeep <= 0 {
		return proxy.RerunLimits{}
	}
	b := o.APIRerunKeepBytes
	if b == 0 {
		b = DefaultAPIRerunKeepBytes
	}
	return proxy.RerunLimits{Flows: o.APIRerunKeep, Bytes: b}
}

// validateAPI checks the flow API's flags. Records name users, paths and
// explanations: plain HTTP is fine on loopback, anywhere else the API
// needs TLS and client authentication.
func (o *Options) validateAPI() error {
	if !o.apiOn() {
		return nil
	}
	host, _, err := net.SplitHostPort(o.APIListen)
	if err != nil {
		return fmt.Errorf("--api-listen=%q: want host:port, e.g. %s, or off (%v)", o.APIListen, DefaultAPIListen, err)
	}
	switch {
	case o.APIBuffer < 0:
		return fmt.Errorf("--api-buffer=%d: want how many flows the API keeps, e.g. %d", o.APIBuffer, DefaultAPIBuffer)
	case o.APIRerunKeepBytes < 0:
		return fmt.Errorf("--api-rerun-keep-mib: want a positive size (and --api-rerun-keep=0 to turn re-runs off)")
	case (o.APITLSCertFile == "") != (o.APITLSKeyFile == ""):
		return errors.New("--api-tls-cert-file and --api-tls-private-key-file go together: give both for a TLS flow API, or neither on loopback")
	case o.APIClientCAFile != "" && o.APITLSCertFile == "":
		return errors.New("--api-client-ca-file needs --api-tls-cert-file and --api-tls-private-key-file: client certificates are part of TLS")
	}
	if isLoopback(host) {
		return nil
	}
	if o.APITLSCertFile == "" || (o.APIClientCAFile == "" && o.APITokenFile == "") {
		return fmt.Errorf("--api-listen=%s is not a loopback address: the flow API serves records that name users, paths and explanations, "+
			"so off loopback it needs TLS (--api-tls-cert-file and --api-tls-private-key-file) and client authentication "+
			"(--api-client-ca-file or --api-token-file); or listen on %s", o.APIListen, DefaultAPIListen)
	}
	return nil
}

// isLoopback reports a host that only this machine can reach.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// flowAPI is the flow API's listener and server.
type flowAPI struct {
	ln     net.Listener
	srv    *http.Server
	tls    bool
	cancel context.CancelFunc // ends open streams
}

// listenAPI builds the flow API over s.Flows, with the proxy re-running
// flows, and starts listening, so that its address is known before Run.
func (s *Server) listenAPI() error {
	o := s.opts
	if !o.apiOn() {
		return nil
	}
	hopts := flowapi.HandlerOptions{Log: s.log}
	if s.handler != nil { // a nil *Proxy must not become a non-nil Replayer
		hopts.Replay, hopts.ReplayFilter = s.handler, s.handler
	}
	var protection []string
	var tlsCfg *tls.Config
	if o.APITLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(o.APITLSCertFile, o.APITLSKeyFile)
		if err != nil {
			return fmt.Errorf("--api-tls-cert-file/--api-tls-private-key-file: %w", err)
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		protection = append(protection, "TLS")
	} else {
		protection = append(protection, "plain HTTP on loopback")
	}
	if o.APITokenFile != "" {
		b, err := os.ReadFile(o.APITokenFile)
		if err != nil {
			return fmt.Errorf("--api-token-file: %w", err)
		}
		if hopts.Token = strings.TrimSpace(string(b)); hopts.Token == "" {
			return fmt.Errorf("--api-token-file=%s is empty: put the bearer token clients must send in it", o.APITokenFile)
		}
		protection = append(protection, "bearer token (--api-token-file)")
	}
	if o.APIClientCAFile != "" {
		pool, err := readPool("--api-client-ca-file", o.APIClientCAFile, x509.NewCertPool())
		if err != nil {
			return err
		}
		tlsCfg.ClientCAs = pool
		tlsCfg.ClientAuth = tls.RequireAndVerifyClientCert
		if hopts.Token != "" {
			// Either will do: the handler checks for one or the other.
			tlsCfg.ClientAuth = tls.VerifyClientCertIfGiven
			hopts.ClientCerts = true
		}
		protection = append(protection, "client certificates (--api-client-ca-file)")
	}
	if o.APITokenFile == "" && o.APIClientCAFile == "" {
		protection = append(protection, "no client authentication")
	}

	ln, err := net.Listen("tcp", o.APIListen)
	if err != nil {
		return fmt.Errorf("--api-listen=%s: %w (another kproxy serve may hold it: give another address, 127.0.0.1:0 for a free port, or off)", o.APIListen, err)
	}
	baseCtx, cancel := context.WithCancel(context.Background())
	a := &flowAPI{ln: ln, tls: tlsCfg != nil, cancel: cancel}
	a.srv = &http.Server{
		Handler:   flowapi.NewHandler(s.Flows, hopts),
		TLSConfig: tlsCfg,
		// No WriteTimeout: streams are long-lived (the handler bounds
		// each write itself).
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return baseCtx },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	s.api = a
	// Registered last, so closed first: no re-run writes a record after
	// the capture file is closed.
	s.shutdown = append(s.shutdown, a.close)
	scheme := "http"
	if a.tls {
		scheme = "https"
	}
	s.APIURL = scheme + "://" + ln.Addr().String()
	s.log.Info("flow API listening", "url", s.APIURL, "protection", strings.Join(protection, ", "),
		"buffer", s.Flows.Capacity(), "rerunKeep", o.rerunLimits().Flows)
	if l := o.rerunLimits(); l.Flows > 0 {
		s.log.Info("for re-runs, kproxy keeps the newest flows' requests in memory, credentials included (never written anywhere)",
			"flows", l.Flows, "bodyBytes", l.Bytes)
	}
	return nil
}

func (a *flowAPI) serve(log *slog.Logger) {
	var err error
	if a.tls {
		err = a.srv.ServeTLS(a.ln, "", "")
	} else {
		err = a.srv.Serve(a.ln)
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("flow API stopped", "error", err)
	}
}

// close ends the open streams (cleanly, so clients see the end), then
// waits a little for other requests.
func (a *flowAPI) close(ctx context.Context) error {
	a.cancel()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := a.srv.Shutdown(ctx)
	a.ln.Close() // when Serve never ran
	return err
}

// flowLogger is --log-flows: one line per finished flow.
type flowLogger struct{ log *slog.Logger }

func (f flowLogger) Write(r *record.Record) {
	attrs := []any{"id", r.ID, "method", r.Request.Method, "path", r.Request.Path, "user", r.Request.User,
		"predicted", predictedAt(r.Predicted), "actual", r.Actual.Status, "agreement", agreement(r),
		"latency", time.Duration(r.Latency.TotalNs)}
	if r.RerunOf != "" {
		attrs = append(attrs, "rerunOf", r.RerunOf)
	}
	f.log.Info("flow", attrs...)
}

// predictedAt is "403@authorization", "200", or "unknown".
func predictedAt(p record.Prediction) string {
	switch p.Stage {
	case record.StageUnknown:
		return "unknown"
	case "":
		return fmt.Sprint(p.Status)
	}
	return fmt.Sprintf("%d@%s", p.Status, p.Stage)
}

// agreement compares the prediction with the answer as the tests do:
// status and reason (unknown as flowview.Agreement says).
func agreement(r *record.Record) string {
	switch _, kind := flowview.Agreement(r); {
	case kind == flowview.Unknown:
		return "unknown"
	case kind == flowview.Match && r.Predicted.Reason == r.Actual.Reason:
		return "agree"
	}
	return "disagree"
}
