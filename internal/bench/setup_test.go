package bench

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/pki"
)

// env is the shared benchmark environment.
type env struct {
	cluster *localcluster.Cluster
	jaeger  *localcluster.Jaeger
	dir     string
	kproxy  string // built binary
	admin   kubernetes.Interface
	targets []*target
	// capture is the "kproxy" target's capture file (records_test.go).
	capture string
}

// target is one way to reach the apiserver.
type target struct {
	name   string
	base   string
	token  bool // send the admin token (kubectl proxy adds its own)
	client *http.Client
	pid    int // the proxy's process, 0 for direct
	// metrics is a kproxy's --metrics-listen address ("" for the others).
	metrics string
}

var e *env

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		// Benchmarks only: `go test ./...` does not start a cluster here.
		os.Exit(m.Run())
	}
	var err error
	e, err = setup()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench setup:", err)
		if e != nil {
			e.stop()
		}
		os.Exit(1)
	}
	code := m.Run()
	e.stop()
	os.Exit(code)
}

func (e *env) stop() {
	if e.jaeger != nil {
		e.jaeger.Stop()
	}
	if e.cluster != nil {
		e.cluster.Stop()
	}
	os.RemoveAll(e.dir)
}

func setup() (*env, error) {
	ctx := context.Background()
	e := &env{}
	var err error
	if e.dir, err = os.MkdirTemp("", "kproxy-bench-"); err != nil {
		return nil, err
	}
	if e.cluster, err = localcluster.Start(ctx, localcluster.Options{Log: os.Stderr}); err != nil {
		return e, err
	}
	if e.jaeger, err = localcluster.StartJaeger(ctx, "", "", os.Stderr); err != nil {
		return e, err
	}
	adminCfg := e.cluster.UserConfig("admin")
	adminCfg.QPS, adminCfg.Burst = 2000, 2000 // setup writes; client-side throttling would dominate
	e.admin = kubernetes.NewForConfigOrDie(adminCfg)
	if err := localcluster.GrantKproxy(ctx, e.admin, "kproxy"); err != nil {
		return e, err
	}
	if err := e.buildKproxy(); err != nil {
		return e, err
	}
	direct := &target{name: "direct", base: e.cluster.URL, token: true,
		client: httpClient(&tls.Config{RootCAs: e.cluster.CAPool()}, false)}
	e.capture = filepath.Join(e.dir, "kproxy-capture.jsonl")
	kp, err := e.startKproxy("kproxy", true, "--capture="+e.capture)
	if err != nil {
		return e, err
	}
	kc, err := e.startKubectlProxy()
	if err != nil {
		return e, err
	}
	e.targets = []*target{direct, kp, kc}
	// $KPROXY_BENCH_VARIANT, a list of kproxy flags, adds a kproxy run
	// with them as a target of its own ("kproxy-variant"), interleaved
	// with the others: a flag's effect measured in one run.
	if flags := strings.Fields(os.Getenv("KPROXY_BENCH_VARIANT")); len(flags) > 0 {
		v, err := e.startKproxy(variantName, true, append([]string{"--capture=" + filepath.Join(e.dir, variantName+"-capture.jsonl")}, flags...)...)
		if err != nil {
			return e, err
		}
		e.targets = append(e.targets, v)
	}
	ng, err := e.startNginx()
	if err != nil {
		return e, err
	}
	if ng != nil {
		e.targets = append(e.targets, ng)
	}
	return e, nil
}

// variantName is the target $KPROXY_BENCH_VARIANT adds.
const variantName = "kproxy-variant"

func httpClient(tc *tls.Config, h2 bool) *http.Client {
	return &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{
		TLSClientConfig: tc, ForceAttemptHTTP2: h2, DisableCompression: true,
		MaxIdleConnsPerHost: 64, Proxy: nil,
	}}
}

func (e *env) buildKproxy() error {
	binDir, err := localcluster.FindBinDir()
	if err != nil {
		return err
	}
	root := filepath.Dir(filepath.Dir(binDir)) // .cache/bin -> repo
	e.kproxy = filepath.Join(e.dir, "kproxy")
	cmd := exec.Command("go", "build", "-o", e.kproxy, "./cmd/kproxy")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build kproxy: %v\n%s", err, out)
	}
	return nil
}

