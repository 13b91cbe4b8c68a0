package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/pki"
	"github.com/kproxy/kproxy/internal/record"
)

// exitStatus is a command's exit status (0 when err is nil, -1 when it
// did not run).
func exitStatus(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// kproxyBinary builds the kproxy binary into dir, as a user would, and
// writes the test apiserver's manifest beside it: the CLI tests' setup.
func kproxyBinary(t *testing.T, dir string) (bin, manifest string) {
	t.Helper()
	bin = filepath.Join(dir, "kproxy")
	build := exec.Command("go", "build", "-o", bin, "./cmd/kproxy")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build kproxy: %v\n%s", err, out)
	}
	manifest = filepath.Join(dir, "kube-apiserver.yaml")
	if err := cluster.WriteManifest(manifest); err != nil {
		t.Fatal(err)
	}
	return bin, manifest
}

// cliKubeconfigs are the CLI tests' kubeconfigs, written into dir:
// kproxy's own identity's (the upstream one) and the cluster admin's.
func cliKubeconfigs(t *testing.T, dir string) (upstream, admin string) {
	t.Helper()
	upstream, err := cluster.UpstreamKubeconfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	admin = filepath.Join(dir, "admin.kubeconfig")
	if err := localcluster.WriteKubeconfig(admin, cluster.URL, pki.CertPEM(cluster.CA.Cert), localcluster.TokenOf("admin")); err != nil {
		t.Fatal(err)
	}
	return upstream, admin
}

// runCLI runs kproxy (bin) with args and returns what it printed, stdout
// then stderr; the test fails unless it exits wantExit.
func runCLI(t *testing.T, bin string, wantExit int, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if code := exitStatus(cmd.Run()); code != wantExit {
		t.Fatalf("kproxy %s: exit status %d, want %d\n%s\n%s", strings.Join(args, " "), code, wantExit, out.String(), stderr.String())
	}
	return out.String() + stderr.String()
}

