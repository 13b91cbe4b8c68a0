// Package localcluster starts a real etcd and a real kube-apiserver
// (v1.37.2, built by `make tools` from the same module the replay links) on
// free loopback ports with a fresh PKI, a static token file, service-account
// keys, Node,RBAC authorization and the default admission plugins. The
// tests and `kproxy demo` use it; nothing here is a fake.
package localcluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/pki"
)

// User is a static-token user of the cluster.
type User struct {
	Name   string
	UID    string
	Groups []string
	Token  string
}

// Users in the token file. admin is in system:masters; the others have no
// permissions until a test grants them some. kproxy (kproxy's own
// identity) is also in system:monitoring, which RBAC lets read /metrics
// and the health endpoints only, and from which the apiserver continues
// an incoming traceparent: the certificate callers kproxy forwards by
// impersonation then have one trace, kproxy's spans and the apiserver's.
var Users = []User{
	{Name: "admin", UID: "uid-admin", Groups: []string{"system:masters"}, Token: "admin-token"},
	{Name: "alice", UID: "uid-alice", Groups: []string{"devs"}, Token: "alice-token"},
	{Name: "bob", UID: "uid-bob", Groups: []string{"devs", "qa"}, Token: "bob-token"},
	{Name: "carol", UID: "uid-carol", Groups: []string{"ops"}, Token: "carol-token"},
	{Name: "kproxy", UID: "uid-kproxy", Groups: []string{"kproxy", "system:monitoring"}, Token: "kproxy-token"},
}

// Options tune the cluster.
type Options struct {
	// Dir holds the PKI, data and logs; empty means a new temp dir, removed
	// on Stop.
	Dir string
	// BinDir holds etcd and kube-apiserver; empty means FindBinDir().
	BinDir string
	// ExtraAPIServerFlags are appended to the apiserver's command line.
	ExtraAPIServerFlags []string
	// AuthorizationMode is --authorization-mode (default Node,RBAC).
	AuthorizationMode string
	// EncryptSecrets encrypts Secrets at rest with aescbc (a key made
	// for this cluster, in Dir/encryption-config.yaml).
	EncryptSecrets bool
	// TracingEndpoint, when set, has the apiserver export its own spans
	// over OTLP/gRPC to this host:port (kproxy's --otlp-receiver-listen,
	// chosen before the apiserver starts: FreePorts), every request
	// sampled (Dir/tracing-config.yaml, its --tracing-config-file), and
	// every 100 ms rather than every 5 s (OTEL_BSP_SCHEDULE_DELAY), so
	// that records wait little for them.
	TracingEndpoint string
	// Log receives progress lines; nil means silent.
	Log io.Writer
}

// Cluster is a running etcd + kube-apiserver.
type Cluster struct {
	Dir        string
	URL        string // https://127.0.0.1:port
	EtcdURL    string
	CA         *pki.CA // cluster CA: serving and client certificates
	FrontProxy *pki.CA // front-proxy (requestheader) CA
	// Files the apiserver was started with, for kproxy's mirrored flags.
	CAFile, FrontProxyCAFile, TokenFile, SAKeyFile string
	// APIServerFlags is the apiserver's full command line (flags only).
	APIServerFlags []string

	tmp   bool
	procs []*process
	log   io.Writer
	// How etcd and the apiserver were started, to start them again.
	etcdBin, apiBin  string
	etcdArgs, apiEnv []string
}

type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	logf string
}

// FindBinDir locates the binaries built by `make tools`: $KPROXY_BIN_DIR,
// else .cache/bin at the root of the kproxy checkout containing the working
// directory.
func FindBinDir() (string, error) {
	if d := os.Getenv("KPROXY_BIN_DIR"); d != "" {
		return d, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/kproxy/kproxy\n") {
			return filepath.Join(dir, ".cache", "bin"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the kproxy checkout (set KPROXY_BIN_DIR to the directory holding etcd and kube-apiserver)")
		}
		dir = parent
	}
}

// Binary returns the path of a tool built by `make tools`, or an error that
// says how to build it.
func Binary(binDir, name string) (string, error) {
	p := filepath.Join(binDir, name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s not found in %s: run `make tools` first (it builds etcd, kube-apiserver, kubectl and jaeger from the Go module proxy)", name, binDir)
	}
	return p, nil
}

