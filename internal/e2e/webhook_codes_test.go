package e2e

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// TestWebhookRefusesWithStoreCodes: a validating webhook may refuse with
// any code, 404 and 409 too, which the store also answers ("no such
// object", "already exists"). Found by a probe: a webhook's 404 to an
// update of a ConfigMap that was always there said unknown, "the replay
// found the object: it was created after this request", and its 409 to
// a create or an apply of one that never was, "it was deleted after this
// request". Such a refusal says nothing of the object: each is predicted
// as answered, at validating-admission.
func TestWebhookRefusesWithStoreCodes(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	ns := lateNamespace(t, "webhook-codes")
	mux := http.NewServeMux()
	mux.HandleFunc("/code", func(w http.ResponseWriter, r *http.Request) {
		reviewAdmission(w, r, func(req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse) {
			// The ConfigMap's name says the code: code-404-..., code-409-...
			if f := strings.Split(req.Name, "-"); len(f) > 1 && f[0] == "code" {
				if code, err := strconv.Atoi(f[1]); err == nil && strings.Contains(string(req.Object.Raw), `"refuse":"yes"`) {
					resp.Allowed = false
					resp.Result = &metav1.Status{Code: int32(code), Message: "webhook code " + f[1]}
				}
			}
		})
	})
	base, caPEM := serveWebhooks(t, "webhook-codes", mux)
	url := base + "/code"
	none, fail, ten := admissionregistrationv1.SideEffectClassNone, admissionregistrationv1.Fail, int32(10)
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: ns}, Webhooks: []admissionregistrationv1.ValidatingWebhook{{
		Name: "code.codes.kproxy.test", ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
		}},
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
		FailurePolicy:     &fail, SideEffects: &none, TimeoutSeconds: &ten, AdmissionReviewVersions: []string{"v1"},
	}}}
	ar := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	if _, err := ar.Create(ctx, vwc, createOpts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ar.Delete(context.Background(), vwc.Name, metav1.DeleteOptions{}) })
	recs, r, c := oneReplayWorker(t)
	cms := "/api/v1/namespaces/" + ns + "/configmaps"
	// Until the apiserver calls the webhook.
	untilWebhooksCalledWith(t, cms, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"code-409-probe"},"data":{"refuse":"yes"}}`, "webhook code 409")
	send := func(t *testing.T, q request, want int) *record.Record {
		t.Helper()
		q.user = "admin"
		if got := do(t, c, r.base, q); got.status != want {
			t.Fatalf("%s %s: the apiserver answered %d, want %d: %s", q.method, q.path, got.status, want, got.body)
		}
		for {
			if rec := nextRecord(t, recs); rec.Request.Namespace == ns && rec.Request.Method == q.method {
				return rec
			}
		}
	}
	predicted := func(t *testing.T, rec *record.Record) {
		t.Helper()
		if p := rec.Predicted; p.Stage != record.StageValidatingAdmission || p.Status != rec.Actual.Status || p.Message != rec.Actual.Message {
			t.Errorf("predicted %s %d %q, the apiserver answered %d %q", p.Stage, p.Status, p.Message, rec.Actual.Status, rec.Actual.Message)
		}
	}
	send(t, request{method: "POST", path: cms, body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"code-404-there"}}`}, http.StatusCreated)
	t.Run("a 404 to a merge patch of an object that is there", func(t *testing.T) {
		predicted(t, send(t, request{method: "PATCH", path: cms + "/code-404-there", contentType: "application/merge-patch+json", body: `{"data":{"refuse":"yes"}}`}, http.StatusNotFound))
	})
	t.Run("a 404 to an update of an object that is there", func(t *testing.T) {
		predicted(t, send(t, request{method: "PUT", path: cms + "/code-404-there", body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"code-404-there"},"data":{"refuse":"yes"}}`}, http.StatusNotFound))
	})
	t.Run("a 409 to a create of an object that never was", func(t *testing.T) {
		predicted(t, send(t, request{method: "POST", path: cms, body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"code-409-new"},"data":{"refuse":"yes"}}`}, http.StatusConflict))
	})
	t.Run("a 409 to an apply that would create it", func(t *testing.T) {
		predicted(t, send(t, request{method: "PATCH", path: cms + "/code-409-applied?fieldManager=e2e", contentType: "application/apply-patch+yaml",
			body: "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: code-409-applied\ndata:\n  refuse: \"yes\"\n"}, http.StatusConflict))
	})
}
