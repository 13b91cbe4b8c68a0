package serve

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/telemetry"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

func TestValidate(t *testing.T) {
	good := func() Options { return Options{Mode: "reverse", Listen: "127.0.0.1:8443", APIListen: "127.0.0.1:0"} }
	tlsAnd := func(o *Options) { o.APITLSCertFile, o.APITLSKeyFile = "c.crt", "c.key" }
	auditTLS := func(o *Options) { o.AuditWebhookTLSCertFile, o.AuditWebhookTLSKeyFile = "c.crt", "c.key" }
	for _, tc := range []struct {
		name   string
		mutate func(*Options)
		want   string
	}{
		{"ok", func(*Options) {}, ""},
		{"bad mode", func(o *Options) { o.Mode = "sideways" }, `--mode="sideways"`},
		{"half a certificate", func(o *Options) { o.TLSCertFile = "c.crt" }, "--tls-cert-file and --tls-private-key-file go together"},
		{"bad listen", func(o *Options) { o.Listen = "8443" }, `--listen="8443"`},
		{"http upstream", func(o *Options) { o.Upstream = "http://10.0.0.1:6443" }, `--upstream="http://10.0.0.1:6443"`},
		{"negative body idle timeout", func(o *Options) { o.BodyIdleTimeout = -time.Second }, "--request-body-idle-timeout=-1s"},
		{"negative connection limit", func(o *Options) { o.MaxConnections = -1 }, "--max-connections=-1"},
		// The apiserver's own account: its spans, its audit events.
		{"otlp receiver: off", func(*Options) {}, ""},
		{"otlp receiver: on", func(o *Options) { o.OTLPReceiverListen = "127.0.0.1:4317" }, ""},
		{"otlp receiver: no port", func(o *Options) { o.OTLPReceiverListen = "127.0.0.1" }, `--otlp-receiver-listen="127.0.0.1": want host:port`},
		{"otlp receiver: negative wait", func(o *Options) { o.ServerTraceWait = -time.Second }, "--server-trace-wait=-1s"},
		{"otlp receiver: an hour's wait", func(o *Options) { o.ServerTraceWait = time.Hour }, "at most 1m0s"},
		{"otlp receiver: a loop", func(o *Options) {
			o.OTLPReceiverListen, o.Telemetry = ":4317", telemetry.Options{Endpoint: "localhost:4317", Protocol: "grpc"}
		}, "kproxy would pass the apiserver's spans on to itself"},
		{"otlp receiver: a loop by URL", func(o *Options) {
			o.OTLPReceiverListen, o.Telemetry = "127.0.0.1:4318", telemetry.Options{Endpoint: "http://127.0.0.1:4318/", Protocol: "http/protobuf"}
		}, "is also where kproxy exports its own traces"},
		{"otlp receiver: a collector beside it", func(o *Options) {
			o.OTLPReceiverListen, o.Telemetry = "127.0.0.1:14317", telemetry.Options{Endpoint: "127.0.0.1:4317", Protocol: "grpc"}
		}, ""},
		{"audit: off", func(*Options) {}, ""},
		{"audit: off by name", func(o *Options) { o.AuditWebhookListen = "off" }, ""},
		{"audit: loopback, plain HTTP", func(o *Options) { o.AuditWebhookListen = "127.0.0.1:7071" }, ""},
		{"audit: localhost", func(o *Options) { o.AuditWebhookListen = "localhost:7071" }, ""},
		{"audit: no port", func(o *Options) { o.AuditWebhookListen = "127.0.0.1" }, `--audit-webhook-listen="127.0.0.1": want host:port`},
		{"audit: elsewhere, plain", func(o *Options) { o.AuditWebhookListen = "0.0.0.0:7071" },
			"--audit-webhook-listen=0.0.0.0:7071 is not a loopback address"},
		{"audit: elsewhere, TLS", func(o *Options) { o.AuditWebhookListen = "10.0.0.1:7071"; auditTLS(o) }, ""},
		{"audit: elsewhere, TLS and client certificates", func(o *Options) {
			o.AuditWebhookListen = ":7071"
			auditTLS(o)
			o.AuditWebhookClientCAFile = "ca.crt"
		}, ""},
		{"audit: half a certificate", func(o *Options) { o.AuditWebhookListen = "127.0.0.1:7071"; o.AuditWebhookTLSKeyFile = "c.key" },
			"--audit-webhook-tls-cert-file and --audit-webhook-tls-private-key-file go together"},
		{"audit: client CA without TLS", func(o *Options) { o.AuditWebhookListen = "127.0.0.1:7071"; o.AuditWebhookClientCAFile = "ca.crt" },
			"--audit-webhook-client-ca-file needs --audit-webhook-tls-cert-file"},
		{"audit: TLS without the webhook", func(o *Options) { auditTLS(o) }, "need --audit-webhook-listen"},
		{"audit: the log", func(o *Options) { o.AuditLogFollow = "/var/log/kubernetes/audit.log" }, ""},
		{"audit: the log on standard output", func(o *Options) { o.AuditLogFollow = "-" }, "use --audit-webhook-listen"},
		// The flow API: plain HTTP on loopback only.
		{"loopback, plain HTTP", func(*Options) {}, ""},
		{"off", func(o *Options) { o.APIListen = "off" }, ""},
		{"off when empty", func(o *Options) { o.APIListen = "" }, ""},
		{"localhost", func(o *Options) { o.APIListen = "localhost:7070" }, ""},
		{"IPv6 loopback", func(o *Options) { o.APIListen = "[::1]:7070" }, ""},
		{"no port", func(o *Options) { o.APIListen = "127.0.0.1" }, `--api-listen="127.0.0.1": want host:port`},
		{"every interface, plain", func(o *Options) { o.APIListen = ":7070" },
			"--api-listen=:7070 is not a loopback address"},
		{"elsewhere, plain", func(o *Options) { o.APIListen = "10.0.0.1:7070" },
			"needs TLS (--api-tls-cert-file and --api-tls-private-key-file) and client authentication (--api-client-ca-file or --api-token-file)"},
		{"elsewhere, TLS without client authentication", func(o *Options) { o.APIListen = "0.0.0.0:7070"; tlsAnd(o) },
			"--api-listen=0.0.0.0:7070 is not a loopback address"},
		{"elsewhere, a token without TLS", func(o *Options) { o.APIListen = "0.0.0.0:7070"; o.APITokenFile = "t" },
			"needs TLS (--api-tls-cert-file"},
		{"elsewhere, TLS and a token", func(o *Options) { o.APIListen = "0.0.0.0:7070"; tlsAnd(o); o.APITokenFile = "t" }, ""},
		{"elsewhere, TLS and client certificates", func(o *Options) { o.APIListen = "0.0.0.0:7070"; tlsAnd(o); o.APIClientCAFile = "ca" }, ""},
		{"half an API certificate", func(o *Options) { o.APITLSCertFile = "c.crt" }, "--api-tls-cert-file and --api-tls-private-key-file go together"},
		{"client CA without TLS", func(o *Options) { o.APIClientCAFile = "ca" }, "--api-client-ca-file needs --api-tls-cert-file"},
		{"negative buffer", func(o *Options) { o.APIBuffer = -1 }, "--api-buffer=-1"},
		// kproxy's own metrics and the replay pool.
		{"metrics: off", func(o *Options) { o.MetricsListen = "off" }, ""},
		{"metrics: loopback", func(o *Options) { o.MetricsListen = "127.0.0.1:9090" }, ""},
		{"metrics: every interface", func(o *Options) { o.MetricsListen = ":9090" }, ""},
		{"metrics: no port", func(o *Options) { o.MetricsListen = "127.0.0.1" }, `--metrics-listen="127.0.0.1": want host:port`},
		{"replay pool: sized by hand", func(o *Options) { o.ReplayWorkers, o.ReplayQueue = 1, 1 }, ""},
		{"replay pool: negative workers", func(o *Options) { o.ReplayWorkers = -1 }, "--replay-workers=-1"},
		{"replay pool: negative queue", func(o *Options) { o.ReplayQueue = -2 }, "--replay-queue=-2"},
		{"replay cpu pressure over 100%", func(o *Options) { o.ReplayCPUPressure = 140 }, "--replay-cpu-pressure=140"},
		{"replay cpu pressure negative", func(o *Options) { o.ReplayCPUPressure = -1 }, "--replay-cpu-pressure=-1"},
		// --replay-filter: a request's own terms only.
		{"replay filter: a namespace", func(o *Options) { o.ReplayFilter = "~n payments | ~u alice" }, ""},
		{"replay filter: the answer", func(o *Options) { o.ReplayFilter = "~n payments & ~c 403" }, `--replay-filter="~n payments & ~c 403": ~c needs the apiserver's answer`},
		{"replay filter: a syntax error", func(o *Options) { o.ReplayFilter = "~n (" }, "--replay-filter: ~n wants a namespace, got (\n~n (\n   ^"},
		{"replay filter: replay off", func(o *Options) { o.ReplayFilter, o.NoReplay = "~n x", true }, "with --replay=false: the replay is off"},
		// Capture rotation: the --capture-max* flags need --capture and a size.
		{"capture: rotated", func(o *Options) {
			o.Capture, o.CaptureRotation = "c.jsonl", record.Rotation{MaxSize: 64 << 20, MaxBackups: 5, MaxAge: 24 * time.Hour, Compress: true}
		}, ""},
		{"capture: a size without a file", func(o *Options) { o.CaptureRotation.MaxSize = 64 << 20 }, "give --capture FILE too"},
		{"capture: backups without a size", func(o *Options) { o.Capture, o.CaptureRotation.MaxBackups = "c.jsonl", 3 },
			"--capture-maxbackup: capture files rotate only past a size: give --capture-maxsize MiB too"},
		{"capture: compress and age without a size", func(o *Options) {
			o.Capture, o.CaptureRotation.Compress, o.CaptureRotation.MaxAge = "c.jsonl", true, time.Hour
		}, "--capture-maxage, --capture-compress: capture files rotate only past a size"},
		{"capture: negative backups", func(o *Options) {
			o.Capture, o.CaptureRotation = "c.jsonl", record.Rotation{MaxSize: 1 << 20, MaxBackups: -1}
		}, "--capture-maxbackup=-1"},
		{"capture: standard output", func(o *Options) { o.Capture = "-" }, ""},
		{"capture: standard output, rotated", func(o *Options) { o.Capture, o.CaptureRotation.MaxSize = "-", 64<<20 },
			"--capture-maxsize rotates a capture file, and --capture - writes to standard output"},
		{"replay: off", func(o *Options) { o.NoReplay = true }, ""},
		{"replay: off, with a pool sized by hand", func(o *Options) { o.NoReplay, o.ReplayWorkers, o.ReplayQueue = true, 4, 8 }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := good()
			tc.mutate(&o)
			err := o.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestCertAuthenticatorErrorsNameTheFlag(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--client-ca-file=" + filepath.Join(dir, "missing.crt")}, "--client-ca-file="},
		{[]string{"--client-ca-file=" + notPEM}, "no PEM certificates"},
		{[]string{"--requestheader-client-ca-file=" + notPEM}, "--requestheader-client-ca-file="},
	} {
		o, _, err := apiserver.OptionsFromArgs(tc.args)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := certAuthenticator(o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestNoReplay: with the replay off (--replay=false), kproxy forwards
// and records, every prediction unknown, and makes no request of its own
// to the apiserver (no informers, no discovery), even with credentials
// to read the cluster with.
func TestNoReplay(t *testing.T) {
	const path = "/api/v1/namespaces/default/configmaps/x"
	var mu sync.Mutex
	var seen []string
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		if r.URL.Path != path {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x","namespace":"default"}}`)
	}))
	defer upstream.Close()
	dir := t.TempDir()
	kc := upstreamKubeconfig(t, dir, upstream)

	stream := record.NewStream()
	recs, _, cancel := stream.Subscribe(8)
	defer cancel()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	s, err := New(ctx, &Options{UpstreamKubeconfig: kc, Listen: "127.0.0.1:0", Mode: "reverse", PKIDir: filepath.Join(dir, "pki"),
		APIListen: "off", MetricsListen: "127.0.0.1:0", NoReplay: true, Stream: stream,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if s.pipeline.Load() != nil {
		t.Error("the replay pipeline was built with the replay off")
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { stop(); <-done }()

	// Ready at once: there is no cluster state to wait for.
	resp, err := http.Get("http://" + s.MetricsAddr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz with the replay off: %d, want 200", resp.StatusCode)
	}

	pool := x509.NewCertPool()
	pool.AddCert(s.CA.Cert)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer client.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodGet, "https://"+s.Addr+path, nil)
	req.Header.Set("Authorization", "Bearer caller-token")
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("forwarded GET: %d, want 200", resp.StatusCode)
	}
	select {
	case rec := <-recs:
		if p := rec.Predicted; p.Stage != record.StageUnknown || p.Message != "cannot predict: the replay is disabled" {
			t.Errorf("predicted %+v, want unknown: the replay is disabled", p)
		}
		if rec.Actual.Status != http.StatusOK {
			t.Errorf("actual %d, want the apiserver's 200", rec.Actual.Status)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no record of the forwarded request")
	}
	mu.Lock()
	defer mu.Unlock()
	if want := "GET " + path + " Bearer caller-token"; len(seen) != 1 || seen[0] != want {
		t.Errorf("the apiserver saw %q, want only the forwarded request %q", seen, want)
	}
}

// upstreamKubeconfig writes, into dir, a kubeconfig for upstream with a
// token of kproxy's own (so kproxy replays, reading the cluster).
func upstreamKubeconfig(t *testing.T, dir string, upstream *httptest.Server) string {
	t.Helper()
	kc := filepath.Join(dir, "upstream.kubeconfig")
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["up"] = &clientcmdapi.Cluster{Server: upstream.URL,
		CertificateAuthorityData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: upstream.Certificate().Raw})}
	cfg.AuthInfos["kproxy"] = &clientcmdapi.AuthInfo{Token: "kproxy-own-token"}
	cfg.Contexts["up"] = &clientcmdapi.Context{Cluster: "up", AuthInfo: "kproxy"}
	cfg.CurrentContext = "up"
	if err := clientcmd.WriteToFile(*cfg, kc); err != nil {
		t.Fatal(err)
	}
	return kc
}

// TestReadyzWhileStarting: kproxy serves /livez and /readyz from the
// moment New starts, not once its replay's caches have synced: while it
// waits on an apiserver that does not answer, /readyz is a 503 saying
// what it waits for and /livez is ok (a liveness probe must not kill a
// kproxy that is syncing); when the sync gives up, /readyz says the
// cluster state has not synced.
func TestReadyzWhileStarting(t *testing.T) {
	release := make(chan struct{})
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
	}))
	defer upstream.Close()
	var once sync.Once
	releaseUpstream := func() { once.Do(func() { close(release) }) }
	defer releaseUpstream()
	dir := t.TempDir()
	var log lockedBuffer
	type built struct {
		s   *Server
		err error
	}
	done := make(chan built, 1)
	go func() {
		s, err := New(context.Background(), &Options{UpstreamKubeconfig: upstreamKubeconfig(t, dir, upstream),
			Listen: "127.0.0.1:0", Mode: "reverse", PKIDir: filepath.Join(dir, "pki"), APIListen: "off",
			MetricsListen: "127.0.0.1:0", SyncTimeout: 2 * time.Second,
			Log: slog.New(slog.NewTextHandler(&log, nil))})
		done <- built{s, err}
	}()
	// Where it listens, from its log: New has not returned to say.
	listening := regexp.MustCompile(`msg="serving kproxy's metrics" addr=(\S+)`)
	var metricsAddr string
	get := func(path string) (int, string) {
		if metricsAddr == "" {
			m := listening.FindStringSubmatch(log.String())
			if m == nil {
				return 0, "not listening yet"
			}
			metricsAddr = m[1]
		}
		resp, err := http.Get("http://" + metricsAddr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := get("/readyz")
		if code == http.StatusServiceUnavailable {
			if !strings.HasPrefix(body, "not ready: kproxy is starting: ") {
				t.Errorf("/readyz while starting: %q, want it to say kproxy is starting and on what", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never answered while kproxy was starting (last: %d %s)", code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, body := get("/livez"); code != http.StatusOK {
		t.Errorf("/livez while starting: %d %s, want 200", code, body)
	}
	releaseUpstream()
	var b built
	select {
	case b = <-done:
	case <-time.After(time.Minute):
		t.Fatal("New did not return after its sync timeout")
	}
	if b.err != nil {
		t.Fatalf("New: %v", b.err)
	}
	defer b.s.close(context.Background())
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable ||
		body != "not ready: the replay's cluster state has not synced" {
		t.Errorf("/readyz after the sync gave up: %d %q, want 503 saying the cluster state has not synced", code, body)
	}
}

// lockedBuffer is a log written by one goroutine and read by another.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