// Start brings up etcd and kube-apiserver and waits until /readyz is ok.
func Start(ctx context.Context, o Options) (_ *Cluster, err error) {
	if o.BinDir == "" {
		if o.BinDir, err = FindBinDir(); err != nil {
			return nil, err
		}
	}
	etcdBin, err := Binary(o.BinDir, "etcd")
	if err != nil {
		return nil, err
	}
	apiBin, err := Binary(o.BinDir, "kube-apiserver")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: o.Dir, log: o.Log}
	if c.log == nil {
		c.log = io.Discard
	}
	if c.Dir == "" {
		if c.Dir, err = os.MkdirTemp("", "kproxy-cluster-"); err != nil {
			return nil, err
		}
		c.tmp = true
	}
	defer func() {
		// On failure keep the logs of a temp dir for the error message.
		c.tmp = c.tmp && err == nil
		if err != nil {
			c.Stop()
		}
	}()
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := c.writePKI(); err != nil {
		return nil, fmt.Errorf("cluster PKI: %w", err)
	}

	ports, err := FreePorts(3)
	if err != nil {
		return nil, err
	}
	etcdClient, etcdPeer, apiPort := ports[0], ports[1], ports[2]
	c.EtcdURL = fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
	fmt.Fprintf(c.log, "starting etcd on %s\n", c.EtcdURL)
	c.etcdBin, c.etcdArgs = etcdBin, []string{
		"--name=default",
		"--data-dir=" + filepath.Join(c.Dir, "etcd-data"),
		"--listen-client-urls=" + c.EtcdURL, "--advertise-client-urls=" + c.EtcdURL,
		"--listen-peer-urls=" + peerURL, "--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=default=" + peerURL,
		"--unsafe-no-fsync", // test data only: fsync dominates etcd latency on shared disks
		"--log-level=warn",
	}
	if err := c.run("etcd", etcdBin, c.etcdArgs...); err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, c.EtcdURL+"/health", nil, 60*time.Second, c.procs[0]); err != nil {
		return nil, fmt.Errorf("etcd did not become healthy: %w (log: %s)", err, c.procs[0].logf)
	}

	c.URL = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	f := func(name string) string { return filepath.Join(c.Dir, name) }
	c.APIServerFlags = append([]string{
		"--etcd-servers=" + c.EtcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// The kubernetes Service endpoints cannot point at loopback; nothing
		// here routes to them anyway.
		"--endpoint-reconciler-type=none",
		"--secure-port=" + strconv.Itoa(apiPort),
		"--tls-cert-file=" + f("apiserver.crt"),
		"--tls-private-key-file=" + f("apiserver.key"),
		"--client-ca-file=" + c.CAFile,
		"--token-auth-file=" + c.TokenFile,
		"--service-account-key-file=" + c.SAKeyFile,
		"--service-account-signing-key-file=" + f("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--api-audiences=https://kubernetes.default.svc.cluster.local",
		"--authorization-mode=" + orDefault(o.AuthorizationMode, "Node,RBAC"),
		// On top of the default plugins, as kubeadm enables it: the
		// Node authorizer leaves a node's writes to it.
		"--enable-admission-plugins=NodeRestriction",
		"--enable-bootstrap-token-auth=true",
		"--service-cluster-ip-range=10.96.0.0/16",
		"--requestheader-client-ca-file=" + c.FrontProxyCAFile,
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + f("front-proxy-client.crt"),
		"--proxy-client-key-file=" + f("front-proxy-client.key"),
		"--allow-privileged=true",
		"--profiling=false",
		"--v=1",
	}, o.ExtraAPIServerFlags...)
	if o.EncryptSecrets {
		path, err := writeEncryptionConfig(c.Dir)
		if err != nil {
			return nil, err
		}
		c.APIServerFlags = append(c.APIServerFlags, "--encryption-provider-config="+path)
	}
	var apiEnv []string
	if o.TracingEndpoint != "" {
		path, err := writeTracingConfig(c.Dir, o.TracingEndpoint)
		if err != nil {
			return nil, err
		}
		c.APIServerFlags = append(c.APIServerFlags, "--tracing-config-file="+path)
		apiEnv = append(apiEnv, "OTEL_BSP_SCHEDULE_DELAY=100")
	}
	fmt.Fprintf(c.log, "starting kube-apiserver on %s\n", c.URL)
	c.apiBin, c.apiEnv = apiBin, apiEnv
	if err := c.runEnv("kube-apiserver", apiBin, apiEnv, c.APIServerFlags...); err != nil {
		return nil, err
	}
	if err := c.waitAPIServer(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(c.log, "kube-apiserver ready\n")
	return c, nil
}

func (c *Cluster) waitAPIServer(ctx context.Context) error {
	admin := c.UserConfig("admin")
	tlsCfg, err := rest.TLSConfigFor(admin)
	if err != nil {
		return err
	}
	hdr := http.Header{"Authorization": {"Bearer " + Users[0].Token}}
	if err := waitHTTP(ctx, c.URL+"/readyz", &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}}, 3*time.Minute, c.procs[1], hdr); err != nil {
		return fmt.Errorf("kube-apiserver did not become ready: %w (log: %s)", err, c.procs[1].logf)
	}
	return nil
}

