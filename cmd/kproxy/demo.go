package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/pki"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
	"github.com/kproxy/kproxy/internal/stages"
)

func newDemoCommand() *cobra.Command {
	var dir, listen string
	var keep bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Start a local etcd + kube-apiserver with kproxy in front and send sample requests",
		Long: `Start a real etcd and kube-apiserver (built by ` + "`make tools`" + `) on loopback
ports, put kproxy in front in reverse mode, send a short script of sample
requests (allowed and rejected), print what kproxy recorded, and keep
everything running with a KUBECONFIG to use from another terminal until
Ctrl-C, which stops every process the demo started.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd.Context(), cmd.OutOrStdout(), dir, listen, keep)
		},
	}
	cmd.Flags().StringVar(&dir, "dir", ".cache/demo", "directory for the cluster's PKI, data, logs, kubeconfig and capture")
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "kproxy's address (default: a free port)")
	cmd.Flags().BoolVar(&keep, "exit", false, "exit after the sample requests instead of waiting for Ctrl-C")
	return cmd
}

func runDemo(ctx context.Context, out io.Writer, dir, listen string, exitAfter bool) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	clusterDir := filepath.Join(dir, "cluster")
	if err := os.RemoveAll(clusterDir); err != nil {
		return err
	}
	fmt.Fprintf(out, "kproxy demo: a real etcd + kube-apiserver %s in %s\n", kubeVersion, clusterDir)
	c, err := localcluster.Start(ctx, localcluster.Options{Dir: clusterDir, Log: prefixWriter(out, "  "), EncryptSecrets: true})
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(out, "stopping kube-apiserver and etcd")
		c.Stop()
	}()
	admin, err := kubernetes.NewForConfig(c.UserConfig("admin"))
	if err != nil {
		return err
	}
	if err := localcluster.GrantKproxy(ctx, admin, "kproxy"); err != nil {
		return fmt.Errorf("grant kproxy's ClusterRole: %w", err)
	}
	if err := localcluster.EnsureDefaultServiceAccount(ctx, admin, "default"); err != nil {
		return err
	}
	if err := localcluster.GrantDevs(ctx, admin, "default"); err != nil {
		return fmt.Errorf("grant the devs Role: %w", err)
	}
	// A namespace where PodSecurity enforces "restricted": the demo's
	// admission rejection.
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "restricted",
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create the demo's restricted namespace: %w", err)
	}
	if err := localcluster.EnsureDefaultServiceAccount(ctx, admin, "restricted"); err != nil {
		return err
	}
	// A Secret, stored encrypted at rest (aescbc): kproxy etcd reads it.
	if _, err := admin.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "demo-db"},
		StringData: map[string]string{"password": "not-a-real-password"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create the demo's secret: %w", err)
	}

	// kproxy's own identity: the "kproxy" token user.
	upKubeconfig, err := c.UpstreamKubeconfig(dir)
	if err != nil {
		return err
	}
	manifest := filepath.Join(dir, "kube-apiserver.yaml")
	if err := c.WriteManifest(manifest); err != nil {
		return err
	}
	capture := filepath.Join(dir, "capture.jsonl")
	_ = os.Remove(capture)
	stream := record.NewStream()
	recs, _, unsubscribe := stream.Subscribe(1024)
	defer unsubscribe()
	logFile, err := os.Create(filepath.Join(dir, "kproxy.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	// kproxy gets the apiserver's own flag list, as an operator would hand
	// it over; the flags it does not mirror are ignored.
	apiserver, _, err := stages.APIServerOptionsFromArgs(c.APIServerFlags)
	if err != nil {
		return err
	}
	demoLog := slog.New(slog.NewTextHandler(logFile, nil))
	serve.RouteKlog(demoLog)
	opts := &serve.Options{
		UpstreamKubeconfig: upKubeconfig, Listen: listen, Mode: "reverse",
		PKIDir: filepath.Join(dir, "kproxy-pki"), Capture: capture,
		APIServer: apiserver,
		Stream:    stream,
		Log:       demoLog,
	}
	s, err := serve.New(ctx, opts)
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- s.Run(runCtx) }()
	kproxyURL := "https://" + s.Addr
	kproxyCA := pki.CertPEM(s.CA.Cert)

	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := localcluster.WriteKubeconfig(kubeconfig, kproxyURL, kproxyCA, localcluster.TokenOf("admin")); err != nil {
		return err
	}
	fmt.Fprintf(out, "kproxy %s listening on %s, in front of %s\n\n", version, kproxyURL, c.URL)

	cert, err := c.CA.Issue(pki.Leaf{CommonName: "dave", Organization: []string{"devs"}, Client: true})
	if err != nil {
		return err
	}
	samples := demoSamples(cert.TLSCertificate())
	client := func(cert *tls.Certificate) *http.Client {
		pool := s.CA.Cert
		tc := &tls.Config{RootCAs: poolOf(pool)}
		if cert != nil {
			tc.Certificates = []tls.Certificate{*cert}
		}
		return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	}
	byID := map[string]string{}
	for _, smp := range samples {
		req, _ := http.NewRequestWithContext(ctx, smp.method, kproxyURL+smp.path, bytes.NewReader([]byte(smp.body)))
		if smp.body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if smp.token != "" {
			req.Header.Set("Authorization", "Bearer "+smp.token)
		}
		id := fmt.Sprintf("demo-%02d", len(byID))
		req.Header.Set("Audit-Id", id)
		byID[id] = smp.what
		resp, err := client(smp.cert).Do(req)
		if err != nil {
			return fmt.Errorf("sample %q: %w", smp.what, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// Records arrive when each replay finishes; collect the demo's.
	got := map[string]*record.Record{}
	deadline := time.After(15 * time.Second)
	for len(got) < len(samples) {
		select {
		case r := <-recs:
			if _, ok := byID[r.Actual.AuditID]; ok {
				got[r.Actual.AuditID] = r
			}
		case <-deadline:
			return fmt.Errorf("only %d of %d sample records arrived", len(got), len(samples))
		}
	}
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SAMPLE\tMETHOD\tPATH\tCALLER\tPREDICTED\tACTUAL\tLATENCY")
	for i := range samples {
		id := fmt.Sprintf("demo-%02d", i)
		r := got[id]
		caller := r.Identity
		if r.Request.User != "" {
			caller += ":" + r.Request.User
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", samples[i].what, r.Request.Method, r.Request.Path, caller,
			predictedString(r.Predicted), actualString(r.Actual), time.Duration(r.Latency.TotalNs).Round(10*time.Microsecond))
	}
	tw.Flush()
	// The explanation of each refusal past authorization, from the stage
	// that decides it, and what storage saw of the Secret.
	for i := range samples {
		r := got[fmt.Sprintf("demo-%02d", i)]
		if samples[i].showStorage {
			for _, st := range r.Stages {
				if st.Name == "storage" {
					fmt.Fprintf(out, "\n%q: storage says:\n  %s\n", samples[i].what, st.Explanation)
				}
			}
		}
		switch r.Predicted.Stage {
		case "", record.StageUnknown, "authentication", "impersonation", "flowcontrol", "authorization":
			continue
		}
		for _, st := range r.Stages {
			if st.Name == r.Predicted.Stage {
				fmt.Fprintf(out, "\nwhy %q: %s says:\n  %s\n", samples[i].what, st.Name, st.Explanation)
				for _, ch := range st.Children {
					if ch.Outcome == record.Reject {
						fmt.Fprintf(out, "  plugin %s (%v): %s\n", ch.Name, time.Duration(ch.DurationNs).Round(time.Microsecond), ch.Explanation)
					}
				}
			}
		}
	}
	fmt.Fprintf(out, `
kproxy replays every request with the apiserver's own code: authentication,
impersonation, flowcontrol and authorization; for writes decode, admission
(each plugin), validation and the storage preconditions, in dry run; for
reads the apiserver's etcd3 store on its etcd (resourceVersions, continue
tokens), read-only. Every request above went through kproxy, and each
stage's explanation is in the capture:
  capture:    %s
  kubeconfig: %s   (admin through kproxy)
  kproxy log: %s

