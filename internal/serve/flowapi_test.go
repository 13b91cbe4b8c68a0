package serve

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/flowapi"
	"github.com/kproxy/kproxy/internal/pki"
	"github.com/kproxy/kproxy/internal/record"
)

func TestRerunLimitsOnlyWithTheAPI(t *testing.T) {
	o := Options{APIRerunKeep: 5}
	if l := o.rerunLimits(); l.Flows != 0 {
		t.Errorf("API off: re-run limits %+v, want none kept", l)
	}
	o.APIListen = "127.0.0.1:0"
	if l := o.rerunLimits(); l.Flows != 5 || l.Bytes != DefaultAPIRerunKeepBytes {
		t.Errorf("API on: re-run limits %+v", l)
	}
}

// startAPI runs the flow API alone, as New would, over a buffer holding
// one record.
func startAPI(t *testing.T, o *Options) *Server {
	t.Helper()
	s := &Server{opts: o, log: slog.New(slog.DiscardHandler), Flows: flowapi.NewBuffer(4)}
	s.Flows.Write(&record.Record{ID: "one"})
	if err := s.listenAPI(); err != nil {
		t.Fatal(err)
	}
	go s.api.serve(s.log)
	t.Cleanup(func() { s.close(context.Background()) })
	return s
}

func TestFlowAPIProtection(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.NewCA("test-ca")
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
	caFile := write("ca.crt", pki.CertPEM(ca.Cert))
	serving, _ := ca.Issue(pki.Leaf{CommonName: "kproxy", Server: true, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	servingCert, servingKey, err := pki.WritePair(dir, "serving", serving.Cert, serving.Key)
	if err != nil {
		t.Fatal(err)
	}
	client, _ := ca.Issue(pki.Leaf{CommonName: "viewer", Client: true})
	clientCert, clientKey, err := pki.WritePair(dir, "client", client.Cert, client.Key)
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := write("token", []byte("s3cret\n"))

	tlsOpts := func(ca, token string) *Options {
		return &Options{APIListen: "127.0.0.1:0", APITLSCertFile: servingCert, APITLSKeyFile: servingKey, APIClientCAFile: ca, APITokenFile: token}
	}
	for _, tc := range []struct {
		name    string
		opts    *Options
		client  flowapi.ClientOptions
		scheme  string
		wantErr string
	}{
		{"loopback, plain", &Options{APIListen: "127.0.0.1:0"}, flowapi.ClientOptions{}, "http://", ""},
		{"TLS and a token: the token", tlsOpts("", tokenFile), flowapi.ClientOptions{CAFile: caFile, Token: "s3cret"}, "https://", ""},
		{"TLS and a token: none", tlsOpts("", tokenFile), flowapi.ClientOptions{CAFile: caFile}, "https://", "401"},
		{"TLS and client certificates: a certificate", tlsOpts(caFile, ""), flowapi.ClientOptions{CAFile: caFile, CertFile: clientCert, KeyFile: clientKey}, "https://", ""},
		{"TLS and client certificates: none", tlsOpts(caFile, ""), flowapi.ClientOptions{CAFile: caFile}, "https://", "wants a client certificate signed by kproxy's --api-client-ca-file"},
		{"TLS: an untrusted server", tlsOpts("", tokenFile), flowapi.ClientOptions{Token: "s3cret"}, "https://", "trust the CA that signed kproxy's --api-tls-cert-file"},
		{"either: a certificate", tlsOpts(caFile, tokenFile), flowapi.ClientOptions{CAFile: caFile, CertFile: clientCert, KeyFile: clientKey}, "https://", ""},
		{"either: the token", tlsOpts(caFile, tokenFile), flowapi.ClientOptions{CAFile: caFile, Token: "s3cret"}, "https://", ""},
		{"either: a wrong token", tlsOpts(caFile, tokenFile), flowapi.ClientOptions{CAFile: caFile, Token: "guess"}, "https://", "--api-client-ca-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startAPI(t, tc.opts)
			if !strings.HasPrefix(s.APIURL, tc.scheme) {
				t.Fatalf("APIURL %s, want %s", s.APIURL, tc.scheme)
			}
			c, err := flowapi.NewClient(s.APIURL, tc.client)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.CloseIdleConnections)
			recs, err := c.List(context.Background(), "", 0)
			switch {
			case tc.wantErr == "" && (err != nil || len(recs) != 1):
				t.Fatalf("List: %v, %v", recs, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("List error %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestFlowAPIErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o600)
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"empty token file", Options{APIListen: "127.0.0.1:0", APITokenFile: empty}, "--api-token-file=" + empty + " is empty"},
		{"missing token file", Options{APIListen: "127.0.0.1:0", APITokenFile: filepath.Join(dir, "nope")}, "--api-token-file: "},
		{"missing certificate", Options{APIListen: "127.0.0.1:0", APITLSCertFile: "x", APITLSKeyFile: "y"}, "--api-tls-cert-file/--api-tls-private-key-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Server{opts: &tc.opts, log: slog.New(slog.DiscardHandler), Flows: flowapi.NewBuffer(1)}
			err := s.listenAPI()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
	// The port is taken.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s := &Server{opts: &Options{APIListen: ln.Addr().String()}, log: slog.New(slog.DiscardHandler), Flows: flowapi.NewBuffer(1)}
	if err := s.listenAPI(); err == nil || !strings.Contains(err.Error(), "--api-listen="+ln.Addr().String()) {
		t.Fatalf("error %v, want the flag named", err)
	}
}

func TestFlowLogger(t *testing.T) {
	var out bytes.Buffer
	l := flowLogger{slog.New(slog.NewTextHandler(&out, nil))}
	r := &record.Record{ID: "x", Request: record.Request{Method: "GET", Path: "/api/v1/secrets", User: "alice"},
		Predicted: record.Prediction{Status: 403, Stage: record.StageAuthorization, Reason: "Forbidden"},
		Actual:    record.Actual{Status: 403, Reason: "Forbidden"}, Latency: record.Latency{TotalNs: 1500000}}
	l.Write(r)
	for _, want := range []string{"msg=flow", "method=GET", "path=/api/v1/secrets", "user=alice", "predicted=403@authorization", "actual=403", "agreement=agree", "latency=1.5ms"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("log line %q lacks %q", out.String(), want)
		}
	}
	for _, tc := range []struct {
		p    record.Prediction
		a    record.Actual
		want string
	}{
		{record.Prediction{Status: 200}, record.Actual{Status: 200}, "200 agree"},
		{record.Prediction{Status: 403, Stage: record.StageAuthorization, Reason: "Forbidden"}, record.Actual{Status: 200}, "403@authorization disagree"},
		{record.Prediction{Stage: record.StageUnknown}, record.Actual{Status: 200}, "unknown unknown"},
	} {
		r := &record.Record{Predicted: tc.p, Actual: tc.a}
		if got := predictedAt(tc.p) + " " + agreement(r); got != tc.want {
			t.Errorf("%+v / %+v: %q, want %q", tc.p, tc.a, got, tc.want)
		}
	}
}