// KillAPIServer kills the kube-apiserver as a crash would (SIGKILL) and
// waits until it is gone; StartAPIServer starts it again (fault tests).
func (c *Cluster) KillAPIServer() { c.procs[1].kill() }

// StartAPIServer starts the kube-apiserver again, with the same flags,
// and waits until it is ready.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	if err := c.runEnv("kube-apiserver", c.apiBin, c.apiEnv, c.APIServerFlags...); err != nil {
		return err
	}
	c.procs[1], c.procs = c.procs[len(c.procs)-1], c.procs[:len(c.procs)-1]
	return c.waitAPIServer(ctx)
}

// KillEtcd kills etcd (SIGKILL) and waits until it is gone; StartEtcd
// starts it again on its data (fault tests).
func (c *Cluster) KillEtcd() { c.procs[0].kill() }

// StartEtcd starts etcd again, on the same data and ports, and waits
// until it is healthy.
func (c *Cluster) StartEtcd(ctx context.Context) error {
	if err := c.run("etcd", c.etcdBin, c.etcdArgs...); err != nil {
		return err
	}
	c.procs[0], c.procs = c.procs[len(c.procs)-1], c.procs[:len(c.procs)-1]
	return waitHTTP(ctx, c.EtcdURL+"/health", nil, 60*time.Second, c.procs[0])
}

// UserConfig is a client config for a static-token user.
func (c *Cluster) UserConfig(name string) *rest.Config {
	for _, u := range Users {
		if u.Name == name {
			return &rest.Config{Host: c.URL, BearerToken: u.Token,
				TLSClientConfig: rest.TLSClientConfig{CAData: pki.CertPEM(c.CA.Cert)}}
		}
	}
	panic("localcluster: no user " + name)
}

// ClientCertConfig is a client config authenticating with a fresh client
// certificate signed by the cluster CA.
func (c *Cluster) ClientCertConfig(user string, groups ...string) (*rest.Config, error) {
	leaf, err := c.CA.Issue(pki.Leaf{CommonName: user, Organization: groups, Client: true})
	if err != nil {
		return nil, err
	}
	key, err := pki.KeyPEM(leaf.Key)
	if err != nil {
		return nil, err
	}
	return &rest.Config{Host: c.URL, TLSClientConfig: rest.TLSClientConfig{
		CAData: pki.CertPEM(c.CA.Cert), CertData: pki.CertPEM(leaf.Cert), KeyData: key}}, nil
}

// Stop ends every process and removes a temporary directory.
func (c *Cluster) Stop() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].stop()
	}
	c.procs = nil
	if c.tmp {
		os.RemoveAll(c.Dir)
	}
}

func (c *Cluster) run(name, bin string, args ...string) error {
	return c.runEnv(name, bin, nil, args...)
}

func (c *Cluster) runEnv(name, bin string, env []string, args ...string) error {
	logf := filepath.Join(c.Dir, name+".log")
	out, err := os.Create(logf)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	// Own process group, and die with the parent: a killed test run must
	// not leave an apiserver behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{}), logf: logf}
	go func() {
		p.err = cmd.Wait()
		out.Close()
		close(p.done)
	}()
	c.procs = append(c.procs, p)
	return nil
}

