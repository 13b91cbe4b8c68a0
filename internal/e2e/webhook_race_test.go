package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// TestWebhooksInParallel: two validating webhooks deny every ConfigMap
// created in a namespace. kube-apiserver calls them at once and reports
// the refusal that comes back first; kproxy's replay calls them again,
// in dry run. One webhook answers real calls at once and dry runs half a
// second late, the other the reverse, so the race goes one way for the
// apiserver's call of a real create and the other way for the replay's:
// the two report different webhooks (with one status, 403: on the old
// code the record predicted 403 with the other webhook's message). The
// record says unknown, naming both. A dry-run create is a dry run for
// both calls: the same webhook wins both races, and the prediction is
// the apiserver's answer.
func TestWebhooksInParallel(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	ns := lateNamespace(t, "webhook-race")
	// lateBy delays a webhook's answer to the calls dryRun says, then
	// denies.
	lateBy := func(dryRun bool, says string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			reviewAdmission(w, r, func(req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse) {
				if (req.DryRun != nil && *req.DryRun) == dryRun {
					time.Sleep(500 * time.Millisecond)
				}
				resp.Allowed = false
				resp.Result = &metav1.Status{Code: http.StatusForbidden, Message: says}
			})
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/first-for-real", lateBy(true, "real calls first"))
	mux.Handle("/first-for-dry-runs", lateBy(false, "dry runs first"))
	base, caPEM := serveWebhooks(t, "webhook-race", mux)
	none, fail, ten := admissionregistrationv1.SideEffectClassNone, admissionregistrationv1.Fail, int32(10)
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	for _, h := range []string{"first-for-real", "first-for-dry-runs"} {
		url := base + "/" + h
		vwc.Webhooks = append(vwc.Webhooks, admissionregistrationv1.ValidatingWebhook{
			Name: h + ".race.kproxy.test", ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
			}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
			FailurePolicy:     &fail, SideEffects: &none, TimeoutSeconds: &ten, AdmissionReviewVersions: []string{"v1"},
		})
	}
	ar := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	if _, err := ar.Create(ctx, vwc, createOpts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ar.Delete(context.Background(), vwc.Name, metav1.DeleteOptions{}) })
	untilWebhooksCalled(t, ns, "probe", "dry runs first")
	sendAs := configMapSender(t, ns)
	send := func(name, query string) *record.Record {
		t.Helper()
		return sendAs(name, query, http.StatusForbidden)
	}
	t.Run("real create: the races go different ways", func(t *testing.T) {
		rec := send("real", "")
		p := rec.Predicted
		if !strings.Contains(rec.Actual.Message, `"first-for-real.race.kproxy.test" denied the request: real calls first`) {
			t.Fatalf("the apiserver answered %q: its call of the real create did not go first to the webhook that answers real calls first", rec.Actual.Message)
		}
		for _, want := range []string{"cannot predict", `admission webhook "first-for-dry-runs.race.kproxy.test" refused kproxy's call (403`,
			`and admission webhook "first-for-real.race.kproxy.test" the apiserver's (403`, "reports the refusal that comes back first"} {
			if p.Stage != record.StageUnknown || !strings.Contains(p.Message, want) {
				t.Errorf("predicted %s %d %q, want unknown saying %q (the apiserver answered %d %q)", p.Stage, p.Status, p.Message, want, rec.Actual.Status, rec.Actual.Message)
			}
		}
	})
	t.Run("dry-run create: both races go one way", func(t *testing.T) {
		rec := send("dry", "?dryRun=All")
		p := rec.Predicted
		if p.Stage != record.StageValidatingAdmission || p.Status != rec.Actual.Status || p.Message != rec.Actual.Message {
			t.Errorf("predicted %s %d %q, the apiserver answered %d %q", p.Stage, p.Status, p.Message, rec.Actual.Status, rec.Actual.Message)
		}
	})
}
