package e2e

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/citest"
	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/pki"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/testfile"
)

// TestCITest dogfoods kproxy test on the conformance corpora: their real
// traffic is recorded through kproxy (--capture-bodies), turned into a
// suite by kproxy test generate ("record in staging, assert in CI"), and
// run by kproxy test run on both engines: locally over a snapshot of the
// test cluster, and against the cluster itself. Every case must pass
// unchanged on both, with the same verdicts; the JUnit report must parse;
// and a deny-everything policy in an overlay must flip exactly the writes
// that succeeded, at validating admission.
func TestCITest(t *testing.T) {
	dir := t.TempDir()
	capture := filepath.Join(dir, "capture.jsonl")
	// The auth corpus, and the storage corpus's served documents (reads
	// only, so both can run again after their own tests).
	applyStorageFixtures(t)
	served := filepath.Join(dir, "served")
	if err := os.MkdirAll(served, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("../../testdata/conformance/storage/served.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(served, "served.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	// And writes, so the what-if below has something to flip: they leave
	// the cluster as they found it.
	writes := filepath.Join(dir, "writes")
	if err := os.MkdirAll(writes, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(writes, "writes.yaml"), []byte(citestWrites), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, corpus := range []string{"../../testdata/conformance/auth", served, writes} {
		runCorpusWith(t, corpus, "citest-"+filepath.Base(corpus),
			kproxyOptions{capture: capture, captureBodies: true}, func(*testing.T, corpusCase, *record.Record) {})
	}
	bin, manifest := kproxyBinary(t, dir)
	upstream, err := cluster.UpstreamKubeconfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	admin := filepath.Join(dir, "admin.kubeconfig")
	if err := localcluster.WriteKubeconfig(admin, cluster.URL, pki.CertPEM(cluster.CA.Cert), localcluster.TokenOf("admin")); err != nil {
		t.Fatal(err)
	}
	run := func(wantExit int, args ...string) []byte {
		t.Helper()
		cmd := exec.Command(bin, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if code := exitStatus(cmd.Run()); code != wantExit {
			var r citest.Report
			if json.Unmarshal(stdout.Bytes(), &r) == nil {
				var failed []string
				for _, res := range r.Results {
					if !res.Passed() {
						failed = append(failed, fmt.Sprintf("%s (%s %s): %s%s", res.Name, res.Method, res.Path, strings.Join(res.Failures, "; "), res.Error))
					}
				}
				t.Fatalf("kproxy %s: exit status %d, want %d; %d of %d cases failed:\n%s", strings.Join(args, " "), code, wantExit, len(failed), len(r.Results), strings.Join(failed, "\n"))
			}
			t.Fatalf("kproxy %s: exit status %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, wantExit, lastLines(stdout.String(), 60), lastLines(stderr.String(), 40))
		}
		return stdout.Bytes()
	}

	suite := filepath.Join(dir, "suite", "recorded.yaml")
	if err := os.MkdirAll(filepath.Dir(suite), 0o755); err != nil {
		t.Fatal(err)
	}
	run(0, "test", "generate", "--from", capture, "--filter", "!~unknown", "-o", suite, "--snapshot", "../snap")
	files, err := testfile.Load(suite)
	if err != nil {
		t.Fatalf("the generated suite does not load: %v", err)
	}
	cases := len(files[0].Cases)
	if cases < 100 {
		t.Fatalf("generated %d cases from the corpora; want at least 100", cases)
	}
	snap := filepath.Join(dir, "snap")
	run(0, "snapshot", "-o", snap, "--kubeconfig", upstream, "--apiserver-manifest", manifest, "--for", suite)
	if b, err := os.ReadFile(filepath.Join(snap, "snapshot.yaml")); err != nil || strings.Contains(string(b), "token-auth-file=") {
		t.Errorf("the snapshot's manifest names the token file (it must leave it out): %v", err)
	}

	junit := filepath.Join(dir, "junit.xml")
	// The local engine passes every case but the reads of a Secret, which
	// a snapshot never holds: those it says unknown, never a status.
	local := report(t, run(1, "test", "run", "--engine", "local", "-o", "json", "--junit", junit, suite))
	unknownSecrets := 0
	for _, r := range local.Results {
		if r.Passed() {
			continue
		}
		if strings.Contains(r.Path, "/secrets/") && r.Got.Unknown != "" && r.Got.Status == 0 {
			// Saying why: the snapshot's own words (they had been the
			// client's "the server is currently unable to handle the
			// request").
			if !strings.Contains(r.Got.Unknown, "never written to a snapshot") {
				t.Errorf("local engine: %s: unknown, but %q", r.Name, r.Got.Unknown)
			}
			unknownSecrets++
			continue
		}
		t.Errorf("local engine: %s (%s %s): %s", r.Name, r.Method, r.Path, strings.Join(r.Failures, "; "))
	}
	// The cluster engine passes every case but those it cannot send
	// faithfully, which it says unknown: a user who impersonates (it
	// sends users by impersonation, which does not nest) and exec.
	remote := report(t, run(1, "test", "run", "--engine", "cluster", "--kubeconfig", admin, "--apiserver-manifest", manifest, "-o", "json", suite))
	unsendable := 0
	for _, r := range remote.Results {
		if r.Passed() {
			continue
		}
		if strings.Contains(r.Got.Unknown, "impersonation cannot be nested") || strings.Contains(r.Got.Unknown, "cannot be dry-run") {
			unsendable++
			continue
		}
		t.Errorf("cluster engine: %s (%s %s): %s", r.Name, r.Method, r.Path, strings.Join(r.Failures, "; "))
	}
	if len(local.Results) != cases || len(remote.Results) != cases {
		t.Fatalf("ran %d (local) and %d (cluster) of %d cases", len(local.Results), len(remote.Results), cases)
	}
	same, storage := 0, 0
	distinct := map[string]bool{}
	for i, l := range local.Results {
		r := remote.Results[i]
		if l.Got.Unknown != "" || r.Got.Unknown != "" {
			continue // said unknown, above
		}
		if l.Got.Stage == record.StageStorage || r.Got.Stage == record.StageStorage {
			storage++ // depends on the state: not compared
			continue
		}
		if l.Got.Summary() != r.Got.Summary() {
			t.Errorf("%s: local engine %s, cluster engine %s", l.Name, l.Got.Summary(), r.Got.Summary())
			continue
		}
		same++
		// The corpora run over HTTP/1.1 and HTTP/2: count requests once.
		distinct[regexp.MustCompile(` #\d+$`).ReplaceAllString(l.Name, "")+" "+l.Path] = true
	}
	t.Logf("%d cases (%d distinct requests agreeing): %d with the same verdict on both engines, %d decided by storage (state-dependent, not compared), %d reads of a Secret unknown locally, %d cases the cluster engine cannot send; %d disagreements of kproxy with the apiserver", cases, len(distinct), same, storage, unknownSecrets, unsendable, remote.Disagreements)
	if len(distinct) < 100 {
		t.Errorf("only %d distinct requests had the same verdict on both engines; want at least 100", len(distinct))
	}

	// JUnit as the CI reporters read it.
	var suites struct {
		Suites []struct {
			Tests    int `xml:"tests,attr"`
			Failures int `xml:"failures,attr"`
			Cases    []struct {
				Name string `xml:"name,attr"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	b, err = os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(b, &suites); err != nil {
		t.Fatalf("--junit wrote XML that does not parse: %v", err)
	}
	if len(suites.Suites) != 1 || suites.Suites[0].Tests != cases || suites.Suites[0].Failures != unknownSecrets || len(suites.Suites[0].Cases) != cases {
		t.Errorf("JUnit: %+v, want 1 suite with %d tests and %d failures", suites.Suites, cases, unknownSecrets)
	}

	// What-if: deny every write at validating admission.
	overlay := filepath.Join(dir, "deny-writes")
	if err := os.MkdirAll(overlay, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(overlay, "policy.yaml"), []byte(denyWrites), 0o644); err != nil {
		t.Fatal(err)
	}
	after := report(t, run(1, "test", "run", "--engine", "local", "-o", "json", "--overlay", overlay, suite))
	before := map[string]citest.Verdict{}
	for _, r := range local.Results {
		before[r.Name] = r.Got
	}
	changed := map[string]citest.Change{}
	for _, c := range after.Changes {
		changed[c.Name] = c
		if c.After.Stage != record.StageValidatingAdmission || !strings.Contains(c.After.Message, "writes are frozen") {
			t.Errorf("what-if %s: %s → %s, want a refusal at validating-admission by the policy", c.Name, c.Before.Summary(), c.After.Summary())
		}
	}
	for _, c := range files[0].Cases {
		write := c.Request.Method != "GET" && c.Request.Method != "HEAD" && resourcePath(c.Request.Path) &&
			!strings.Contains(c.Request.Path, "/tokenreviews") && !strings.Contains(c.Request.Path, "accessreviews")
		succeeded := before[c.Name].Status > 0 && before[c.Name].Status < 400
		_, flipped := changed[c.Name]
		if write && succeeded && !flipped {
			t.Errorf("what-if: %s %s succeeded and is a write, but the deny-writes policy did not flip it", c.Request.Method, c.Name)
		}
		if !write && flipped {
			t.Errorf("what-if: %s %s is not a write, but the deny-writes policy flipped it", c.Request.Method, c.Name)
		}
	}
	if len(after.Changes) == 0 {
		t.Error("the deny-writes overlay changed no verdict")
	}
	t.Logf("what-if: the deny-writes overlay flips %d cases", len(after.Changes))
}

// resourcePath reports a path the apiserver resolves to a resource (as
// RequestInfo does: /api/<version>/<resource>..., /apis/<group>/<version>/
// <resource>...): only those are admitted. A POST or DELETE of a discovery
// path (kube-aggregator's /apis answers any method) changes nothing.
func resourcePath(p string) bool {
	p, _, _ = strings.Cut(p, "?")
	parts := strings.Split(strings.Trim(p, "/"), "/")
	switch {
	case len(parts) > 0 && parts[0] == "api":
		return len(parts) >= 3
	case len(parts) > 0 && parts[0] == "apis":
		return len(parts) >= 4
	}
	return false
}

const citestWrites = `- name: admin reads a missing configmap in protobuf, as typed clients ask
  path: /api/v1/namespaces/corpus/configmaps/no-such-configmap
  headers: {Accept: [application/vnd.kubernetes.protobuf,application/json]}
  status: 404
- name: anonymous reads configmaps in protobuf
  as: none
  path: /api/v1/namespaces/corpus/configmaps
  headers: {Accept: [application/vnd.kubernetes.protobuf,application/json]}
  status: 403
  stage: authorization
- name: admin reads /api/v1/namespaces
  path: /api/v1/namespaces
  status: 200
- name: anonymous reads /api/v1/namespaces
  as: none
  path: /api/v1/namespaces
  status: 403
  stage: authorization
- name: admin reads /api/v1/nodes
  path: /api/v1/nodes
  status: 200
- name: anonymous reads /api/v1/nodes
  as: none
  path: /api/v1/nodes
  status: 403
  stage: authorization
- name: admin reads /api/v1/namespaces/corpus/services
  path: /api/v1/namespaces/corpus/services
  status: 200
- name: anonymous reads /api/v1/namespaces/corpus/services
  as: none
  path: /api/v1/namespaces/corpus/services
  status: 403
  stage: authorization
- name: admin reads /api/v1/namespaces/corpus/events
  path: /api/v1/namespaces/corpus/events
  status: 200
- name: anonymous reads /api/v1/namespaces/corpus/events
  as: none
  path: /api/v1/namespaces/corpus/events
  status: 403
  stage: authorization
- name: admin reads /apis/rbac.authorization.k8s.io/v1/clusterroles
  path: /apis/rbac.authorization.k8s.io/v1/clusterroles
  status: 200
- name: anonymous reads /apis/rbac.authorization.k8s.io/v1/clusterroles
  as: none
  path: /apis/rbac.authorization.k8s.io/v1/clusterroles
  status: 403
  stage: authorization
- name: admin reads /apis/rbac.authorization.k8s.io/v1/namespaces/corpus/roles
  path: /apis/rbac.authorization.k8s.io/v1/namespaces/corpus/roles
  status: 200
- name: anonymous reads /apis/rbac.authorization.k8s.io/v1/namespaces/corpus/roles
  as: none
  path: /apis/rbac.authorization.k8s.io/v1/namespaces/corpus/roles
  status: 403
  stage: authorization
- name: admin reads /apis/coordination.k8s.io/v1/namespaces/kube-system/leases
  path: /apis/coordination.k8s.io/v1/namespaces/kube-system/leases
  status: 200
- name: anonymous reads /apis/coordination.k8s.io/v1/namespaces/kube-system/leases
  as: none
  path: /apis/coordination.k8s.io/v1/namespaces/kube-system/leases
  status: 403
  stage: authorization
- name: admin reads /apis/scheduling.k8s.io/v1/priorityclasses
  path: /apis/scheduling.k8s.io/v1/priorityclasses
  status: 200
- name: anonymous reads /apis/scheduling.k8s.io/v1/priorityclasses
  as: none
  path: /apis/scheduling.k8s.io/v1/priorityclasses
  status: 403
  stage: authorization
- name: admin reads /apis/apiextensions.k8s.io/v1/customresourcedefinitions
  path: /apis/apiextensions.k8s.io/v1/customresourcedefinitions
  status: 200
- name: anonymous reads /apis/apiextensions.k8s.io/v1/customresourcedefinitions
  as: none
  path: /apis/apiextensions.k8s.io/v1/customresourcedefinitions
  status: 403
  stage: authorization
- name: admin reads /apis/flowcontrol.apiserver.k8s.io/v1/flowschemas
  path: /apis/flowcontrol.apiserver.k8s.io/v1/flowschemas
  status: 200
- name: anonymous reads /apis/flowcontrol.apiserver.k8s.io/v1/flowschemas
  as: none
  path: /apis/flowcontrol.apiserver.k8s.io/v1/flowschemas
  status: 403
  stage: authorization
- name: admin reads /apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies
  path: /apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies
  status: 200
- name: anonymous reads /apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies
  as: none
  path: /apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies
  status: 403
  stage: authorization
- name: admin reads /apis/batch/v1/namespaces/corpus/jobs
  path: /apis/batch/v1/namespaces/corpus/jobs
  status: 200
- name: anonymous reads /apis/batch/v1/namespaces/corpus/jobs
  as: none
  path: /apis/batch/v1/namespaces/corpus/jobs
  status: 403
  stage: authorization
- name: create a configmap
  method: POST
  path: /api/v1/namespaces/corpus/configmaps
  contentType: application/json
  body: '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"citest"},"data":{"a":"1"}}'
  status: 201
- name: replace it
  method: PUT
  path: /api/v1/namespaces/corpus/configmaps/citest
  contentType: application/json
  body: '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"citest"},"data":{"a":"2"}}'
  status: 200
- name: patch it
  method: PATCH
  path: /api/v1/namespaces/corpus/configmaps/citest
  contentType: application/merge-patch+json
  body: '{"data":{"b":"3"}}'
  status: 200
- name: alice may not create one
  as: alice
  method: POST
  path: /api/v1/namespaces/corpus/configmaps
  contentType: application/json
  body: '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"citest-alice"}}'
  status: 403
  stage: authorization
- name: create a service account
  method: POST
  path: /api/v1/namespaces/corpus/serviceaccounts
  contentType: application/json
  body: '{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"citest"}}'
  status: 201
- name: delete the configmap
  method: DELETE
  path: /api/v1/namespaces/corpus/configmaps/citest
  status: 200
- name: delete the service account
  method: DELETE
  path: /api/v1/namespaces/corpus/serviceaccounts/citest
  status: 200
`

const denyWrites = `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: deny-writes}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: ["*"]
      apiVersions: ["*"]
      operations: ["CREATE", "UPDATE", "DELETE"]
      resources: ["*", "*/*"]
  validations:
  - expression: "false"
    message: writes are frozen
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: deny-writes}
spec:
  policyName: deny-writes
  validationActions: [Deny]
`

// applyStorageFixtures applies the storage corpus's custom resources and
// objects (idempotent: TestStorageConformance applies them too).
func applyStorageFixtures(t *testing.T) {
	t.Helper()
	dir := "../../testdata/conformance/storage/fixtures"
	applyManifest(t, "apply", "--server-side", "-f", filepath.Join(dir, "crds.yaml"))
	applyManifest(t, "wait", "--for=condition=Established", "--timeout=60s", "crd/gadgets.storage.kproxy.test")
	applyManifest(t, "apply", "--server-side", "-f", filepath.Join(dir, "objects.yaml"))
}

func report(t *testing.T, b []byte) *citest.Report {
	t.Helper()
	var r citest.Report
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("kproxy test run -o json: %v\n%s", err, lastLines(string(b), 20))
	}
	return &r
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