func (p *process) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

func (p *process) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// waitHTTP polls url until it answers 200, the process dies, or the
// timeout passes.
func waitHTTP(ctx context.Context, url string, client *http.Client, timeout time.Duration, p *process, hdr ...http.Header) error {
	// A copy with a short timeout per probe: the caller's client (or the
	// default one) is left as it is.
	c := &http.Client{Timeout: 5 * time.Second}
	if client != nil {
		c.Transport = client.Transport
	}
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		select {
		case <-p.done:
			return false, fmt.Errorf("%s exited: %v", p.name, p.err)
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		for _, h := range hdr {
			for k, v := range h {
				req.Header[k] = v
			}
		}
		resp, err := c.Do(req)
		if err != nil {
			last = err.Error()
			return false, nil //nolint:nilerr // not up yet: poll again
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return true, nil
		}
		last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
		return false, nil
	})
	if err != nil && wait.Interrupted(err) {
		return fmt.Errorf("timed out after %v; last answer: %s", timeout, last)
	}
	return err
}

// FreePorts finds n free loopback TCP ports.
func FreePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// writePKI makes the cluster CA, serving certificate, front-proxy CA and
// client, service-account keys and the token file.
// writeEncryptionConfig writes an EncryptionConfiguration that encrypts
// Secrets with aescbc under a fresh key named "demo-key".
func writeEncryptionConfig(dir string) (string, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return "", err
	}
	cfg := fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources: [secrets]
  providers:
  - aescbc:
      keys:
      - name: demo-key
        secret: %s
  - identity: {}
`, base64.StdEncoding.EncodeToString(key))
	path := filepath.Join(dir, "encryption-config.yaml")
	return path, os.WriteFile(path, []byte(cfg), 0o600)
}

// writeTracingConfig writes a TracingConfiguration that samples every
// request and exports to endpoint (OTLP/gRPC host:port).
func writeTracingConfig(dir, endpoint string) (string, error) {
	if _, _, err := net.SplitHostPort(endpoint); err != nil {
		return "", fmt.Errorf("localcluster: TracingEndpoint %q: want host:port (%v)", endpoint, err)
	}
	cfg := fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: TracingConfiguration
endpoint: %s
samplingRatePerMillion: 1000000
`, endpoint)
	path := filepath.Join(dir, "tracing-config.yaml")
	return path, os.WriteFile(path, []byte(cfg), 0o644)
}

func (c *Cluster) writePKI() error {
	var err error
	if c.CA, err = pki.NewCA("kproxy-test-cluster-ca"); err != nil {
		return err
	}
	if c.FrontProxy, err = pki.NewCA("kproxy-test-front-proxy-ca"); err != nil {
		return err
	}
	f := func(name string) string { return filepath.Join(c.Dir, name) }
	c.CAFile, c.FrontProxyCAFile = f("ca.crt"), f("front-proxy-ca.crt")
	if _, _, err := pki.WritePair(c.Dir, "ca", c.CA.Cert, c.CA.Key); err != nil {
		return err
	}
	if _, _, err := pki.WritePair(c.Dir, "front-proxy-ca", c.FrontProxy.Cert, c.FrontProxy.Key); err != nil {
		return err
	}
	serving, err := c.CA.Issue(pki.Leaf{CommonName: "kube-apiserver", Server: true,
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPs:      []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")}})
	if err != nil {
		return err
	}
	if _, _, err := pki.WritePair(c.Dir, "apiserver", serving.Cert, serving.Key); err != nil {
		return err
	}
	fp, err := c.FrontProxy.Issue(pki.Leaf{CommonName: "front-proxy-client", Client: true})
	if err != nil {
		return err
	}
	if _, _, err := pki.WritePair(c.Dir, "front-proxy-client", fp.Cert, fp.Key); err != nil {
		return err
	}
	sa, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	saKey, err := pki.KeyPEM(sa)
	if err != nil {
		return err
	}
	saPub, err := pki.PublicKeyPEM(sa.Public())
	if err != nil {
		return err
	}
	c.SAKeyFile = f("sa.pub")
	if err := os.WriteFile(f("sa.key"), saKey, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(c.SAKeyFile, saPub, 0o644); err != nil {
		return err
	}
	var tokens strings.Builder
	for _, u := range Users {
		fmt.Fprintf(&tokens, "%s,%s,%s,%q\n", u.Token, u.Name, u.UID, strings.Join(u.Groups, ","))
	}
	c.TokenFile = f("tokens.csv")
	return os.WriteFile(c.TokenFile, []byte(tokens.String()), 0o600)
}

// CAPool is the cluster CA as a pool.
func (c *Cluster) CAPool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c.CA.Cert)
	return p
}

// FrontProxyPool is the front-proxy CA as a pool.
func (c *Cluster) FrontProxyPool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c.FrontProxy.Cert)
	return p
}

