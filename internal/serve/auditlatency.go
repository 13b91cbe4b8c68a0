package serve

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/kproxy/kproxy/internal/auditlatency"
)

// The apiserver's own account of slow requests from its audit events'
// latency annotations (internal/auditlatency): received from its audit
// webhook backend (--audit-webhook-listen) or read from its JSON audit
// log (--audit-log-follow), and joined to the records by the same Joiner
// as its spans (servertrace.go).

// auditWebhookOn reports whether kproxy receives the apiserver's audit
// webhook backend.
func (o *Options) auditWebhookOn() bool {
	return o.AuditWebhookListen != "" && o.AuditWebhookListen != "off"
}

// auditLatencyOn reports whether kproxy reads the apiserver's audit
// latency annotations at all.
func (o *Options) auditLatencyOn() bool { return o.auditWebhookOn() || o.AuditLogFollow != "" }

// validateAuditLatency checks the audit flags. The audit webhook receives
// what the apiserver audits (users, paths, at level Metadata): plain HTTP
// is fine on loopback, anywhere else it needs TLS.
func (o *Options) validateAuditLatency() error {
	switch o.AuditLogFollow {
	case "-":
		return errors.New("--audit-log-follow=-: give the file the apiserver's --audit-log-path writes; for an apiserver auditing to its standard output, use --audit-webhook-listen")
	}
	tlsGiven := o.AuditWebhookTLSCertFile != "" || o.AuditWebhookTLSKeyFile != "" || o.AuditWebhookClientCAFile != ""
	if !o.auditWebhookOn() {
		if tlsGiven {
			return errors.New("--audit-webhook-tls-cert-file, --audit-webhook-tls-private-key-file and --audit-webhook-client-ca-file need --audit-webhook-listen")
		}
		return nil
	}
	host, _, err := net.SplitHostPort(o.AuditWebhookListen)
	if err != nil {
		return fmt.Errorf("--audit-webhook-listen=%q: want host:port, e.g. 127.0.0.1:7071, or off (%v)", o.AuditWebhookListen, err)
	}
	switch {
	case (o.AuditWebhookTLSCertFile == "") != (o.AuditWebhookTLSKeyFile == ""):
		return errors.New("--audit-webhook-tls-cert-file and --audit-webhook-tls-private-key-file go together: give both for a TLS audit webhook, or neither on loopback")
	case o.AuditWebhookClientCAFile != "" && o.AuditWebhookTLSCertFile == "":
		return errors.New("--audit-webhook-client-ca-file needs --audit-webhook-tls-cert-file and --audit-webhook-tls-private-key-file: client certificates are part of TLS")
	case !isLoopback(host) && o.AuditWebhookTLSCertFile == "":
		return fmt.Errorf("--audit-webhook-listen=%s is not a loopback address: the apiserver's audit events name users and paths, "+
			"so off loopback the audit webhook needs TLS (--audit-webhook-tls-cert-file and --audit-webhook-tls-private-key-file, "+
			"and best --audit-webhook-client-ca-file for the apiserver's client certificate); or listen on 127.0.0.1", o.AuditWebhookListen)
	}
	return nil
}

// auditLatency is the audit webhook's listener and server, and the audit
// log's follower.
type auditLatency struct {
	webhook *auditlatency.Webhook
	ln      net.Listener
	srv     *http.Server
	tls     bool
	log     *slog.Logger
	// cancel stops the webhook's hand-off and the follower; wg waits for
	// them.
	cancel context.CancelFunc
	wg     sync.WaitGroup
	follow *auditlatency.Stats
}

// listenAuditLatency starts the audit sources, feeding the Joiner
// (joinServerTrace made it; when audit annotations are its only source it
// lets requests faster than auditlatency.Threshold pass at once). The
// webhook's address is known when it returns; it is served by Run.
func (s *Server) listenAuditLatency() error {
	o := s.opts
	if !o.auditLatencyOn() {
		return nil
	}
	if s.Joiner == nil {
		return errors.New("the audit sources need the joiner: none was made (joinOn must include auditLatencyOn)")
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &auditLatency{log: s.log, cancel: cancel}
	s.audit = a
	// Registered after the joiner's close, so run before it: no
	// observation arrives once the joiner has written what it held.
	s.shutdown = append(s.shutdown, a.close)
	if o.auditWebhookOn() {
		if err := s.listenAuditWebhook(ctx, a); err != nil {
			return err
		}
	}
	if o.AuditLogFollow != "" {
		if err := checkAuditLog(o.AuditLogFollow); err != nil {
			return err
		}
		a.follow = &auditlatency.Stats{}
		// New returns once the follower has taken its place at the end
		// of the log (or found none yet): what is written after it is
		// read.
		placed, once := make(chan struct{}), sync.Once{}
		ended := make(chan struct{})
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			defer close(ended)
			err := auditlatency.FollowLog(ctx, o.AuditLogFollow, s.Joiner.Offer, auditlatency.FollowOptions{Stats: a.follow, Log: s.log,
				Idle: func() { once.Do(func() { close(placed) }) }})
			if err != nil {
				s.log.Error("--audit-log-follow: stopped following the audit log", "error", err)
			}
		}()
		select {
		case <-placed:
		case <-ended:
		case <-time.After(10 * time.Second):
			s.log.Warn("--audit-log-follow: the audit log has not been opened after 10s; carrying on", "path", o.AuditLogFollow)
		}
		s.log.Info("following the apiserver's audit log for its latency annotations (slow requests only)",
			"path", o.AuditLogFollow, "threshold", auditlatency.Threshold, "recordsWait", o.serverTraceWait())
	}
	if o.serverTraceOn() {
		s.log.Info("both the apiserver's spans and its audit annotations are received: a record takes whichever comes first")
	}
	return nil
}