// startKproxy runs the kproxy binary as its own process, as a user would,
// tracing to Jaeger, serving its metrics; extra flags come last.
func (e *env) startKproxy(name string, trace bool, extra ...string) (*target, error) {
	kc := filepath.Join(e.dir, name+"-upstream.kubeconfig")
	if err := localcluster.WriteKubeconfig(kc, e.cluster.URL, pki.CertPEM(e.cluster.CA.Cert), "kproxy-token"); err != nil {
		return nil, err
	}
	ports, err := localcluster.FreePorts(2)
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	metricsAddr := "127.0.0.1:" + strconv.Itoa(ports[1])
	pkiDir := filepath.Join(e.dir, name+"-pki")
	var envv []string
	if trace {
		envv = []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + e.jaeger.OTLPHTTP, "OTEL_SERVICE_NAME=kproxy-bench"}
	}
	// kproxy reads the apiserver's flags from a static-pod manifest, as on
	// a kubeadm control plane.
	manifest := filepath.Join(e.dir, "kube-apiserver.yaml")
	if err := e.cluster.WriteManifest(manifest); err != nil {
		return nil, err
	}
	// Every read is replayed (no shedding), so that the cost measured is
	// the replay's whole cost.
	args := []string{"serve", "--listen=" + addr, "--upstream-kubeconfig=" + kc,
		"--apiserver-manifest=" + manifest, "--pki-dir=" + pkiDir, "--log-level=warn", "--replay-etcd-qps=1000000",
		// The flow API stays on, as by default, on a port of its own: the
		// bench runs several kproxies at once.
		"--api-listen=127.0.0.1:0", "--metrics-listen=" + metricsAddr}
	args = append(args, extra...)
	want := os.Getenv("KPROXY_BENCH_DEBUG_TARGET") // which kproxy process to expose
	if want == "" {
		want = "kproxy"
	}
	if d := os.Getenv("KPROXY_BENCH_DEBUG_ADDR"); d != "" && name == want {
		args = append(args, "--debug-addr="+d) // profile kproxy under load
	}
	pid, err := e.cluster.Process(name, e.kproxy, envv, args...)
	if err != nil {
		return nil, err
	}
	var caPEM []byte
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if caPEM, err = os.ReadFile(filepath.Join(pkiDir, "ca.crt")); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	t := &target{name: name, base: "https://" + addr, token: true, client: httpClient(&tls.Config{RootCAs: pool}, false), pid: pid, metrics: metricsAddr}
	return t, waitReady(t)
}

func (e *env) startKubectlProxy() (*target, error) {
	binDir, err := localcluster.FindBinDir()
	if err != nil {
		return nil, err
	}
	kubectl, err := localcluster.Binary(binDir, "kubectl")
	if err != nil {
		return nil, err
	}
	kc := filepath.Join(e.dir, "admin.kubeconfig")
	if err := localcluster.WriteKubeconfig(kc, e.cluster.URL, pki.CertPEM(e.cluster.CA.Cert), "admin-token"); err != nil {
		return nil, err
	}
	ports, err := localcluster.FreePorts(1)
	if err != nil {
		return nil, err
	}
	pid, err := e.cluster.Process("kubectl-proxy", kubectl, nil, "proxy", "--kubeconfig="+kc, "--port="+strconv.Itoa(ports[0]), "--address=127.0.0.1")
	if err != nil {
		return nil, err
	}
	t := &target{name: "kubectl-proxy", base: fmt.Sprintf("http://127.0.0.1:%d", ports[0]), client: httpClient(nil, false), pid: pid}
	return t, waitReady(t)
}

func waitReady(t *target) error {
	deadline := time.Now().Add(time.Minute)
	var last error
	for time.Now().Before(deadline) {
		req, _ := http.NewRequest("GET", t.base+"/readyz", nil)
		if t.token {
			req.Header.Set("Authorization", "Bearer admin-token")
		}
		resp, err := t.client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready: %v", t.name, last)
}

// procStat returns a process's CPU time (user+system) and resident set.
func procStat(pid int) (cpu time.Duration, rss int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0
	}
	// Fields after the command name (which may hold spaces).
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	pages, _ := strconv.ParseInt(f[21], 10, 64)
	const hz = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / hz, pages * int64(os.Getpagesize())
}

// peakRSS reads VmHWM, the peak resident set since the last reset.
func peakRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			kb, _ := strconv.ParseInt(strings.Fields(l)[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// resetPeakRSS makes VmHWM start again from the current resident set.
func resetPeakRSS(pid int) {
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0o200)
}
