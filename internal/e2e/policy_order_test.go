package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/record"
)

// TestPolicyOrder: two admission policies refuse every ConfigMap
// created in a namespace: two ValidatingAdmissionPolicies that deny, one
// with reason Forbidden (403), one Invalid (422); two
// MutatingAdmissionPolicies whose mutations fail (both 403, each naming
// itself). kube-apiserver reports the first refusing policy in an order
// it draws again each time it reloads its policies, and so does the
// replay, independently: after each reload (a policy annotated), the two
// agree on the policy by chance. Where they do not, the record says
// unknown; where they do, the prediction is the apiserver's answer. The
// order of two policies is a walk over a Go map of two entries, which
// starts at one of eight slots: it comes out reversed one time in eight,
// so the two draw differently about one try in five (seen: 3 of 14; a
// clean-clone run drew alike 16 times in a row, which sixteen tries
// allowed about once in fifty runs). Sixty-four tries miss the path
// under test about once in seven million runs; the tries stop at the
// first that takes it, about the fifth.
func TestPolicyOrder(t *testing.T) {
	t.Run("validating", func(t *testing.T) {
		ns := lateNamespace(t, "policy-order")
		for _, p := range []struct {
			name   string
			reason metav1.StatusReason
		}{{"forbids", metav1.StatusReasonForbidden}, {"invalidates", metav1.StatusReasonInvalid}} {
			reason := p.reason
			createPolicy(t, &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + p.name},
				Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
					FailurePolicy:    ptr.To(admissionregistrationv1.Fail),
					MatchConstraints: configMapCreatesIn(ns),
					Validations:      []admissionregistrationv1.Validation{{Expression: "false", Message: ns + "-" + p.name + " says no", Reason: &reason}},
				}})
		}
		policyCoinFlips(t, ns, "validatingadmissionpolicies", []int{403, 422})
	})
	t.Run("mutating", func(t *testing.T) {
		ns := lateNamespace(t, "map-order")
		for _, name := range []string{"forbids", "invalidates"} {
			// An expression in error: no ConfigMap created here has the label.
			createPolicy(t, &admissionregistrationv1.MutatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name},
				Spec: admissionregistrationv1.MutatingAdmissionPolicySpec{
					FailurePolicy:      ptr.To(admissionregistrationv1.Fail),
					ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
					MatchConstraints:   configMapCreatesIn(ns),
					Mutations: []admissionregistrationv1.Mutation{{PatchType: admissionregistrationv1.PatchTypeJSONPatch,
						JSONPatch: &admissionregistrationv1.JSONPatch{Expression: fmt.Sprintf(`[JSONPatch{op: "add", path: "/metadata/annotations", value: {"x": object.metadata.labels["%s"]}}]`, name)}}},
				}})
		}
		policyCoinFlips(t, ns, "mutatingadmissionpolicies", []int{403})
	})
}

// configMapCreatesIn matches the creates of ConfigMaps in ns.
func configMapCreatesIn(ns string) *admissionregistrationv1.MatchResources {
	return &admissionregistrationv1.MatchResources{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
		ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
		}}},
	}
}

// createPolicy creates a ValidatingAdmissionPolicy or a
// MutatingAdmissionPolicy and its binding of the same name (no params),
// removed when the test ends.
func createPolicy(t *testing.T, policy any) {
	t.Helper()
	ctx := context.Background()
	ar := adminClient().AdmissionregistrationV1()
	var err error
	switch p := policy.(type) {
	case *admissionregistrationv1.ValidatingAdmissionPolicy:
		name := p.Name
		if _, err = ar.ValidatingAdmissionPolicies().Create(ctx, p, createOpts); err == nil {
			_, err = ar.ValidatingAdmissionPolicyBindings().Create(ctx, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: name,
					ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}}}, createOpts)
		}
		t.Cleanup(func() {
			_ = ar.ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{})
			_ = ar.ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{})
		})
	case *admissionregistrationv1.MutatingAdmissionPolicy:
		name := p.Name
		if _, err = ar.MutatingAdmissionPolicies().Create(ctx, p, createOpts); err == nil {
			_, err = ar.MutatingAdmissionPolicyBindings().Create(ctx, &admissionregistrationv1.MutatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{PolicyName: name}}, createOpts)
		}
		t.Cleanup(func() {
			_ = ar.MutatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{})
			_ = ar.MutatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{})
		})
	default:
		t.Fatalf("createPolicy: %T is not an admission policy", policy)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// policyCoinFlips creates ConfigMaps in ns through a kproxy, each after a
