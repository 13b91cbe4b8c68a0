package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const paramsPlatform = `apiVersion: v1
kind: Namespace
metadata: {name: params-offline, labels: {kproxy-test: params-offline}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: limits, namespace: params-offline}
data: {max: "2"}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: params-offline-max}
spec:
  failurePolicy: Ignore # its params synced: evaluated, not skipped
  paramKind: {apiVersion: v1, kind: ConfigMap}
  matchConstraints:
    namespaceSelector: {matchLabels: {kproxy-test: params-offline}}
    resourceRules:
    - {apiGroups: [apps], apiVersions: [v1], operations: [CREATE], resources: [deployments]}
  validations:
  - expression: object.spec.replicas <= int(params.data.max)
    message: too many replicas for params-offline
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: params-offline-max}
spec:
  policyName: params-offline-max
  validationActions: [Deny]
  paramRef: {name: limits, namespace: params-offline, parameterNotFoundAction: Deny}
`

// A proposed policy whose params are PodTemplates: a kind the replay does
// not list, so the snapshot holds none of them.
const paramsProposed = `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: params-offline-templates}
spec:
  failurePolicy: Fail
  paramKind: {apiVersion: v1, kind: PodTemplate}
  matchConstraints:
    namespaceSelector: {matchLabels: {kproxy-test: params-offline}}
    resourceRules:
    - {apiGroups: [apps], apiVersions: [v1], operations: [CREATE], resources: [deployments]}
  validations:
  - expression: "true"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: params-offline-templates}
spec:
  policyName: params-offline-templates
  validationActions: [Deny]
  paramRef: {name: tmpl, namespace: params-offline, parameterNotFoundAction: Deny}
`

// The same with failurePolicy Ignore, denying what it selects: the
// plugin skips it, saying nothing.
var paramsProposedIgnore = strings.NewReplacer("failurePolicy: Fail", "failurePolicy: Ignore", `expression: "true"`, `expression: "false"`).Replace(paramsProposed)

const paramsCases = `apiVersion: kproxy.dev/v1alpha1
kind: Test
metadata: {name: params-offline}
cases:
- name: one replica is within the params
  user: admin
  groups: [system:masters]
  request:
    method: POST
    path: /apis/apps/v1/namespaces/params-offline/deployments
    body: {apiVersion: apps/v1, kind: Deployment, metadata: {name: one}, spec: {replicas: 1, selector: {matchLabels: {app: p}}, template: {metadata: {labels: {app: p}}, spec: {containers: [{name: c, image: nginx}]}}}}
  expect: {status: 201}
- name: three replicas are past the params
  user: admin
  groups: [system:masters]
  request:
    method: POST
    path: /apis/apps/v1/namespaces/params-offline/deployments
    body: {apiVersion: apps/v1, kind: Deployment, metadata: {name: three}, spec: {replicas: 3, selector: {matchLabels: {app: p}}, template: {metadata: {labels: {app: p}}, spec: {containers: [{name: c, image: nginx}]}}}}
  expect: {status: 422, stage: validating-admission, message: too many replicas for params-offline}
`

// TestPolicyParamsOffline: an admission policy whose params are
// ConfigMaps, on the local engine. The snapshot holds every ConfigMap,
// since a policy reads its params whole (before, it held only the ones the
// cases named, the policy plugin's informer never synced, and the replay
// refused every matching write "not yet synced": a confident wrong
// prediction). A proposed policy whose params the snapshot does not hold
// makes the cases unknown, saying why, not refused (failurePolicy Fail)
// or admitted (Ignore: the plugin skips it silently). The cluster engine
// agrees with the real apiserver on both cases.
func TestPolicyParamsOffline(t *testing.T) {
	dir := t.TempDir()
	bin, manifest := kproxyBinary(t, dir)
	upstream, admin := cliKubeconfigs(t, dir)
	write := func(name, content string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	platform := write("platform.yaml", paramsPlatform)
	tests := write("tests/params.yaml", paramsCases)
	proposed := write("proposed/templates.yaml", paramsProposed)
	proposedIgnore := write("proposed-ignore/templates.yaml", paramsProposedIgnore)
	applyManifest(t, "apply", "-f", platform)
	t.Cleanup(func() {
		applyManifest(t, "delete", "--ignore-not-found", "validatingadmissionpolicybinding/params-offline-max", "validatingadmissionpolicy/params-offline-max")
	})
	run := func(wantExit int, args ...string) string {
		t.Helper()
		return runCLI(t, bin, wantExit, args...)
	}
	snap := filepath.Join(dir, "snapshot")
	out := run(0, "snapshot", "-o", snap, "--kubeconfig", upstream, "--apiserver-manifest", manifest, "--for", tests)
	if !strings.Contains(out, "collected ") || !strings.Contains(out, " configmaps (v1)") {
		t.Errorf("the snapshot does not say it collected the ConfigMaps whole:\n%s", out)
	}
	out = run(0, "test", "run", "--snapshot", snap, tests)
	if !strings.Contains(out, "2 passed, 0 failed, 0 errors") {
		t.Errorf("the policy's params on the local engine:\n%s", out)
	}

	// The three replicas: the platform's policy refuses them whichever
	// way the other goes, and the plugin reports the first denial of the
	// policies in an order of its own; the refusal stands, or says unknown.
	out = run(1, "test", "run", "--snapshot", snap, "--overlay", filepath.Dir(proposed), tests)
	for _, want := range []string{
		"FAIL     one replica is within the params",
		"an admission policy's params (PodTemplate v1) had not synced in kproxy's replay",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("with a proposed policy whose params the snapshot does not hold, the report does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "not yet synced to use for admission") {
		t.Errorf("a policy whose params kproxy could not read was predicted to refuse:\n%s", out)
	}

	// Ignore: the replay's plugin skips the policy; the admission it then
	// predicts is not the request's. The refusal by the other policy stands.
	out = run(1, "test", "run", "--snapshot", snap, "--overlay", filepath.Dir(proposedIgnore), tests)
	for _, want := range []string{
		`FAIL     one replica is within the params`,
		`ValidatingAdmissionPolicy "params-offline-templates" (failurePolicy Ignore) selects this write and takes its params from PodTemplate v1, which had not synced in kproxy's replay`,
		"PASS     three replicas are past the params",
		"1 passed, 1 failed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("with a proposed Ignore policy whose params the snapshot does not hold, the report does not say %q:\n%s", want, out)
		}
	}

	// The real apiserver, through the cluster engine: the apiserver
	// loads a new policy within a second or so, and kproxy's replay says
	// unknown for a policy loaded since the request arrived; a few tries.
	for try := 1; ; try++ {
		cmd := exec.Command(bin, "test", "run", "--engine", "cluster", "--kubeconfig", admin, "--apiserver-manifest", manifest, tests)
		b, err := cmd.CombinedOutput()
		if err == nil && strings.Contains(string(b), "2 passed, 0 failed, 0 errors") {
			break
		}
		if try == 5 {
			t.Fatalf("the cluster engine (%v):\n%s", err, b)
		}
		t.Logf("try %d of the cluster engine: %v\n%s", try, err, b)
		time.Sleep(2 * time.Second)
	}
}
