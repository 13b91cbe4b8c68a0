package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/pki"
	"github.com/kproxy/kproxy/internal/record"
)

// writeStages are the stages the admission corpus checks.
var writeStages = record.StageOrder[4:]

// TestAdmissionConformance runs every case of testdata/conformance/admission
// through kproxy in front of the real apiserver, against the objects of
// its fixtures.yaml, and asserts that the prediction is the apiserver's
// answer: status, deciding stage, reason and message.
func TestAdmissionConformance(t *testing.T) {
	dir := "../../testdata/conformance/admission"
	applyManifest(t, "apply", "--server-side", "-f", filepath.Join(dir, "fixtures", "crds.yaml"))
	applyManifest(t, "wait", "--for=condition=Established", "--timeout=60s", "crd/widgets.corpus.kproxy.test")
	applyManifest(t, "apply", "--server-side", "-f", filepath.Join(dir, "fixtures", "objects.yaml"))
	served := time.Now() // the fixtures' APIService and CRDs, as kproxy will see them
	applyManifest(t, "apply", "--server-side", "-f", filepath.Join(dir, "fixtures", "crs.yaml"))
	applyManifest(t, "apply", "--server-side", "--subresource=status", "-f", filepath.Join(dir, "fixtures", "status.yaml"))
	// No namespace controller runs here: a deleted namespace stays
	// Terminating.
	applyManifest(t, "create", "namespace", "adm-terminating")
	applyManifest(t, "delete", "namespace", "adm-terminating", "--wait=false")
	waitPolicies(t)
	waitMutatingPolicies(t)
	startAdmissionWebhooks(t)
	waitWebhooks(t)
	// kproxy says unknown for a group whose CRDs or APIServices changed
	// less than 10 s before a request (the apiserver follows them a moment
	// late): the discovery cases are sent once that has passed.
	time.Sleep(time.Until(served.Add(11 * time.Second)))
	if total := runCorpus(t, dir, "adm", checkWritePrediction); total < 100 {
		t.Errorf("the admission corpus has %d cases; it should cover at least 100", total)
	}
}

func checkWritePrediction(t *testing.T, c corpusCase, rec *record.Record) {
	t.Helper()
	p, a := rec.Predicted, rec.Actual
	if c.Unknown != "" {
		predicted := c.OrPredicted && p.Stage != record.StageUnknown && p.Status == a.Status && p.Reason == a.Reason
		if !predicted && (p.Stage != record.StageUnknown || !strings.Contains(p.Message, c.Unknown)) {
			t.Errorf("predicted %+v, want unknown because %q", p, c.Unknown)
		}
		return
	}
	// A resourceVersion too large is answered by the watch cache after
	// waiting up to 3 seconds, with its own revision by then ("current:
	// N"); kproxy predicts it with etcd's revision on arrival.
	want := record.Prediction{Status: a.Status, Stage: c.Stage, Reason: a.Reason, Message: maskCurrentRevision(a.Message)}
	got := record.Prediction{Status: p.Status, Stage: p.Stage, Reason: p.Reason, Message: maskCurrentRevision(p.Message)}
	if !samePrediction(got, want) {
		t.Errorf("predicted %+v\n     actual %+v\n     stages %s", got, want, stageSummary(rec))
		return
	}
	stage := map[string]record.StageResult{}
	var all strings.Builder
	for _, s := range rec.Stages {
		stage[s.Name] = s
		all.WriteString(s.Explanation + "\n")
		for _, ch := range s.Children {
			all.WriteString(ch.Name + ": " + ch.Explanation + "\n")
		}
	}
	for _, e := range c.Explains {
		if !strings.Contains(all.String(), e) {
			t.Errorf("the explanations lack %q:%s", e, stageSummary(rec))
		}
	}
	if c.Stage != "" {
		if s := stage[c.Stage]; s.Outcome != record.Reject || s.Explanation == "" {
			t.Errorf("stage %s: %s %q, want reject with an explanation", c.Stage, s.Outcome, s.Explanation)
		}
		notReachedAfter(t, rec, c.Stage)
		return
	}
	for _, name := range writeStages {
		want := record.Pass
		read := rec.Request.Verb == "get" || rec.Request.Verb == "list" || rec.Request.Verb == "watch"
		if nonResource := rec.Request.Resource == ""; (read || nonResource) && name != record.StageDecode && name != record.StageStorage {
			want = record.Skip // reads and non-resource requests are not admitted
		}
		if slices.Contains(c.Skips, name) {
			want = record.Skip
		}
		if s := stage[name]; s.Outcome != want {
			t.Errorf("stage %s: %s (%s), want %s", name, s.Outcome, s.Explanation, want)
		}
	}
}

