package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/record"
)

// The kubectl session: what a person types during a working day, through
// kproxy, with the real kubectl (HTTP/2, protobuf, aggregated discovery,
// WebSocket exec): every record's prediction must be the apiserver's
// answer, or say plainly why it cannot be. A confident wrong prediction
// fails the test; the agreement figure is logged (the README quotes it).

const sessionNS = "kubectl-session"

const sessionManifest = `apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: kubectl-session
data:
  color: blue
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: kubectl-session
spec:
  replicas: 1
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: registry.k8s.io/pause:3.10
`

const sessionPod = `apiVersion: v1
kind: Pod
metadata:
  name: nodeless
  namespace: kubectl-session
spec:
  containers:
  - name: main
    image: registry.k8s.io/pause:3.10
`

// sessionCommands are kubectl invocations, as admin unless the first word
// is "as:USER".
var sessionCommands = []string{
	"create namespace " + sessionNS,
	"create serviceaccount default -n " + sessionNS, // what the controller manager would do
	"apply -f MANIFEST",
	"apply -f MANIFEST", // unchanged: a no-op apply
	"apply --server-side -f MANIFEST",
	"apply --server-side -f MANIFEST",
	"create -f POD",
	"get pods -n " + sessionNS,
	"get pods -A",
	"get pod nodeless -n " + sessionNS + " -o yaml",
	"get configmap settings -n " + sessionNS + " -o json",
	"get configmap missing -n " + sessionNS,
	"describe configmap settings -n " + sessionNS,
	"describe pod nodeless -n " + sessionNS,
	"describe deployment web -n " + sessionNS,
	"label configmap settings -n " + sessionNS + " tier=front",
	"label configmap settings -n " + sessionNS + " tier=front --overwrite",
	"annotate configmap settings -n " + sessionNS + " note=hello",
	"patch configmap settings -n " + sessionNS + " --type merge -p {\"data\":{\"color\":\"green\"}}",
	"patch configmap settings -n " + sessionNS + " --type merge -p {\"data\":{\"color\":\"green\"}}", // no change
	"patch configmap settings -n " + sessionNS + " --type json -p [{\"op\":\"test\",\"path\":\"/data/color\",\"value\":\"red\"}]",
	"patch deployment web -n " + sessionNS + " -p {\"spec\":{\"replicas\":2}}",
	"scale deployment web -n " + sessionNS + " --replicas=3",
	"rollout restart deployment web -n " + sessionNS,
	"create configmap extra -n " + sessionNS + " --from-literal=a=b",
	"patch configmap extra -n " + sessionNS + " --type merge -p {\"data\":{\"a\":\"b\"}}", // no change, on a fresh object
	"replace -f MANIFEST", // the same objects again
	"create configmap extra -n " + sessionNS + " --from-literal=a=b", // AlreadyExists
	"create configmap bad_name -n " + sessionNS,                      // Invalid
	"delete configmap extra -n " + sessionNS,
	"delete configmap extra -n " + sessionNS, // NotFound
	"delete configmap settings -n " + sessionNS + " --dry-run=server",
	"auth can-i list pods -n " + sessionNS,
	"auth can-i --list -n " + sessionNS,
	"auth whoami",
	"create token default -n " + sessionNS,
	"api-resources",
	"api-versions",
	"explain pods.spec.containers",
	"version",
	"logs nodeless -n " + sessionNS,
	"logs nodeless -n " + sessionNS + " -c nope",
	"exec nodeless -n " + sessionNS + " -- true",
	"attach nodeless -n " + sessionNS,
	"get --raw /api/v1/namespaces/" + sessionNS + "/pods/nodeless/proxy/",
	"get --raw /api/v1/namespaces/default/services/kubernetes/proxy/",
	"get --raw /api/v1/namespaces/" + sessionNS + "/services/nothing/proxy/",
	"edit configmap settings -n " + sessionNS, // EDITOR=true: an edit that changes nothing
	"rollout status deployment web -n " + sessionNS + " --timeout=1s",
	"get events -n " + sessionNS,
	"top pods -n " + sessionNS, // no metrics API here
	"get --raw /healthz",
	"get --raw /readyz?verbose",
	"as:alice get pods -n " + sessionNS,
	"as:alice get secrets -n " + sessionNS,
	"as:alice delete configmap settings -n " + sessionNS,
	"as:alice auth can-i --list -n " + sessionNS,
	"as:alice auth whoami",
	"delete pod nodeless -n " + sessionNS + " --wait=false",
	"delete deployment web -n " + sessionNS,
}

type sessionResult struct {
	match, unknown, wrong int
	wrongs                []string
	unknowns              map[string]int
}