// TestExplainCommand runs `kproxy explain` as a user would, against the
// real cluster with the apiserver's manifest, and checks its verdicts.
func TestExplainCommand(t *testing.T) {
	f := setupFixtures(t)
	dir := t.TempDir()
	bin, manifest := kproxyBinary(t, dir)
	kc, err := cluster.UpstreamKubeconfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	certFile := filepath.Join(dir, "dave.crt")
	if err := os.WriteFile(certFile, pki.CertPEM(f.certs["cert:dave"].Leaf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmFile := filepath.Join(dir, "cm.json")
	if err := os.WriteFile(cmFile, []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name      string
		args      []string
		status    int
		stage     string
		inMessage string
	}{
		{"token denied", []string{"GET", "/api/v1/namespaces/corpus/secrets", "--token", "alice-token"}, 403, "authorization", `User "alice" cannot list resource "secrets"`},
		{"bad token", []string{"GET", "/api/v1/namespaces/corpus/pods", "--token", "nope"}, 401, "authentication", "Unauthorized"},
		{"as another user", []string{"GET", "/api/v1/namespaces/corpus/secrets/s2", "--as", "carol"}, 403, "authorization", `User "carol" cannot get resource "secrets"`},
		{"impersonation refused", []string{"GET", "/api/v1/namespaces/corpus/pods", "--token", "alice-token", "--as", "erin"}, 403, "impersonation", `User "alice" cannot impersonate`},
		{"certificate", []string{"GET", "/api/v1/namespaces/corpus/pods", "--client-certificate", certFile}, 403, "authorization", `User "dave" cannot list resource "pods"`},
		{"allowed read", []string{"GET", "/api/v1/namespaces/corpus/pods", "--token", "alice-token"}, 200, "", ""},
		{"read of a missing object", []string{"GET", "/api/v1/namespaces/corpus/configmaps/missing", "--token", "admin-token"}, 404, "storage", `configmaps "missing" not found`},
		{"write refused by admission", []string{"POST", "/api/v1/namespaces/nowhere/configmaps", "--token", "admin-token", "-f", cmFile}, 404, "mutating-admission", `namespaces "nowhere" not found`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"explain"}, c.args...)
			args = append(args, "-o", "json", "--upstream-kubeconfig", kc, "--apiserver-manifest", manifest)
			cmd := exec.Command(bin, args...)
			out, err := cmd.Output()
			// Scripts read the verdict from the exit status: 0 allowed,
			// 3 refused.
			wantExit := 0
			if c.status >= 400 {
				wantExit = 3
			}
			if code := exitStatus(err); code != wantExit {
				t.Fatalf("kproxy %s: exit status %d (%v), want %d\n%s", strings.Join(args, " "), code, err, wantExit, out)
			}
			var doc struct {
				Predicted record.Prediction    `json:"predicted"`
				Stages    []record.StageResult `json:"stages"`
			}
			if err := json.Unmarshal(out, &doc); err != nil {
				t.Fatalf("output is not JSON: %v\n%s", err, out)
			}
			p := doc.Predicted
			if p.Status != c.status || p.Stage != c.stage || !strings.Contains(p.Message, c.inMessage) {
				t.Errorf("predicted %+v, want %d at %s with %q", p, c.status, c.stage, c.inMessage)
			}
			if len(doc.Stages) != 9 {
				t.Errorf("%d stages, want 9", len(doc.Stages))
			}
		})
	}
	// Without --token or --client-certificate the request is the one kubectl
	// would send with the kubeconfig, whatever kind of credential it holds
	// (here a token file): never an anonymous request in its place.
	tokenFile := filepath.Join(dir, "kproxy.token")
	if err := os.WriteFile(tokenFile, []byte(localcluster.TokenOf("kproxy")), 0o600); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(kc)
	if err != nil {
		t.Fatal(err)
	}
	kcFile := filepath.Join(dir, "token-file.kubeconfig")
	withFile := strings.Replace(string(raw), "token: "+localcluster.TokenOf("kproxy"), "tokenFile: "+tokenFile, 1)
	if !strings.Contains(withFile, "tokenFile: ") {
		t.Fatalf("the kubeconfig has no token to move into a file:\n%s", raw)
	}
	if err := os.WriteFile(kcFile, []byte(withFile), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "explain", "GET", "/api/v1/namespaces/corpus/configmaps", "-o", "json",
		"--upstream-kubeconfig", kcFile, "--apiserver-manifest", manifest).Output()
	if err != nil {
		t.Fatalf("explain with a token-file kubeconfig: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), `authenticated a bearer token (Authorization: Bearer) as user \"kproxy\"`) {
		t.Errorf("explain with a token-file kubeconfig did not replay as the kubeconfig's user:\n%s", out)
	}
	// Bad input says what is wrong.
	out, err = exec.Command(bin, "explain", "GET").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "want METHOD PATH") {
		t.Errorf("explain with one argument: %v %s", err, out)
	}
	// A mistyped flag is an error naming the flag meant, never a replay as
	// kproxy's own identity; a kube-apiserver flag kproxy does not use is
	// accepted (its value too, given apart).
	out, err = exec.Command(bin, "explain", "GET", "/api/v1/namespaces/corpus/secrets", "--tokn", "alice-token",
		"--upstream-kubeconfig", kc, "--apiserver-manifest", manifest).CombinedOutput()
	if exitStatus(err) != 1 || !strings.Contains(string(out), "unknown flag: --tokn (did you mean --token?)") {
		t.Errorf("explain --tokn: exit %d, %s", exitStatus(err), out)
	}
	out, err = exec.Command(bin, "explain", "GET", "/api/v1/namespaces/corpus/secrets", "--token", "alice-token", "--secure-port", "6443",
		"--profiling=false", "--upstream-kubeconfig", kc, "--apiserver-manifest", manifest, "-o", "json").Output()
	if exitStatus(err) != 3 || !strings.Contains(string(out), `"stage": "authorization"`) {
		t.Errorf("explain with unused kube-apiserver flags: exit %d, %s", exitStatus(err), out)
	}
}
