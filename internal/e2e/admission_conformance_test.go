package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/pki"
	"github.com/kproxy/kproxy/internal/record"
)

// writeStages are the stages the admission corpus checks.
var writeStages = []string{"decode", "mutating-admission", "validation", "validating-admission", "storage"}

// TestAdmissionConformance runs every case of testdata/conformance/admission
// through kproxy in front of the real apiserver, against the objects of
// its fixtures.yaml, and asserts that the prediction is the apiserver's
// answer: status, deciding stage, reason and message.
func TestAdmissionConformance(t *testing.T) {
	dir := "../../testdata/conformance/admission"
	applyManifest(t, "apply", "--server-side", "-f", filepath.Join(dir, "fixtures", "objects.yaml"))
	applyManifest(t, "apply", "--server-side", "--subresource=status", "-f", filepath.Join(dir, "fixtures", "status.yaml"))
	// No namespace controller runs here: a deleted namespace stays
	// Terminating.
	applyManifest(t, "create", "namespace", "adm-terminating")
	applyManifest(t, "delete", "namespace", "adm-terminating", "--wait=false")
	waitPolicies(t)
	corpus := loadCorpus(t, dir)
	f, recs, r := corpusHarness(t)
	got := map[string]*record.Record{}
	next := func(id string) *record.Record {
		deadline := time.After(60 * time.Second)
		for got[id] == nil {
			select {
			case rec := <-recs:
				got[rec.Actual.AuditID] = rec
			case <-deadline:
				t.Fatalf("no record for %s", id)
			}
		}
		return got[id]
	}
	files := make([]string, 0, len(corpus))
	for name := range corpus {
		files = append(files, name)
	}
	sort.Strings(files)
	total := 0
	for _, file := range files {
		t.Run(file, func(t *testing.T) {
			for i, c := range corpus[file] {
				total++
				t.Run(c.Name, func(t *testing.T) {
					id := fmt.Sprintf("adm-%s-%03d", file, i)
					as := c.As
					if as == "" {
						as = "admin"
					}
					token, cert := f.credentials(t, as)
					h := http.Header{"Audit-Id": {id}}
					for k, v := range c.Headers {
						h[http.CanonicalHeaderKey(k)] = v
					}
					if token != "" {
						h.Set("Authorization", "Bearer "+token)
					}
					ct := c.ContentType
					if ct == "" && c.Body != "" {
						ct = "application/json"
					}
					ex := do(t, r.client(cert), r.base, request{method: c.Method, path: c.Path, body: c.Body, contentType: ct, header: h})
					if ex.status != c.Status {
						t.Fatalf("the apiserver answered %d, the corpus says %d: update the case (body %s)", ex.status, c.Status, ex.body)
					}
					rec := next(id)
					checkWritePrediction(t, c, rec)
				})
			}
		})
	}
	t.Logf("admission corpus: %d cases", total)
}

func checkWritePrediction(t *testing.T, c corpusCase, rec *record.Record) {
	t.Helper()
	p, a := rec.Predicted, rec.Actual
	if c.Unknown != "" {
		if p.Stage != record.StageUnknown || !strings.Contains(p.Message, c.Unknown) {
			t.Errorf("predicted %+v, want unknown because %q", p, c.Unknown)
		}
		return
	}
	want := record.Prediction{Status: a.Status, Stage: c.Stage, Reason: a.Reason, Message: a.Message}
	got := record.Prediction{Status: p.Status, Stage: p.Stage, Reason: p.Reason, Message: p.Message}
	if got != want {
		t.Errorf("predicted %+v\n     actual %+v\n     stages %s", got, want, stageSummary(rec))
		return
	}
	stage := map[string]record.StageResult{}
	for _, s := range rec.Stages {
		stage[s.Name] = s
	}
	if c.Stage != "" {
		if s := stage[c.Stage]; s.Outcome != record.Reject || s.Explanation == "" {
			t.Errorf("stage %s: %s %q, want reject with an explanation", c.Stage, s.Outcome, s.Explanation)
		}
		return
	}
	for _, name := range writeStages {
		if s := stage[name]; s.Outcome != record.Pass {
			t.Errorf("stage %s: %s (%s), want pass", name, s.Outcome, s.Explanation)
		}
	}
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
