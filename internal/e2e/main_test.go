package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kproxy/kproxy/internal/decode/kmstest"
	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/pki"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
	"github.com/kproxy/kproxy/internal/telemetry"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// cluster is shared by every test in the package; idp serves its
// external authenticators and authorizer.
var (
	cluster *localcluster.Cluster
	idp     *identityServers
)

const testNS = "kproxy-e2e"

// encryptionConfig is the test apiserver's --encryption-provider-config:
// secrets encrypted with aescbc, configmaps with aesgcm, podtemplates with
// secretbox, replicationcontrollers with KMS v2 through the test plugin
// (internal/decode/kmstest) started before the apiserver (test keys only;
// the golden values under testdata/decode/etcd were written with them).
var encryptionConfig string

// kmsEndpointPlaceholder in encryptionConfiguration is replaced with the
// test KMS plugin's socket.
const kmsEndpointPlaceholder = "unix:///run/kproxy-test-kms.sock"

const encryptionConfiguration = `apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources: [secrets]
  providers:
  - aescbc:
      keys:
      - name: cbc-key-1
        secret: c2VjcmV0IGlzIHNlY3VyZSwgdGhpcyBpcyBhIHRlc3Q=
  - identity: {}
- resources: [configmaps]
  providers:
  - aesgcm:
      keys:
      - name: gcm-key-1
        secret: MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=
  - identity: {}
- resources: [podtemplates]
  providers:
  - secretbox:
      keys:
      - name: sb-key-1
        secret: a3Byb3h5IGUyZSBzZWNyZXRib3ggdGVzdCBrZXkhMzI=
  - identity: {}
- resources: [replicationcontrollers]
  providers:
  - kms:
      apiVersion: v2
      name: test-kms
      endpoint: ` + kmsEndpointPlaceholder + `
  - identity: {}
`