// checkAuditLog fails at once on an audit log kproxy could never read; a
// file that does not exist yet is waited for.
func checkAuditLog(path string) error {
	info, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("--audit-log-follow=%s: %w", path, err)
	case !info.Mode().IsRegular():
		return fmt.Errorf("--audit-log-follow=%s is not a regular file: give the file the apiserver's --audit-log-path writes", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--audit-log-follow=%s: %w (the apiserver creates its audit log readable by its own user only: run kproxy as that user, or give it read access)", path, err)
	}
	return f.Close()
}

// listenAuditWebhook starts listening for the apiserver's audit webhook
// backend.
func (s *Server) listenAuditWebhook(ctx context.Context, a *auditLatency) error {
	o := s.opts
	a.webhook = auditlatency.NewWebhook(s.Joiner.Offer, auditlatency.WebhookOptions{Log: s.log})
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		a.webhook.Run(ctx)
	}()
	protection := "plain HTTP on loopback"
	var tlsCfg *tls.Config
	if o.AuditWebhookTLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(o.AuditWebhookTLSCertFile, o.AuditWebhookTLSKeyFile)
		if err != nil {
			return fmt.Errorf("--audit-webhook-tls-cert-file/--audit-webhook-tls-private-key-file: %w", err)
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		protection = "TLS, no client authentication"
		if o.AuditWebhookClientCAFile != "" {
			pool, err := readPool("--audit-webhook-client-ca-file", o.AuditWebhookClientCAFile, x509.NewCertPool())
			if err != nil {
				return err
			}
			tlsCfg.ClientCAs, tlsCfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
			protection = "TLS, client certificates (--audit-webhook-client-ca-file)"
		}
	}
	ln, err := net.Listen("tcp", o.AuditWebhookListen)
	if err != nil {
		return fmt.Errorf("--audit-webhook-listen=%s: %w (give another address, or off)", o.AuditWebhookListen, err)
	}
	a.ln, a.tls = ln, tlsCfg != nil
	a.srv = &http.Server{Handler: a.webhook, TLSConfig: tlsCfg,
		ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	scheme := "http"
	if a.tls {
		scheme = "https"
	}
	s.AuditWebhookURL = scheme + "://" + ln.Addr().String()
	s.log.Info("receiving the apiserver's audit webhook for its latency annotations (slow requests only): point the server of its --audit-webhook-config-file here",
		"url", s.AuditWebhookURL, "protection", protection, "threshold", auditlatency.Threshold, "recordsWait", o.serverTraceWait())
	if host, _, _ := net.SplitHostPort(o.AuditWebhookListen); !isLoopback(host) && o.AuditWebhookClientCAFile == "" {
		s.log.Warn("the audit webhook listens beyond loopback without client authentication: whoever reaches it can attach latencies to kproxy's records; "+
			"give --audit-webhook-client-ca-file and a client certificate in the apiserver's --audit-webhook-config-file", "addr", ln.Addr().String())
	}
	return nil
}

func (a *auditLatency) serve() {
	if a.srv == nil {
		return
	}
	var err error
	if a.tls {
		err = a.srv.ServeTLS(a.ln, "", "")
	} else {
		err = a.srv.Serve(a.ln)
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		a.log.Error("audit webhook stopped", "error", err)
	}
}

// close stops the webhook (letting a batch being received finish) and the
// follower.
func (a *auditLatency) close(ctx context.Context) error {
	var err error
	if a.srv != nil {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = a.srv.Shutdown(ctx)
		cancel()
		a.ln.Close() // when Serve never ran
	}
	a.cancel()
	a.wg.Wait()
	var parts []string
	if a.webhook != nil {
		c := a.webhook.Counts()
		parts = append(parts, fmt.Sprintf("webhook: %d events, %d with latency, %d bodies refused, %d dropped", c.Events, c.Observations, c.Skipped, c.Dropped))
	}
	if a.follow != nil {
		c := a.follow.Counts()
		parts = append(parts, fmt.Sprintf("audit log: %d events, %d with latency, %d lines skipped", c.Events, c.Observations, c.Skipped))
	}
	a.log.Info("stopped reading the apiserver's audit events", "read", strings.Join(parts, "; "))
	return err
}
