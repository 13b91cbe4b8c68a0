package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/internal/record"
)

// TestPolicyOrder: two ValidatingAdmissionPolicies deny every ConfigMap
// created in a namespace, one with reason Forbidden (403), one Invalid
// (422). kube-apiserver reports the first denying policy in an order it
// draws again each time it reloads its policies, and so does the
// replay, independently: after each reload (a policy annotated), the two
// agree on the policy by chance. Where they do not, the record says
// unknown; where they do, the prediction is the apiserver's answer. Each
// try is a coin flip for the path under test: sixteen tries miss it once
// in 65,536 runs.
func TestPolicyOrder(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	ns := lateNamespace(t, "policy-order")
	fail := admissionregistrationv1.Fail
	for _, p := range []struct {
		name   string
		reason metav1.StatusReason
	}{{"forbids", metav1.StatusReasonForbidden}, {"invalidates", metav1.StatusReasonInvalid}} {
		name := ns + "-" + p.name
		reason := p.reason
		pol := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
				FailurePolicy: &fail,
				MatchConstraints: &admissionregistrationv1.MatchResources{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
					ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
						Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
					}}},
				},
				Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: name + " says no", Reason: &reason}},
			}}
		if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, pol, createOpts); err != nil {
			t.Fatal(err)
		}
		b := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: name,
				ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}}}
		if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, b, createOpts); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{})
			_ = cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{})
		})
	}
	recs, r, c := oneReplayWorker(t)
	mismatched, agreed := 0, 0
	for try := 1; try <= 16 && mismatched == 0; try++ {
		// A reload: both draw their order again.
		patch := fmt.Sprintf(`{"metadata":{"annotations":{"kproxy.test/try":"%d"}}}`, try)
		if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Patch(ctx, ns+"-forbids", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		// Past the 2 s in which a policy change makes an admission
		// verdict unknown (admission_late.go).
		time.Sleep(3 * time.Second)
		got := do(t, c, r.base, request{method: "POST", path: "/api/v1/namespaces/" + ns + "/configmaps", user: "admin",
			body: fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"try-%d"}}`, try)})
		if got.status != 403 && got.status != 422 {
			t.Fatalf("try %d: the apiserver answered %d, want 403 or 422: %s", try, got.status, got.body)
		}
		var rec *record.Record
		for rec = nextRecord(t, recs); rec.Request.Namespace != ns || rec.Request.Method != "POST"; rec = nextRecord(t, recs) {
		}
		p := rec.Predicted
		switch {
		case p.Stage == record.StageUnknown && strings.Contains(p.Message, "in an order it draws again each time it reloads its policies"):
			mismatched++
			t.Logf("try %d: %s", try, p.Message)
		case p.Stage == record.StageUnknown:
			t.Errorf("try %d: unknown for another reason: %s", try, p.Message)
		case p.Status != rec.Actual.Status || p.Message != rec.Actual.Message:
			t.Errorf("try %d: predicted %d %q, the apiserver answered %d %q: confidently wrong", try, p.Status, p.Message, rec.Actual.Status, rec.Actual.Message)
		default:
			agreed++
		}
	}
	if mismatched == 0 {
		t.Errorf("in 16 reloads, kproxy's replay and the apiserver always reported the same policy: the path under test was not taken")
	}
	t.Logf("%d tries agreed on the policy, then one did not", agreed)
}
