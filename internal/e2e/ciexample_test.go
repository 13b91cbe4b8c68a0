package e2e

import (
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCIExample runs examples/ci as its README says, against the test
// cluster: a snapshot of it, the suite on the local engine (passes), with
// the proposed change (fails, naming the layer and the reason, in the
// table and in JUnit), and on the cluster engine with the platform
// applied (passes). Bad input exits 2 and names the file and line.
func TestCIExample(t *testing.T) {
	dir := t.TempDir()
	bin, manifest := kproxyBinary(t, dir)
	upstream, admin := cliKubeconfigs(t, dir)
	example := "../../examples/ci"
	run := func(wantExit int, args ...string) string {
		t.Helper()
		return runCLI(t, bin, wantExit, args...)
	}
	snap := filepath.Join(dir, "snapshot")
	run(0, "snapshot", "-o", snap, "--kubeconfig", upstream, "--apiserver-manifest", manifest, "--for", example+"/tests")

	out := run(0, "test", "run", "--snapshot", snap, example+"/tests")
	if !strings.Contains(out, "8 passed, 0 failed, 0 errors") {
		t.Errorf("the example suite on the local engine:\n%s", out)
	}

	junit := filepath.Join(dir, "junit.xml")
	out = run(1, "test", "run", "--snapshot", snap, "--overlay", example+"/proposed", "--junit", junit, example+"/tests")
	for _, want := range []string{
		"FAIL     developers create a configmap",
		"status: want 201, got 422 Invalid at validating-admission",
		"every ConfigMap needs an owner label",
		"1 case changes",
		"7 passed, 1 failed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("with the proposed change, the report does not say %q:\n%s", want, out)
		}
	}
	b, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	var suites struct {
		Suites []struct {
			Failures int `xml:"failures,attr"`
			Cases    []struct {
				Name    string `xml:"name,attr"`
				Failure *struct {
					Message string `xml:"message,attr"`
					Text    string `xml:",chardata"`
				} `xml:"failure"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(b, &suites); err != nil {
		t.Fatalf("JUnit: %v", err)
	}
	failed := 0
	for _, s := range suites.Suites {
		for _, c := range s.Cases {
			if c.Failure == nil {
				continue
			}
			failed++
			if c.Name != "developers create a configmap" || !strings.Contains(c.Failure.Text, "validating-admission") || !strings.Contains(c.Failure.Text, "owner label") {
				t.Errorf("JUnit failure of %q does not name the layer and the reason:\n%s", c.Name, c.Failure.Text)
			}
		}
	}
	if failed != 1 {
		t.Errorf("JUnit has %d failures, want 1", failed)
	}

	// The cluster engine tests the cluster as it is: apply the platform.
	applyManifest(t, "apply", "-f", example+"/platform/team-a.yaml")
	out = run(0, "test", "run", "--engine", "cluster", "--kubeconfig", admin, "--apiserver-manifest", manifest, example+"/tests")
	if !strings.Contains(out, "8 passed, 0 failed, 0 errors") {
		t.Errorf("the example suite on the cluster engine:\n%s", out)
	}

	// Bad input: exit 2, naming the file, the line and the field.
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: kproxy.dev/v1alpha1\nkind: Test\ncases:\n- name: x\n  user: u\n  request: {path: /api}\n  expect: {stage: authz}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out = run(2, "test", "run", "--snapshot", snap, bad)
	if !strings.Contains(out, bad+":7: cases[0].expect.stage") {
		t.Errorf("a bad stage: %s", out)
	}
	out = run(2, "test", "run", filepath.Join(dir, "nothing"))
	if !strings.Contains(out, "nothing") {
		t.Errorf("a missing file: %s", out)
	}
	out = run(2, "test", "run", "--snapshot", filepath.Join(dir, "nosnap"), example+"/tests")
	if !strings.Contains(out, "kproxy snapshot -o") {
		t.Errorf("a missing snapshot does not say how to take one: %s", out)
	}
}