func TestKubectlSession(t *testing.T) {
	dir := t.TempDir()
	bin, err := localcluster.Binary(os.Getenv("KPROXY_BIN_DIR"), "kubectl")
	if err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(dir, "manifest.yaml")
	pod := filepath.Join(dir, "pod.yaml")
	for p, s := range map[string]string{manifest: sessionManifest, pod: sessionPod} {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stream := record.NewStream()
	recs, dropped, cancel := stream.Subscribe(1 << 14)
	defer cancel()
	k := startKproxy(t, kproxyOptions{stream: stream})
	kubeconfig := func(user string) string {
		p := filepath.Join(dir, user+".kubeconfig")
		if _, err := os.Stat(p); err == nil {
			return p
		}
		if err := localcluster.WriteKubeconfig(p, "https://"+k.addr, k.caPEM, localcluster.TokenOf(user)); err != nil {
			t.Fatal(err)
		}
		return p
	}
	sent := 0
	for _, line := range sessionCommands {
		user := "admin"
		if strings.HasPrefix(line, "as:") {
			u, rest, _ := strings.Cut(strings.TrimPrefix(line, "as:"), " ")
			user, line = u, rest
		}
		args := strings.Fields(strings.NewReplacer("MANIFEST", manifest, "POD", pod).Replace(line))
		ctx, stop := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", kubeconfig(user)}, args...)...)
		cmd.Env = append(os.Environ(), "EDITOR=true", "KUBE_EDITOR=true")
		out, err := cmd.CombinedOutput()
		stop()
		shown := firstLines(string(out), 3)
		if strings.HasPrefix(line, "create token") && err == nil {
			shown = "(a token, not shown)"
		}
		t.Logf("kubectl %s (as %s): %v\n%s", line, user, err, shown)
		sent++
	}
	// A watch for a few seconds.
	ctx, stop := context.WithTimeout(context.Background(), 3*time.Second)
	_ = exec.CommandContext(ctx, bin, "--kubeconfig", kubeconfig("admin"), "get", "configmaps", "-n", sessionNS, "--watch").Run()
	stop()

	// Records arrive when their replay is done; wait for quiet.
	all := quietRecords(t, recs, dropped, 5*time.Second, 3*time.Second)
	res := judgeSession(all)
	for _, r := range all {
		// kubectl speaks HTTP/2 (but for upgrades: exec, attach, port-forward).
		if r.Request.Protocol != "HTTP/2.0" && r.Request.Subresource == "" {
			t.Errorf("%s %s: record's protocol %q, want kubectl's HTTP/2.0", r.Request.Method, r.Request.Path, r.Request.Protocol)
		}
	}
	t.Logf("kubectl session: %d commands, %d records: %d agree, %d unknown, %d confidently wrong (agreement %.0f%%)",
		sent, len(all), res.match, res.unknown, res.wrong, 100*float64(res.match)/float64(max(1, len(all))))
	var reasons []string
	for why, n := range res.unknowns {
		reasons = append(reasons, fmt.Sprintf("%3d  %s", n, why))
	}
	sort.Strings(reasons)
	t.Logf("unknown, by reason:\n%s", strings.Join(reasons, "\n"))
	for _, w := range res.wrongs {
		t.Errorf("confidently wrong: %s", w)
	}
	// What may stay unknown: only what another party answers (a kubelet,
	// a proxied backend), and kubectl's conditional read of the OpenAPI
	// index when the index changed around it (an index with an ETag, which
	// the apiserver's OpenAPI controller updates as the cluster's APIs
	// settle) or, stamped with the time it is served, when kubectl's copy
	// came within seconds of the request; and a document asked for by
	// the hash its index links, seconds after another test changed a CRD
	// (the index lags the document's handler).
	for why, n := range res.unknowns {
		if !strings.Contains(why, "only it answers from here") && !strings.Contains(why, ": the index changed ") &&
			!strings.Contains(why, "is stamped with the time the apiserver serves it") && !strings.Contains(why, "by the hash its index links") {
			t.Errorf("%d records unknown for a reason the session does not expect: %s", n, why)
		}
	}
	if res.match < len(all)*9/10 {
		t.Errorf("%d of %d records agree: below 90%%", res.match, len(all))
	}
}

// judgeSession sorts records into agreeing, honest unknowns and confident
// wrong predictions.
func judgeSession(all []*record.Record) sessionResult {
	res := sessionResult{unknowns: map[string]int{}}
	for _, r := range all {
		p, a := r.Predicted, r.Actual
		switch {
		case p.Stage == record.StageUnknown:
			res.unknown++
			why := p.Message
			if len(why) > 400 {
				why = why[:400]
			}
			res.unknowns[why+" ["+r.Request.Method+" "+r.Request.Path+fmt.Sprintf(" -> %d", a.Status)+"]"]++
		case p.Status == a.Status && p.Reason == a.Reason && maskCurrentRevision(p.Message) == maskCurrentRevision(a.Message):
			res.match++
		default:
			res.wrong++
			res.wrongs = append(res.wrongs, fmt.Sprintf("%s %s?%s (%s): predicted %d %s at %s %q, actual %d %s %q",
				r.Request.Method, r.Request.Path, r.Request.Query, r.Request.UserAgent, p.Status, p.Reason, p.Stage, p.Message, a.Status, a.Reason, a.Message)+stageSummary(r))
		}
	}
	return res
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}