// reload of the policies (the first, ns-forbids, of resource annotated),
// until a record says the replay and the apiserver reported different
// policies (coinFlips).
func policyCoinFlips(t *testing.T, ns, resource string, statuses []int) {
	t.Helper()
	ctx := context.Background()
	recs, r, c := oneReplayWorker(t)
	coinFlips(t, 64, "in an order it draws again each time it reloads its policies", func(try int) *record.Record {
		// A reload: both draw their order again.
		patch := fmt.Sprintf(`{"metadata":{"annotations":{"kproxy.test/try":"%d"}}}`, try)
		if err := adminClient().AdmissionregistrationV1().RESTClient().Patch(types.MergePatchType).Resource(resource).Name(ns + "-forbids").
			Body([]byte(patch)).Do(ctx).Error(); err != nil {
			t.Fatal(err)
		}
		// Past the 2 s in which a policy change makes an admission
		// verdict unknown (admission_late.go).
		time.Sleep(3 * time.Second)
		return sendForRecord(t, recs, r, c, ns, statuses, request{method: "POST", path: "/api/v1/namespaces/" + ns + "/configmaps", user: "admin",
			body: fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"try-%d"}}`, try)})
	})
}

// coinFlips runs up to tries tries of a request whose answer hangs on a
// draw the apiserver and kproxy's replay each make (try sends the n-th
// and returns its record), until one record says unknown for that draw
// (its message containing drawn). Every other record must be the
// apiserver's answer, status and message, or an honest unknown for
// another reason (logged). Where the two draw differently with
// probability p, n tries all miss the path under test with probability
// (1-p)^n: tries is chosen for that to be negligible.
func coinFlips(t *testing.T, tries int, drawn string, try func(n int) *record.Record) {
	t.Helper()
	mismatched, agreed := 0, 0
	for n := 1; n <= tries && mismatched == 0; n++ {
		rec := try(n)
		p := rec.Predicted
		switch {
		case p.Stage == record.StageUnknown && strings.Contains(p.Message, drawn):
			mismatched++
			t.Logf("try %d: the apiserver answered %d; %s", n, rec.Actual.Status, p.Message)
		case p.Stage == record.StageUnknown:
			// Honest, if not the path under test (state seen changing
			// around the arrival).
			t.Logf("try %d: unknown for another reason: %s", n, p.Message)
		case p.Status != rec.Actual.Status || (p.Status >= 400 && p.Message != rec.Actual.Message):
			t.Errorf("try %d: predicted %d %q, the apiserver answered %d %q: confidently wrong", n, p.Status, p.Message, rec.Actual.Status, rec.Actual.Message)
		default:
			agreed++
		}
	}
	if mismatched == 0 {
		t.Errorf("in %d tries, kproxy's replay and the apiserver always drew alike: the path under test was not taken", tries)
	}
	t.Logf("%d tries agreed, then one did not", agreed)
}

// sendForRecord sends req through a kproxy (route r, client c), checks
// the apiserver answered one of statuses, and returns the request's
// record: the next of req's method in ns.
func sendForRecord(t *testing.T, recs <-chan *record.Record, r route, c *http.Client, ns string, statuses []int, req request) *record.Record {
	t.Helper()
	got := do(t, c, r.base, req)
	if !slices.Contains(statuses, got.status) {
		t.Fatalf("%s %s: the apiserver answered %d, want one of %v: %s", req.method, req.path, got.status, statuses, got.body)
	}
	rec := nextRecord(t, recs)
	for rec.Request.Namespace != ns || rec.Request.Method != req.method {
		rec = nextRecord(t, recs)
	}
	return rec
}
