package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// TestPolicyParamKindServedLater: a ValidatingAdmissionPolicy whose
// params are a custom resource created after the policy. kube-apiserver's
// policy plugin maps the paramKind through a discovery REST mapper that
// it resets every 30 s; the replay's was never reset (the post-start hook
// that does it does not run in kproxy), so the replay refused every write
// the policy selects, "failed to find resource referenced by paramKind",
// minutes after the apiserver had found the kind and admitted them (probe
// E, 2026-12-06: 12 records confidently wrong). Before the CRD both
// refuse; within the apiserver's 30 s of the CRD's arrival the record
// is right or says why it cannot know; past it, the prediction is the
// apiserver's answer, admitted and denied by the params.
func TestPolicyParamKindServedLater(t *testing.T) {
	ctx := context.Background()
	ns := lateNamespace(t, "paramkind-later")
	group := ns + ".kproxy.test"
	recs, r, c := oneReplayWorker(t)

	policy := fmt.Sprintf(`apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: %[1]s}
spec:
  failurePolicy: Fail
  paramKind: {apiVersion: %[2]s/v1, kind: Dial}
  matchConstraints:
    namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: %[1]s}}
    resourceRules:
    - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}
  validations:
  - expression: "!has(object.data) || size(object.data) <= params.spec.max"
    message: more keys than the dial allows
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: %[1]s}
spec:
  policyName: %[1]s
  validationActions: [Deny]
  paramRef: {name: limits, namespace: %[1]s, parameterNotFoundAction: Deny}
`, ns, group)
	crd := fmt.Sprintf(`apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: dials.%[1]s}
spec:
  group: %[1]s
  scope: Namespaced
  names: {plural: dials, singular: dial, kind: Dial}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {max: {type: integer}}}
`, group)
	dial := fmt.Sprintf("apiVersion: %s/v1\nkind: Dial\nmetadata: {name: limits, namespace: %s}\nspec: {max: 1}\n", group, ns)
	dir := t.TempDir()
	file := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	policyFile, crdFile, dialFile := file("policy.yaml", policy), file("crd.yaml", crd), file("dial.yaml", dial)
	t.Cleanup(func() {
		applyManifest(t, "delete", "--ignore-not-found", "-f", policyFile)
		applyManifest(t, "delete", "--ignore-not-found", "--wait=false", "-f", crdFile)
	})
	applyManifest(t, "apply", "-f", policyFile)
	time.Sleep(3 * time.Second) // past the 2 s a policy change makes a verdict unknown (admission_late.go)

	n := 0
	create := func(keys int, statuses ...int) *record.Record {
		n++
		data := map[int]string{1: `,"data":{"a":"1"}`, 2: `,"data":{"a":"1","b":"2"}`}[keys]
		return sendForRecord(t, recs, r, c, ns, statuses, request{method: "POST", path: "/api/v1/namespaces/" + ns + "/configmaps", user: "admin",
			body: fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c%d"}%s}`, n, data)})
	}
	notWrong := func(when string, rec *record.Record) {
		t.Helper()
		p := rec.Predicted
		switch {
		case p.Stage == record.StageUnknown:
			t.Logf("%s: the apiserver answered %d; unknown: %s", when, rec.Actual.Status, p.Message)
		case p.Status != rec.Actual.Status:
			t.Errorf("%s: predicted %d %q, the apiserver answered %d %q: confidently wrong", when, p.Status, p.Message, rec.Actual.Status, rec.Actual.Message)
		default:
			t.Logf("%s: predicted %d as answered", when, p.Status)
		}
	}

	// No such kind yet: the policy cannot be configured, in both.
	notWrong("before the CRD", create(1, 403, 422, 500))

	applyManifest(t, "apply", "-f", crdFile)
	applyManifest(t, "wait", "--for=condition=Established", "--timeout=60s", "crd/dials."+group)
	applyManifest(t, "apply", "-f", dialFile)
	notWrong("just after the CRD", create(1, 201, 403, 422, 500))

	// Past the apiserver's 30 s (and kproxy's allowance for it) after the
	// CRD last changed, both map the kind.
	ext, err := apiextensionsclient.NewForConfig(cluster.UserConfig("admin"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, "dials."+group, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	last := got.CreationTimestamp.Time
	for _, c := range got.Status.Conditions {
		if c.LastTransitionTime.After(last) {
			last = c.LastTransitionTime.Time
		}
	}
	time.Sleep(time.Until(last.Add(42 * time.Second)))
	for _, tc := range []struct {
		keys   int
		status int
	}{{1, 201}, {2, 422}} {
		rec := create(tc.keys, tc.status)
		p := rec.Predicted
		if p.Stage == record.StageUnknown || p.Status != rec.Actual.Status || p.Message != rec.Actual.Message {
			t.Errorf("%d keys, past the apiserver's 30 s: predicted %d %q (stage %s), the apiserver answered %d %q",
				tc.keys, p.Status, p.Message, p.Stage, rec.Actual.Status, rec.Actual.Message)
		}
		if tc.status == 422 && !strings.Contains(rec.Actual.Message, "more keys than the dial allows") {
			t.Errorf("the refusal is not the policy's: %s", rec.Actual.Message)
		}
	}
}