// notReachedAfter checks that the handler stages after the one that
// refused were not reached: the apiserver stops at its first refusal.
// A registry's own authorization check (RBAC's escalation check) refuses
// after decode and mutating admission ran, and before the strategy.
func notReachedAfter(t *testing.T, rec *record.Record, decided string) {
	t.Helper()
	after := false
	for _, s := range rec.Stages {
		if !after {
			after = s.Name == decided
			continue
		}
		ranFirst := decided == record.StageAuthorization && (s.Name == record.StageDecode || s.Name == record.StageMutatingAdmission)
		if s.Outcome == record.Reject || (s.Outcome == record.Pass && !ranFirst) {
			t.Errorf("stage %s after %s, which refused: %s (%s), want skip (not reached)", s.Name, decided, s.Outcome, s.Explanation)
		}
	}
}

var currentRevision = regexp.MustCompile(`current: \d+`)

func maskCurrentRevision(msg string) string {
	if !strings.Contains(msg, "Too large resource version") {
		return msg
	}
	return currentRevision.ReplaceAllString(msg, "current: N")
}

// applyManifest runs the real kubectl as admin.
func applyManifest(t *testing.T, args ...string) {
	t.Helper()
	bin, err := localcluster.Binary(os.Getenv("KPROXY_BIN_DIR"), "kubectl")
	if err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(t.TempDir(), "admin.kubeconfig")
	if err := localcluster.WriteKubeconfig(kc, cluster.URL, pki.CertPEM(cluster.CA.Cert), localcluster.TokenOf("admin")); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, append([]string{"--kubeconfig", kc}, args...)...).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "AlreadyExists") && !strings.Contains(string(out), "already exists") {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// waitWebhooks waits until the apiserver calls the corpus's webhooks.
func waitWebhooks(t *testing.T) {
	t.Helper()
	cs := adminClient()
	body := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"probe","labels":{"wh":"deny"}}}`
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := cs.CoreV1().RESTClient().Post().AbsPath("/api/v1/namespaces/"+webhookNS+"/configmaps").Param("dryRun", "All").
			SetHeader("Content-Type", "application/json").Body([]byte(body)).Do(t.Context()).Error()
		if err != nil && strings.Contains(err.Error(), "the corpus webhook says no") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the corpus's webhooks are not called after 30s (last answer: %v)", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitMutatingPolicies waits until the apiserver applies the corpus's
// MutatingAdmissionPolicies (with their params).
func waitMutatingPolicies(t *testing.T) {
	t.Helper()
	cs := adminClient()
	body := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"probe","labels":{"wants-team":"yes"}}}`
	deadline := time.Now().Add(30 * time.Second)
	for {
		raw, err := cs.CoreV1().RESTClient().Post().AbsPath("/api/v1/namespaces/adm-map/configmaps").Param("dryRun", "All").
			SetHeader("Content-Type", "application/json").Body([]byte(body)).Do(t.Context()).Raw()
		if err == nil && strings.Contains(string(raw), `"map-mutated":"yes"`) && strings.Contains(string(raw), `"team":"storage"`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the corpus's mutating admission policies are not applied after 30s (last answer: %v %s)", err, raw)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitPolicies waits until the apiserver enforces the corpus's
// ValidatingAdmissionPolicies (their bindings are picked up
// asynchronously).
func waitPolicies(t *testing.T) {
	t.Helper()
	cs := adminClient()
	body := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"probe"},"spec":{"containers":[{"name":"c","image":"x:latest"}]}}`
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := cs.CoreV1().RESTClient().Post().AbsPath("/api/v1/namespaces/adm-policy/pods").Param("dryRun", "All").
			SetHeader("Content-Type", "application/json").Body([]byte(body)).Do(t.Context()).Error()
		if err != nil && strings.Contains(err.Error(), "latest tag") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the corpus's admission policies are not enforced after 30s (last answer: %v)", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
