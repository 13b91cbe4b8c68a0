package serve

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/pki"
	"github.com/kproxy/kproxy/internal/record"
)

// Real kube-apiserver v1.37.2 audit output (internal/auditlatency's
// test data): a batch of its audit webhook backend with two creates slowed
// by webhooks, and its JSON audit log.
const (
	auditBatch     = "../auditlatency/testdata/kube-apiserver-v1.37.2-webhook-batch.json"
	auditBatchSlow = "90b6069c-df9b-4687-b66c-0ec0d963187b"
	auditLogFile   = "../auditlatency/testdata/kube-apiserver-v1.37.2-audit.log"
	auditLogSlow   = "79aadb8f-9220-4884-b5aa-f51586bc3f86" // its third line
)

// auditServer wires the joiner and the audit sources as New does, and
// serves them; records reach got.
func auditServer(t *testing.T, o *Options) (*Server, record.Sink, <-chan *record.Record) {
	t.Helper()
	if o.ServerTraceWait == 0 {
		o.ServerTraceWait = 10 * time.Second
	}
	s := &Server{opts: o, log: slog.New(slog.DiscardHandler)}
	got := make(chan *record.Record, 8)
	sinks := record.Sinks{sinkFunc(func(r *record.Record) { got <- r })}
	join, err := s.joinServerTrace(context.Background(), sinks)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.listenAuditLatency(); err != nil {
		s.close(context.Background())
		t.Fatal(err)
	}
	t.Cleanup(func() { s.close(context.Background()) })
	go s.audit.serve()
	return s, join, got
}

func waitJoined(t *testing.T, got <-chan *record.Record, id string) *record.Record {
	t.Helper()
	select {
	case r := <-got:
		if r.ID != id {
			t.Fatalf("record %s came first, want %s", r.ID, id)
		}
		return r
	case <-time.After(10 * time.Second):
		t.Fatalf("record %s was not written", id)
	}
	return nil
}

// TestAuditWebhookJoinsRecords: a batch POSTed as the apiserver's audit
// webhook backend does joins the record of its slow request; the record
// of a request answered within the threshold is written at once.
func TestAuditWebhookJoinsRecords(t *testing.T) {
	s, sink, got := auditServer(t, &Options{AuditWebhookListen: "127.0.0.1:0"})
	if !strings.HasPrefix(s.AuditWebhookURL, "http://127.0.0.1:") {
		t.Fatalf("AuditWebhookURL %q", s.AuditWebhookURL)
	}
	sink.Write(&record.Record{ID: "fast", Actual: record.Actual{Status: 200, AuditID: "a-fast"}, Latency: record.Latency{UpstreamNs: int64(20 * time.Millisecond)}})
	select {
	case r := <-got:
		if r.ID != "fast" || r.Server != nil {
			t.Fatalf("record %+v", r)
		}
	case <-time.After(time.Second):
		t.Fatal("a fast request's record waited for audit annotations it cannot get")
	}
	sink.Write(&record.Record{ID: "slow", Actual: record.Actual{Status: 201, AuditID: auditBatchSlow}, Latency: record.Latency{UpstreamNs: int64(860 * time.Millisecond)}})
	body, err := os.ReadFile(auditBatch)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(s.AuditWebhookURL+"/audit?timeout=30s", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the audit webhook answered %s", resp.Status)
	}
	r := waitJoined(t, got, "slow")
	if r.Server == nil || r.Server.Source != record.ServerFromAudit || r.Latency.ServerNs != r.Server.TotalNs ||
		!strings.Contains(r.Server.Summary, "703ms in validating webhooks") {
		t.Fatalf("server %+v", r.Server)
	}
}

// TestAuditLogJoinsRecords: a line appended to the followed audit log
// joins the record of its request.
func TestAuditLogJoinsRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	_, sink, got := auditServer(t, &Options{AuditLogFollow: path})
	sink.Write(&record.Record{ID: "slow", Actual: record.Actual{Status: 201, AuditID: auditLogSlow}, Latency: record.Latency{UpstreamNs: int64(860 * time.Millisecond)}})
	b, err := os.ReadFile(auditLogFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	r := waitJoined(t, got, "slow")
	if r.Server == nil || r.Server.Source != record.ServerFromAudit || !strings.Contains(r.Server.Summary, "in validating webhooks") {
		t.Fatalf("server %+v", r.Server)
	}
}

// TestAuditWebhookTLS: off loopback the webhook serves TLS and, with
// --audit-webhook-client-ca-file, takes only the apiserver's certificate.
func TestAuditWebhookTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.NewCA("audit-webhook-test-ca")
	if err != nil {
		t.Fatal(err)
	}
	serving, err := ca.Issue(pki.Leaf{CommonName: "kproxy", Server: true, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.Issue(pki.Leaf{CommonName: "kube-apiserver", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.KeyPEM(serving.Key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	o := &Options{AuditWebhookListen: "127.0.0.1:0",
		AuditWebhookTLSCertFile: write("tls.crt", pki.CertPEM(serving.Cert)), AuditWebhookTLSKeyFile: write("tls.key", key),
		AuditWebhookClientCAFile: write("ca.crt", pki.CertPEM(ca.Cert))}
	s, sink, got := auditServer(t, o)
	if !strings.HasPrefix(s.AuditWebhookURL, "https://") {
		t.Fatalf("AuditWebhookURL %q", s.AuditWebhookURL)
	}
	body, err := os.ReadFile(auditBatch)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	send := func(certs ...tls.Certificate) error {
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: certs}}}
		resp, err := c.Post(s.AuditWebhookURL, "application/json", bytes.NewReader(body))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("the audit webhook answered %s", resp.Status)
		}
		return nil
	}
	if err := send(); err == nil {
		t.Fatal("a client without a certificate was answered")
	}
	sink.Write(&record.Record{ID: "slow", Actual: record.Actual{Status: 201, AuditID: auditBatchSlow}, Latency: record.Latency{UpstreamNs: int64(time.Second)}})
	if err := send(client.TLSCertificate(ca.Cert)); err != nil {
		t.Fatal(err)
	}
	if r := waitJoined(t, got, "slow"); r.Server == nil {
		t.Fatal("not joined")
	}
}
