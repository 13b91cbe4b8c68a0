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
	applyManifest(t, filepath.Join(dir, "fixtures"))
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

// applyManifest applies a file of objects with the real kubectl, as admin.
func applyManifest(t *testing.T, path string) {
	t.Helper()
	bin, err := localcluster.Binary(os.Getenv("KPROXY_BIN_DIR"), "kubectl")
	if err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(t.TempDir(), "admin.kubeconfig")
	if err := localcluster.WriteKubeconfig(kc, cluster.URL, pki.CertPEM(cluster.CA.Cert), localcluster.TokenOf("admin")); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "--kubeconfig", kc, "apply", "--server-side", "-f", path).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl apply -f %s: %v\n%s", path, err, out)
	}
	_ = strings.TrimSpace
}