// FrontProxyClient is the certificate the apiserver accepts front-proxy
// headers from.
func (c *Cluster) FrontProxyClient() (tls.Certificate, error) {
	return tls.LoadX509KeyPair(filepath.Join(c.Dir, "front-proxy-client.crt"), filepath.Join(c.Dir, "front-proxy-client.key"))
}

// APIServerPID is the kube-apiserver's process id (for CPU accounting in
// benchmarks); 0 if it is not running.
func (c *Cluster) APIServerPID() int {
	for _, p := range c.procs {
		if p.name == "kube-apiserver" {
			return p.cmd.Process.Pid
		}
	}
	return 0
}

// Process runs a helper program (kproxy, kubectl proxy) under the
// cluster's supervision: its output goes to dir/name.log and Stop ends it.
func (c *Cluster) Process(name, bin string, env []string, args ...string) (pid int, err error) {
	if err := c.runEnv(name, bin, env, args...); err != nil {
		return 0, err
	}
	return c.procs[len(c.procs)-1].cmd.Process.Pid, nil
}

// WriteManifest writes the apiserver's command line as a kubeadm-style
// static-pod manifest, the form kproxy's --apiserver-manifest reads.
func (c *Cluster) WriteManifest(path string) error {
	pod := corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "kube-apiserver", Namespace: "kube-system"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "kube-apiserver",
			Command: append([]string{"kube-apiserver"}, c.APIServerFlags...)}}},
	}
	b, err := yaml.Marshal(pod)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// WriteKubeconfig writes a kubeconfig for server, trusting caPEM, with a
// bearer token: the form the tests, the demo and the benchmarks hand to
// kproxy and kubectl.
func WriteKubeconfig(path, server string, caPEM []byte, token string) error {
	return writeKubeconfig(path, server, caPEM, &clientcmdapi.AuthInfo{Token: token})
}

// writeKubeconfig writes a one-context kubeconfig for server with auth.
func writeKubeconfig(path, server string, caPEM []byte, auth *clientcmdapi.AuthInfo) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kproxy"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos["kproxy"] = auth
	cfg.Contexts["kproxy"] = &clientcmdapi.Context{Cluster: "kproxy", AuthInfo: "kproxy", Namespace: "default"}
	cfg.CurrentContext = "kproxy"
	return clientcmd.WriteToFile(*cfg, path)
}

// UpstreamKubeconfig writes the kubeconfig kproxy itself uses in front of
// this cluster (the "kproxy" token user) and returns its path.
func (c *Cluster) UpstreamKubeconfig(dir string) (string, error) {
	path := filepath.Join(dir, "kproxy-upstream.kubeconfig")
	return path, WriteKubeconfig(path, c.URL, pki.CertPEM(c.CA.Cert), TokenOf("kproxy"))
}

// TokenOf is the static token of a user in Users ("" if none).
func TokenOf(name string) string {
	for _, u := range Users {
		if u.Name == name {
			return u.Token
		}
	}
	return ""
}

// WriteCertKubeconfig writes a kubeconfig for server, trusting caPEM,
// with a client certificate and its key.
func WriteCertKubeconfig(path, server string, caPEM, certPEM, keyPEM []byte) error {
	return writeKubeconfig(path, server, caPEM, &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM})
}

// WriteBasicAuthKubeconfig writes a kubeconfig for server with a username
// and password (which kube-apiserver does not read as credentials).
func WriteBasicAuthKubeconfig(path, server string, caPEM []byte, user, password string) error {
	return writeKubeconfig(path, server, caPEM, &clientcmdapi.AuthInfo{Username: user, Password: password})
}