Try, from another terminal:
  export KUBECONFIG=%s
  %s get pods -A
  tail -f %s
  ./bin/kproxy explain GET /api/v1/namespaces/kube-system/secrets --token alice-token \
      --upstream-kubeconfig %s --apiserver-manifest %s
  ./bin/kproxy etcd get secrets -n default demo-db --apiserver-manifest %s
      (the Secret as etcd holds it: encrypted with aescbc, decrypted with the
      apiserver's --encryption-provider-config)
`, capture, kubeconfig, logFile.Name(), kubeconfig, kubectlPath(), capture, upKubeconfig, manifest, manifest)
	if exitAfter {
		return nil
	}
	fmt.Fprintln(out, "\nRunning until Ctrl-C.")
	select {
	case <-ctx.Done():
	case err := <-served:
		return err
	}
	cancel()
	return <-served
}

type sample struct {
	what, method, path, body, token string
	cert                            *tls.Certificate
	showStorage                     bool // print what the storage stage saw
}

func demoSamples(daveCert tls.Certificate) []sample {
	cm := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"kproxy-demo"},"data":{"hello":"world"}}`
	staleCM := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"kproxy-demo","resourceVersion":"1"},"data":{"hello":"again"}}`
	badPod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"bad"},"spec":{"containers":[]}}`
	rootPod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"root"},"spec":{"containers":[{"name":"c","image":"busybox"}]}}`
	return []sample{
		{what: "version", method: "GET", path: "/version", token: localcluster.TokenOf("admin")},
		{what: "admin lists namespaces", method: "GET", path: "/api/v1/namespaces", token: localcluster.TokenOf("admin")},
		{what: "alice lists pods", method: "GET", path: "/api/v1/namespaces/default/pods", token: localcluster.TokenOf("alice")},
		{what: "alice reads secrets", method: "GET", path: "/api/v1/namespaces/kube-system/secrets", token: localcluster.TokenOf("alice")},
		{what: "bad token", method: "GET", path: "/api/v1/namespaces", token: "not-a-token"},
		{what: "anonymous", method: "GET", path: "/api/v1/namespaces"},
		{what: "create configmap", method: "POST", path: "/api/v1/namespaces/default/configmaps", body: cm, token: localcluster.TokenOf("admin")},
		{what: "create it again", method: "POST", path: "/api/v1/namespaces/default/configmaps", body: cm, token: localcluster.TokenOf("admin")},
		{what: "get missing", method: "GET", path: "/api/v1/namespaces/default/configmaps/nope", token: localcluster.TokenOf("admin")},
		{what: "read the Secret", method: "GET", path: "/api/v1/namespaces/default/secrets/demo-db", token: localcluster.TokenOf("admin"), showStorage: true},
		{what: "stale update", method: "PUT", path: "/api/v1/namespaces/default/configmaps/kproxy-demo", body: staleCM, token: localcluster.TokenOf("admin")},
		{what: "bad continue token", method: "GET", path: "/api/v1/namespaces/default/configmaps?limit=1&continue=bm90LWEtdG9rZW4", token: localcluster.TokenOf("admin")},
		{what: "invalid pod", method: "POST", path: "/api/v1/namespaces/default/pods", body: badPod, token: localcluster.TokenOf("admin")},
		{what: "pod vs PodSecurity", method: "POST", path: "/api/v1/namespaces/restricted/pods", body: rootPod, token: localcluster.TokenOf("admin")},
		{what: "configmap, no namespace", method: "POST", path: "/api/v1/namespaces/nowhere/configmaps", body: cm, token: localcluster.TokenOf("admin")},
		{what: "dave's certificate", method: "GET", path: "/api/v1/namespaces/default/configmaps", cert: &daveCert},
		{what: "dave deletes", method: "DELETE", path: "/api/v1/namespaces/default/configmaps/kproxy-demo", cert: &daveCert},
	}
}

func predictedString(p record.Prediction) string {
	if p.Stage == record.StageUnknown {
		return "unknown"
	}
	if p.Stage == "" {
		return fmt.Sprint(p.Status)
	}
	return fmt.Sprintf("%d %s at %s", p.Status, p.Reason, p.Stage)
}

func actualString(a record.Actual) string {
	if a.Reason != "" {
		return fmt.Sprintf("%d %s", a.Status, a.Reason)
	}
	return fmt.Sprint(a.Status)
}

func kubectlPath() string {
	if d, err := localcluster.FindBinDir(); err == nil {
		if p, err := localcluster.Binary(d, "kubectl"); err == nil {
			return p
		}
	}
	return "kubectl"
}

type prefixed struct {
	w      io.Writer
	prefix string
}

func (p prefixed) Write(b []byte) (int, error) {
	lines := strings.SplitAfter(string(b), "\n")
	for _, l := range lines {
		if l == "" {
			continue
		}
		if _, err := io.WriteString(p.w, p.prefix+l); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}

func prefixWriter(w io.Writer, prefix string) io.Writer { return prefixed{w, prefix} }

func poolOf(c *x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c)
	return p
}
