package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/record"
)

// TestMutatingWebhookPatchesDryRunOtherwise: a mutating webhook whose
// patch depends on dryRun in its AdmissionReview (found by a probe:
// kproxy's replay calls webhooks again, in dry run). It labels a
// ConfigMap m=-bad- (a value validation refuses) on the calls its name
// says, m=good on the others. A real create it spoils only in dry run is
// admitted by the apiserver (201) and had been predicted 422 at
// validation; one it spoils only for real is refused (422) and had been
// predicted 201: both confidently wrong, every time. Each now says
// unknown, naming the webhook and what it did to kproxy's call. A dry-run
// create is a dry run for both calls: predicted as answered; so is a
// create the webhook labels alike both ways.
//
// A LimitRange it labels m=bad in dry run only, which a
// ValidatingAdmissionPolicy refuses: admitted by the apiserver, refused
// by the replay. The replay's check of admission state seen changing
// after the request arrived found the request's own LimitRange, created
// by then, and blamed it (found by a probe: 4 of 9), though no LimitRange
// moves a policy's verdict on a LimitRange; it names the webhook now.
func TestMutatingWebhookPatchesDryRunOtherwise(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	ns := lateNamespace(t, "webhook-patch")
	mux := http.NewServeMux()
	mux.HandleFunc("/label", func(w http.ResponseWriter, r *http.Request) {
		reviewAdmission(w, r, func(req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse) {
			dry := req.DryRun != nil && *req.DryRun
			patch := admissionv1.PatchTypeJSONPatch
			// Patches the apiserver's code cannot apply (a JSON-patch
			// test that fails; any patch of a DELETE), or a rename to
			// an object that exists, sent to one of the two calls.
			spoil := func(prefix string) bool {
				return (strings.HasPrefix(req.Name, prefix+"-in-dry-run") && dry) || (strings.HasPrefix(req.Name, prefix+"-for-real") && !dry)
			}
			switch {
			case req.Operation == admissionv1.Delete:
				if spoil("delete-patched") {
					resp.Patch, resp.PatchType = []byte(`[{"op":"add","path":"/metadata/labels","value":{"m":"x"}}]`), &patch
				}
				return
			case spoil("failtest"):
				resp.Patch, resp.PatchType = []byte(`[{"op":"test","path":"/metadata/name","value":"nope"}]`), &patch
				return
			case spoil("renamed"):
				resp.Patch, resp.PatchType = []byte(`[{"op":"replace","path":"/metadata/name","value":"existing"}]`), &patch
				return
			}
			value := "good"
			if (strings.HasPrefix(req.Name, "spoiled-in-dry-run") && dry) || (strings.HasPrefix(req.Name, "spoiled-for-real") && !dry) {
				value = "-bad-"
				if req.Kind.Kind == "LimitRange" {
					value = "bad" // a valid label the policy refuses
				}
			}
			resp.Patch = []byte(fmt.Sprintf(`[{"op":"add","path":"/metadata/labels","value":{"m":%q}}]`, value))
			resp.PatchType = &patch
		})
	})
	base, caPEM := serveWebhooks(t, "webhook-patch", mux)
	url := base + "/label"
	none, fail, ten := admissionregistrationv1.SideEffectClassNone, admissionregistrationv1.Fail, int32(10)
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: ns}, Webhooks: []admissionregistrationv1.MutatingWebhook{{
		Name: "label.patch.kproxy.test", ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Delete},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps", "limitranges"}},
		}},
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
		FailurePolicy:     &fail, SideEffects: &none, TimeoutSeconds: &ten, AdmissionReviewVersions: []string{"v1"},
	}}}
	ar := cs.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := ar.Create(ctx, mwc, createOpts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ar.Delete(context.Background(), mwc.Name, metav1.DeleteOptions{}) })
	reason := metav1.StatusReasonInvalid
	createPolicy(t, &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: ns},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"limitranges"}},
				}}},
			},
			Validations: []admissionregistrationv1.Validation{{Expression: `object.metadata.?labels[?"m"].orValue("") != "bad"`, Message: "no bad LimitRange", Reason: &reason}},
		}})
	untilWebhooksCalled(t, ns, "spoiled-in-dry-run-probe", "-bad-")
	untilCalled(t, ns, "limitranges", "LimitRange", "spoiled-in-dry-run-probe", "no bad LimitRange")
	sendObject, deleteObject := objectSenders(t, ns)
	send := func(name, query string, want int) *record.Record {
		t.Helper()
		return sendObject("configmaps", "ConfigMap", name, query, want)
	}
	unknown := func(t *testing.T, rec *record.Record, wants ...string) {
		t.Helper()
		p := rec.Predicted
		for _, want := range append([]string{"cannot predict: mutating-admission: ", "a mutating webhook's answer is its own"}, wants...) {
			if p.Stage != record.StageUnknown || !strings.Contains(p.Message, want) {
				t.Errorf("predicted %s %d %q, want unknown saying %q (the apiserver answered %d %q)", p.Stage, p.Status, p.Message, want, rec.Actual.Status, rec.Actual.Message)
			}
		}
	}
	t.Run("spoiled in dry run only: admitted, was predicted 422", func(t *testing.T) {
		rec := send("spoiled-in-dry-run", "", http.StatusCreated)
		unknown(t, rec, "the apiserver admitted the write (201), and the replay refuses it at validation (422",
			`mutating webhook "label.patch.kproxy.test" (patched it)`)
	})
	t.Run("spoiled for real only: refused, was predicted 201", func(t *testing.T) {
		rec := send("spoiled-for-real", "", http.StatusUnprocessableEntity)
		unknown(t, rec, "the apiserver refused the write (422", "and the replay admits it after mutating webhook \"label.patch.kproxy.test\" (patched it)")
	})
	t.Run("a dry run both ways: predicted", func(t *testing.T) {
		rec := send("spoiled-in-dry-run-2", "?dryRun=All", http.StatusUnprocessableEntity)
		if p := rec.Predicted; p.Stage != record.StageValidation || p.Status != rec.Actual.Status || p.Message != rec.Actual.Message {
			t.Errorf("predicted %s %d %q, the apiserver answered %d %q", p.Stage, p.Status, p.Message, rec.Actual.Status, rec.Actual.Message)
		}
	})
	t.Run("a LimitRange spoiled in dry run, refused by a policy: names the webhook, not the LimitRange it created", func(t *testing.T) {
		rec := sendObject("limitranges", "LimitRange", "spoiled-in-dry-run-lr", "", http.StatusCreated)
		unknown(t, rec, "no bad LimitRange", `mutating webhook "label.patch.kproxy.test" (patched it)`)
		if strings.Contains(rec.Predicted.Message, "LimitRanges change") {
			t.Errorf("the unknown blames the request's own LimitRange: %q", rec.Predicted.Message)
		}
	})
	// Patches that fail, or rename the object, in one call only: each had
	// been predicted the other call's answer (found by a probe: 69
	// records, every time).
	t.Run("a patch that fails in dry run only: admitted, was predicted 500", func(t *testing.T) {
		rec := send("failtest-in-dry-run", "", http.StatusCreated)
		unknown(t, rec, "the replay refuses it at mutating-admission (500", `mutating webhook "label.patch.kproxy.test" (its patch could not be applied)`)
	})
	t.Run("a patch that fails for real only: failed 500, was said a failure of the moment", func(t *testing.T) {
		rec := send("failtest-for-real", "", http.StatusInternalServerError)
		unknown(t, rec, "the apiserver failed the write (500", "a mutating webhook's patch the apiserver's code could not apply")
	})
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "existing"}}, createOpts); err != nil {
		t.Fatal(err)
	}
	t.Run("renamed to an existing object in dry run only: admitted, was predicted 409", func(t *testing.T) {
		rec := send("renamed-in-dry-run", "", http.StatusCreated)
		unknown(t, rec, `the replay refuses it at storage (409: configmaps "existing" already exists)`)
	})
	t.Run("renamed to an existing object for real only: refused 409, was said deleted in between", func(t *testing.T) {
		rec := send("renamed-for-real", "", http.StatusConflict)
		unknown(t, rec, `the apiserver refused the write (409: configmaps "existing" already exists), and the replay admits it`)
	})
	t.Run("a DELETE patched in dry run only: deleted, was predicted 500", func(t *testing.T) {
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "delete-patched-in-dry-run"}}, createOpts); err != nil {
			t.Fatal(err)
		}
		rec := deleteObject("configmaps", "delete-patched-in-dry-run", http.StatusOK)
		unknown(t, rec, "the replay refuses it at mutating-admission (500", "attempted to modify the object", "(its patch could not be applied)")
	})
	t.Run("labelled alike both ways: predicted", func(t *testing.T) {
		rec := send("plain", "", http.StatusCreated)
		if p := rec.Predicted; p.Stage != "" || p.Status != http.StatusCreated {
			t.Errorf("predicted %q %d %q, the apiserver answered %d", p.Stage, p.Status, p.Message, rec.Actual.Status)
		}
	})
}