// admissionConfiguration is the test apiserver's
// --admission-control-config-file (kproxy reads the same file): PodSecurity
// exempts one namespace, whatever its labels say.
const admissionConfiguration = `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: PodSecurity
  configuration:
    apiVersion: pod-security.admission.config.k8s.io/v1
    kind: PodSecurityConfiguration
    defaults: {enforce: privileged, enforce-version: latest, audit: privileged, audit-version: latest, warn: privileged, warn-version: latest}
    exemptions:
      namespaces: [adm-psa-exempt]
`

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	serve.RouteKlog(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "kproxy-e2e-idp-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if idp, err = startIdentityServers(dir); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: identity servers:", err)
		return 1
	}
	defer idp.close()
	admissionConfig := filepath.Join(dir, "admission-config.yaml")
	if err := os.WriteFile(admissionConfig, []byte(admissionConfiguration), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	kms, err := kmstest.Start(filepath.Join(dir, "kms.sock"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer kms.Stop()
	encryptionConfig = filepath.Join(dir, "encryption-config.yaml")
	if err := os.WriteFile(encryptionConfig, []byte(strings.ReplaceAll(encryptionConfiguration, kmsEndpointPlaceholder, kms.Endpoint)), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	flags := append(append([]string{}, idp.flags...), "--admission-control-config-file="+admissionConfig,
		"--encryption-provider-config="+encryptionConfig)
	cluster, err = localcluster.Start(ctx, localcluster.Options{Log: os.Stderr, ExtraAPIServerFlags: flags, AuthorizationMode: "Node,RBAC,Webhook"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: start cluster:", err)
		return 1
	}
	defer cluster.Stop()
	if err := prepare(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: prepare cluster:", err)
		return 1
	}
	return m.Run()
}

func prepare(ctx context.Context) error {
	cs := adminClient()
	if err := localcluster.GrantKproxy(ctx, cs, "kproxy"); err != nil {
		return err
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, namespace(testNS), createOpts); err != nil {
		return err
	}
	if err := localcluster.EnsureDefaultServiceAccount(ctx, cs, testNS); err != nil {
		return err
	}
	return localcluster.GrantDevs(ctx, cs, testNS)
}

func adminClient() kubernetes.Interface { return adminClientFor(cluster) }

func adminClientFor(c *localcluster.Cluster) kubernetes.Interface {
	return kubernetes.NewForConfigOrDie(c.UserConfig("admin"))
}

// tlsTrusting trusts kproxy's CA.
func tlsTrusting(ca *pki.CA) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return &tls.Config{RootCAs: pool}
}

// kproxyOptions configure a kproxy in front of the shared cluster, the way
// an operator would: kproxy's own token in a kubeconfig, the apiserver's CA
// flags mirrored.
type kproxyOptions struct {
	mode      string
	capture   string
	telemetry telemetry.Options
	stream    *record.Stream
	// noEtcd hands kproxy the apiserver's flags without its etcd access
	// (as in front of a managed cluster): storage is the apiserver's view.
	noEtcd bool
	// etcdServers, when set, replaces the apiserver's --etcd-servers;
	// extraArgs come after the apiserver's own (and win).
	etcdServers string
	extraArgs   []string
	// flowAPI turns on the flow API (a free loopback port, re-runs and
	// --log-flows); log, when set, receives kproxy's log at Info.
	flowAPI bool
	log     io.Writer
	// captureBodies is --capture-bodies.
	captureBodies bool
	// cluster is the cluster kproxy goes in front of (the shared one when
	// nil); set changes any other option last.
	cluster *localcluster.Cluster
	set     func(*serve.Options)
}

type kproxy struct {
	srv    *serve.Server
	addr   string
	apiURL string // the flow API's URL, when on
	ca     *x509.CertPool
	caPEM  []byte
	stop   func()
}

func startKproxy(t testing.TB, o kproxyOptions) *kproxy {
	t.Helper()
	c := o.cluster
	if c == nil {
		c = cluster
	}
	dir := t.TempDir()
	kc, err := c.UpstreamKubeconfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	if o.mode == "" {
		o.mode = "reverse"
	}
	// kproxy gets the apiserver's own command line, as an operator would
	// hand it over.
	args := c.APIServerFlags
	if o.noEtcd || o.etcdServers != "" {
		args = slices.DeleteFunc(slices.Clone(args), func(a string) bool { return strings.HasPrefix(a, "--etcd-servers") })
	}
	if o.etcdServers != "" {
		args = append(args, "--etcd-servers="+o.etcdServers)
	}
	args = append(slices.Clone(args), o.extraArgs...)
	apiserver, _, err := apiserver.OptionsFromArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	opts := &serve.Options{
		UpstreamKubeconfig: kc, Listen: "127.0.0.1:0", Mode: o.mode,
		PKIDir: filepath.Join(dir, "pki"), Capture: o.capture,
		APIServer: apiserver,
		Telemetry: o.telemetry, Stream: o.stream,
		// Logs go to stderr: they can outlive the test that started kproxy.
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if o.log != nil {
		opts.Log = slog.New(slog.NewTextHandler(o.log, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	opts.CaptureBodies = o.captureBodies
	if o.flowAPI {
		opts.APIListen, opts.APIRerunKeep, opts.LogFlows = "127.0.0.1:0", serve.DefaultAPIRerunKeep, true
	}
	if o.set != nil {
		o.set(opts)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := serve.New(ctx, opts)
	if err != nil {
		cancel()
		t.Fatalf("start kproxy: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	k := &kproxy{srv: s, addr: s.Addr, apiURL: s.APIURL, ca: x509.NewCertPool(), caPEM: pki.CertPEM(s.CA.Cert)}
	k.ca.AddCert(s.CA.Cert)
	var once bool
	k.stop = func() {
		if once {
			return
		}
		once = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("kproxy stopped with: %v", err)
		}
	}
	t.Cleanup(k.stop)
	return k
}

// route is one way of reaching the apiserver.
type route struct {
	name string
	base string // URL prefix requests go to
	tls  *tls.Config
	prox func(*http.Request) (*url.URL, error)
	h2   bool // speak HTTP/2 to kproxy
}

func (r route) client(cert *tls.Certificate) *http.Client {
	tc := r.tls.Clone()
	if cert != nil {
		tc.Certificates = []tls.Certificate{*cert}
	}
	tr := &http.Transport{TLSClientConfig: tc, Proxy: r.prox, DisableCompression: true, ForceAttemptHTTP2: r.h2}
	// A redirect (the OpenAPI v3 handler's, for a stale hash) is the
	// answer a test compares with the record: not followed.
	if r.h2 {
		// A response over HTTP/2 proves the client really spoke it.
		return &http.Client{Timeout: time.Minute, Transport: requireH2{tr}, CheckRedirect: noRedirects}
	}
	return &http.Client{Timeout: time.Minute, Transport: tr, CheckRedirect: noRedirects}
}

func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

type requireH2 struct{ rt http.RoundTripper }

func (r requireH2) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.rt.RoundTrip(req)
	if err == nil && resp.ProtoMajor != 2 {
		resp.Body.Close()
		return nil, fmt.Errorf("response over %s, want HTTP/2", resp.Proto)
	}
	return resp, err
}

func directRoute() route {
	return route{name: "direct", base: cluster.URL, tls: &tls.Config{RootCAs: cluster.CAPool()}}
}

func reverseRoute(k *kproxy) route {
	return route{name: "reverse", base: "https://" + k.addr, tls: &tls.Config{RootCAs: k.ca}}
}

func reverseH2Route(k *kproxy) route {
	r := reverseRoute(k)
	r.name, r.h2 = "reverse-h2", true
	return r
}

func forwardRoute(k *kproxy) route {
	pu, _ := url.Parse("http://" + k.addr)
	return route{name: "forward", base: cluster.URL, tls: &tls.Config{RootCAs: k.ca}, prox: http.ProxyURL(pu)}
}
