package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kproxy/kproxy/internal/flowapi"
	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/pki"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
	"github.com/kproxy/kproxy/internal/source"
	"github.com/kproxy/kproxy/internal/telemetry"
	"github.com/kproxy/kproxy/internal/tui"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

func newDemoCommand() *cobra.Command {
	var dir, listen string
	var keep, noTUI bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Start a local etcd + kube-apiserver with kproxy in front and send sample requests",
		Long: `Start a real etcd and kube-apiserver (built by ` + "`make tools`" + `) on loopback
ports, put kproxy in front in reverse mode, send a short script of sample
requests (allowed and rejected), print what kproxy recorded, and keep
everything running with a KUBECONFIG to use from another terminal until
Ctrl-C, which stops every process the demo started.

On a terminal the demo is the cockpit: a Jaeger all-in-one receives the
traces, and kproxy tui opens on the live flow API while the sample
requests go by; q stops everything. Without a terminal (or with --no-tui
or --exit) it prints the table of what kproxy recorded.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cockpit := !keep && !noTUI && cmd.OutOrStdout() == os.Stdout && term.IsTerminal(int(os.Stdout.Fd()))
			return runDemo(cmd.Context(), cmd.OutOrStdout(), dir, listen, keep, cockpit)
		},
	}
	cmd.Flags().BoolVar(&noTUI, "no-tui", false, "print the table instead of opening kproxy tui, even on a terminal")
	cmd.Flags().StringVar(&dir, "dir", ".cache/demo", "directory for the cluster's PKI, data, logs, kubeconfig and capture")
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "kproxy's address (default: a free port)")
	cmd.Flags().BoolVar(&keep, "exit", false, "exit after the sample requests instead of waiting for Ctrl-C")
	return cmd
}

func runDemo(ctx context.Context, out io.Writer, dir, listen string, exitAfter, cockpit bool) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	clusterDir := filepath.Join(dir, "cluster")
	if err := os.RemoveAll(clusterDir); err != nil {
		return err
	}
	fmt.Fprintf(out, "kproxy demo: a real etcd + kube-apiserver %s in %s\n", kubeVersion, clusterDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// The processes' progress goes to the terminal, or to a file when the
	// terminal is the cockpit's.
	progress := prefixWriter(out, "  ")
	if cockpit {
		f, err := os.Create(filepath.Join(dir, "cluster.log"))
		if err != nil {
			return err
		}
		defer f.Close()
		progress = f
	}
	// The apiserver exports its own spans to kproxy's OTLP receiver, on a
	// port chosen now, before the apiserver starts: the records then say
	// where the apiserver spent each request's time.
	ports, err := localcluster.FreePorts(1)
	if err != nil {
		return err
	}
	receiver := fmt.Sprintf("127.0.0.1:%d", ports[0])
	c, err := localcluster.Start(ctx, localcluster.Options{Dir: clusterDir, Log: progress, EncryptSecrets: true, TracingEndpoint: receiver})
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
	// A Jaeger all-in-one receives kproxy's traces (it serves its query API;
	// the web UI's assets are not in its Go module).
	var jaeger *localcluster.Jaeger
	jaegerDir := filepath.Join(dir, "jaeger")
	if err := os.MkdirAll(jaegerDir, 0o755); err != nil {
		return err
	}
	if j, err := localcluster.StartJaeger(ctx, "", jaegerDir, progress); err != nil {
		fmt.Fprintf(out, "  (no Jaeger: %v; traces are not exported)\n", err)
	} else {
		jaeger = j
		defer j.Stop()
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
	apiserver, _, err := apiserver.OptionsFromArgs(c.APIServerFlags)
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
		// The flow API, on a free loopback port: the cockpit reads it, and
		// so can kproxy tui from another terminal.
		APIListen: "127.0.0.1:0", APIRerunKeep: serve.DefaultAPIRerunKeep,
		// The cockpit's Request tab shows each write's body.
		CaptureBodies: true,
		// The apiserver's own spans: the cockpit's Stages tab draws them.
		OTLPReceiverListen: receiver,
	}
	if jaeger != nil {
		opts.Telemetry = telemetry.Options{Endpoint: jaeger.OTLPHTTP, Protocol: "http/protobuf", Version: version}
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
	// The apiserver started before the receiver listened: its exporter
	// connects after a backoff. Until it has, records would wait in vain.
	for deadline := time.Now().Add(20 * time.Second); s.Joiner.Stats().Observations == 0 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}

	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := localcluster.WriteKubeconfig(kubeconfig, kproxyURL, kproxyCA, localcluster.TokenOf("admin")); err != nil {
		return err
	}
	fmt.Fprintf(out, "kproxy %s listening on %s, in front of %s\n", version, kproxyURL, c.URL)
	fmt.Fprintf(out, "  flow API:   %s   (kproxy tui --connect %s)\n", s.APIURL, s.APIURL)
	fmt.Fprintf(out, "  apiserver's own spans: received on %s (its --tracing-config-file points there) and joined to the records\n", s.OTLPReceiverAddr)
	if jaeger != nil {
		fmt.Fprintf(out, "  Jaeger:     OTLP %s, query API %s/api/traces/TRACE-ID\n", jaeger.OTLPHTTP, jaeger.QueryURL)
	}
	fmt.Fprintln(out)

	cert, err := c.CA.Issue(pki.Leaf{CommonName: "dave", Organization: []string{"devs"}, Client: true})
	if err != nil {
		return err
	}
	// One kubeconfig per caller, all pointing at kproxy: kubectl speaks
	// HTTP/2, protobuf and aggregated discovery to it, as it would to the
	// apiserver.
	users, err := demoKubeconfigs(dir, kproxyURL, kproxyCA, cert)
	if err != nil {
		return err
	}
	files, err := demoFiles(dir)
	if err != nil {
		return err
	}
	samples := demoSamples()
	if cockpit {
		err := runCockpit(runCtx, out, s, jaeger, func(ctx context.Context) ([]*record.Record, error) {
			_, recorded, err := runSamples(ctx, samples, users, files, filepath.Join(dir, "kubectl-cache"), recs)
			return recorded, err
		}, kubeconfig)
		// kproxy stops before Jaeger does (deferred), so its last spans are exported.
		cancel()
		if serr := <-served; err == nil {
			err = serr
		}
		return err
	}
	byRecord, recorded, err := runSamples(ctx, samples, users, files, filepath.Join(dir, "kubectl-cache"), recs)
	if err != nil {
		return err
	}
	var rows [][]any
	agree, unknown := 0, 0
	for i, smp := range samples {
		label := smp.who + ": " + smp.command
		if len(byRecord[i]) == 0 {
			rows = append(rows, []any{label, "(no request reached the apiserver)", "", "", "", "", ""})
		}
		for _, r := range byRecord[i] {
			caller := r.Identity
			if r.Request.User != "" {
				caller += ":" + r.Request.User
			}
			path := r.Request.Path
			if len(path) > 48 {
				path = path[:47] + "…"
			}
			rows = append(rows, []any{label, r.Request.Method, path, caller, predictedString(r.Predicted), actualString(r.Actual),
				time.Duration(r.Latency.TotalNs).Round(10 * time.Microsecond).String()})
			label = ""
			switch {
			case r.Predicted.Stage == record.StageUnknown:
				unknown++
			case r.Predicted.Status == r.Actual.Status && r.Predicted.Reason == r.Actual.Reason:
				agree++
			}
		}
	}
	if err := printTable(out, []string{"Kubectl", "Method", "Path", "Caller", "Predicted", "Actual", "Latency"}, rows); err != nil {
		return err
	}
	fmt.Fprintf(out, "\n%d requests from %d kubectl commands: %d predicted as the apiserver answered, %d unknown, %d predicted wrong\n",
		len(recorded), len(samples), agree, unknown, len(recorded)-agree-unknown)
	// The explanation of each refusal past authorization, from the stage
	// that decides it, and what storage saw of the Secret.
	for i, smp := range samples {
		for _, r := range byRecord[i] {
			if smp.showStorage && r.Request.Resource == "secrets" {
				for _, st := range r.Stages {
					if st.Name == record.StageStorage {
						fmt.Fprintf(out, "\n%q: storage says:\n  %s\n", smp.command, st.Explanation)
					}
				}
			}
			if p := r.Predicted.Stage; p == "" || p == record.StageUnknown || record.BeforeHandler(p) {
				continue
			}
			for _, st := range r.Stages {
				if st.Name == r.Predicted.Stage {
					fmt.Fprintf(out, "\nwhy %q: %s says:\n  %s\n", smp.command, st.Name, st.Explanation)
					for _, ch := range st.Children {
						if ch.Outcome == record.Reject {
							fmt.Fprintf(out, "  plugin %s (%v): %s\n", ch.Name, time.Duration(ch.DurationNs).Round(time.Microsecond), ch.Explanation)
						}
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
		// kproxy stops first, exporting its last spans while Jaeger still
		// listens (the deferred stops run after this returns).
		cancel()
		return <-served
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

// sample is one kubectl command of the demo's script, run as who.
type sample struct {
	who, command string
	showStorage  bool // print what the storage stage saw
}

func demoSamples() []sample {
	return []sample{
		{who: "admin", command: "version"},
		{who: "admin", command: "get namespaces"},
		{who: "alice", command: "get pods -n default"},
		{who: "alice", command: "get secrets -n kube-system"},
		{who: "bad-token", command: "get namespaces"},
		{who: "basic-auth", command: "get namespaces"}, // the apiserver ignores Basic: anonymous
		{who: "admin", command: "create configmap kproxy-demo --from-literal=hello=world"},
		{who: "admin", command: "create configmap kproxy-demo --from-literal=hello=world"},
		{who: "admin", command: "get configmap nope"},
		{who: "admin", command: "get secret demo-db", showStorage: true},
		{who: "admin", command: "replace -f STALE"},
		{who: "admin", command: "get --raw /api/v1/namespaces/default/configmaps?limit=1&continue=bm90LWEtdG9rZW4"},
		{who: "admin", command: "create -f BADPOD"},
		{who: "admin", command: "run root --image=busybox -n restricted"},
		{who: "admin", command: "create configmap kproxy-demo -n nowhere"},
		{who: "dave", command: "get configmaps"},
		{who: "dave", command: "delete configmap kproxy-demo"},
		{who: "alice", command: "auth can-i --list"},
		{who: "admin", command: "delete configmap kproxy-demo"},
	}
}

// demoKubeconfigs writes a kubeconfig per caller, all pointing at kproxy:
// admin and alice with their tokens, a bad token, basic auth (which the
// apiserver does not read: the request is anonymous), and dave's client
// certificate.
func demoKubeconfigs(dir, server string, caPEM []byte, dave *pki.Issued) (map[string]string, error) {
	users := map[string]string{}
	for who, token := range map[string]string{"admin": localcluster.TokenOf("admin"), "alice": localcluster.TokenOf("alice"), "bad-token": "not-a-token"} {
		p := filepath.Join(dir, "kubeconfig-"+who)
		if err := localcluster.WriteKubeconfig(p, server, caPEM, token); err != nil {
			return nil, err
		}
		users[who] = p
	}
	basic := filepath.Join(dir, "kubeconfig-basic-auth")
	if err := localcluster.WriteBasicAuthKubeconfig(basic, server, caPEM, "alice", "not-a-password"); err != nil {
		return nil, err
	}
	users["basic-auth"] = basic
	keyPEM, err := pki.KeyPEM(dave.Key)
	if err != nil {
		return nil, err
	}
	p := filepath.Join(dir, "kubeconfig-dave")
	if err := localcluster.WriteCertKubeconfig(p, server, caPEM, pki.CertPEM(dave.Cert), keyPEM); err != nil {
		return nil, err
	}
	users["dave"] = p
	return users, nil
}

// demoFiles writes the manifests the script uses and returns their
// placeholders.
func demoFiles(dir string) (map[string]string, error) {
	files := map[string]string{
		"STALE":  `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"kproxy-demo","namespace":"default","resourceVersion":"1"},"data":{"hello":"again"}}`,
		"BADPOD": `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"bad","namespace":"default"},"spec":{"containers":[]}}`,
	}
	out := map[string]string{}
	for k, v := range files {
		p := filepath.Join(dir, strings.ToLower(k)+".json")
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			return nil, err
		}
		out[k] = p
	}
	return out, nil
}

// runSamples runs each command with the real kubectl and collects the
// records of the requests it made: a command's records are those that
// arrive before the next command starts (each waits for quiet).
func runSamples(ctx context.Context, samples []sample, users, files map[string]string, cacheDir string, recs <-chan *record.Record) (map[int][]*record.Record, []*record.Record, error) {
	kubectl := kubectlPath()
	byRecord := map[int][]*record.Record{}
	var all []*record.Record
	for i, smp := range samples {
		args := []string{"--kubeconfig", users[smp.who], "--cache-dir", cacheDir}
		for _, a := range strings.Fields(smp.command) {
			if f, ok := files[a]; ok {
				a = f
			}
			args = append(args, a)
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_ = exec.CommandContext(cctx, kubectl, args...).Run() // refusals are the point
		cancel()
		// A request's record arrives once its replay is done.
		quiet := time.NewTimer(700 * time.Millisecond)
	collect:
		for {
			select {
			case r := <-recs:
				byRecord[i] = append(byRecord[i], r)
				all = append(all, r)
				quiet.Reset(400 * time.Millisecond)
			case <-quiet.C:
				break collect
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		}
	}
	return byRecord, all, nil
}

func predictedString(p record.Prediction) string {
	if p.Stage == record.StageUnknown {
		return "unknown"
	}
	if p.Stage == "" {
		return fmt.Sprint(p.Status)
	}
	if p.Reason == "" {
		// A refusal with no Status reason ("404 page not found").
		return fmt.Sprintf("%d at %s", p.Status, p.Stage)
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

// runCockpit opens kproxy tui on the demo's live flow API while the sample
// requests run, and stops everything when the user quits.
func runCockpit(ctx context.Context, out io.Writer, s *serve.Server, jaeger *localcluster.Jaeger,
	samples func(context.Context) ([]*record.Record, error), kubeconfig string) error {
	client, err := flowapi.NewClient(s.APIURL, flowapi.ClientOptions{})
	if err != nil {
		return err
	}
	opts := tui.Options{Source: source.Named(s.APIURL, source.API(client, "")), Replayer: client, ReplayFilter: client, Version: version}
	if jaeger != nil {
		opts.JaegerURL = jaeger.QueryURL
	}
	type result struct {
		recs []*record.Record
		err  error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan result, 1)
	go func() {
		recs, err := samples(ctx)
		done <- result{recs, err}
	}()
	if err := tui.Run(ctx, opts, false); err != nil {
		return err
	}
	cancel()
	res := <-done
	agree, unknown := 0, 0
	for _, r := range res.recs {
		switch {
		case r.Predicted.Stage == record.StageUnknown:
			unknown++
		case r.Predicted.Status == r.Actual.Status && r.Predicted.Reason == r.Actual.Reason:
			agree++
		}
	}
	if len(res.recs) > 0 {
		fmt.Fprintf(out, "%d sample requests: %d predicted as the apiserver answered, %d unknown, %d predicted wrong\n",
			len(res.recs), agree, unknown, len(res.recs)-agree-unknown)
	}
	fmt.Fprintf(out, "the capture, kubeconfig (%s) and logs stay in %s\n", kubeconfig, filepath.Dir(kubeconfig))
	return nil
}
