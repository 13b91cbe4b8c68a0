package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/pki"
	"github.com/kproxy/kproxy/internal/record"
)

// webhookNS is where the corpus's admission webhooks apply: each webhook
// also selects objects by their "wh" label, so a case picks its webhook.
const webhookNS = "adm-webhook"

// startAdmissionWebhooks serves the corpus's admission webhooks over TLS
// and registers them with the apiserver: allow, deny, warn, mutate, a
// patch that breaks the object, slow past its timeout, unreachable, side
// effects, a CEL match condition, a missing service, and two that answer a
// dry run otherwise than a real call, with failurePolicy Fail and Ignore. The configurations are removed when the test ends.
func startAdmissionWebhooks(t *testing.T) {
	t.Helper()
	mux := http.NewServeMux()
	review := reviewAdmission
	mux.HandleFunc("/allow", func(w http.ResponseWriter, r *http.Request) {
		review(w, r, func(*admissionv1.AdmissionRequest, *admissionv1.AdmissionResponse) {})
	})
	mux.HandleFunc("/deny", func(w http.ResponseWriter, r *http.Request) {
		review(w, r, func(_ *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse) {
			resp.Allowed = false
			resp.Result = &metav1.Status{Code: http.StatusForbidden, Message: "the corpus webhook says no"}
		})
	})
	mux.HandleFunc("/warn", func(w http.ResponseWriter, r *http.Request) {
		review(w, r, func(_ *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse) {
			resp.Warnings = []string{"the corpus webhook has a warning"}
		})
	})
	jsonPatch := admissionv1.PatchTypeJSONPatch
	mux.HandleFunc("/mutate", func(w http.ResponseWriter, r *http.Request) {
		review(w, r, func(_ *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse) {
			resp.PatchType, resp.Patch = &jsonPatch, []byte(`[{"op":"add","path":"/metadata/labels/mutated","value":"yes"}]`)
		})
	})
	mux.HandleFunc("/badpatch", func(w http.ResponseWriter, r *http.Request) {
		review(w, r, func(_ *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse) {
			resp.PatchType, resp.Patch = &jsonPatch, []byte(`[{"op":"add","path":"/data","value":{"bad key":"x"}}]`)
		})
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(3 * time.Second):
		case <-r.Context().Done():
			return
		}
		review(w, r, func(*admissionv1.AdmissionRequest, *admissionv1.AdmissionResponse) {})
	})
	// Webhooks whose answer depends on whether the call is a dry run:
	// kproxy calls webhooks only in dry run, so it cannot hear the answer
	// the apiserver's call to them got (webhook_answers.go).
	mux.HandleFunc("/deny-dry-run", func(w http.ResponseWriter, r *http.Request) {
		review(w, r, func(req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse) {
			if req.DryRun != nil && *req.DryRun {
				resp.Allowed = false
				resp.Result = &metav1.Status{Code: http.StatusBadRequest, Message: "this webhook refuses dry runs"}
			}
		})
	})
	mux.HandleFunc("/deny-real", func(w http.ResponseWriter, r *http.Request) {
		review(w, r, func(req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse) {
			if req.DryRun == nil || !*req.DryRun {
				resp.Allowed = false
				resp.Result = &metav1.Status{Code: http.StatusForbidden, Message: "this webhook admits only dry runs"}
			}
		})
	})
	base, caPEM := serveWebhooks(t, "e2e-webhook", mux)
	// An address nothing listens on: the "unreachable" webhooks.
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "https://" + dead.Addr().String() + "/allow"
	dead.Close()

	// admissionregistration/v1 allows only None and NoneOnDryRun.
	none, onDryRun := admissionregistrationv1.SideEffectClassNone, admissionregistrationv1.SideEffectClassNoneOnDryRun
	fail, ignore := admissionregistrationv1.Fail, admissionregistrationv1.Ignore
	one, two, ten := int32(1), int32(2), int32(10)
	rules := []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
	}}
	nsSel := &metav1.LabelSelector{MatchLabels: map[string]string{"adm-webhook": "on"}}
	type hook struct {
		name, label, url string
		service          string // a Service in webhookNS

		side       *admissionregistrationv1.SideEffectClass
		policy     *admissionregistrationv1.FailurePolicyType
		timeout    *int32
		conditions []admissionregistrationv1.MatchCondition
	}
	clientConfig := func(h hook) admissionregistrationv1.WebhookClientConfig {
		if h.service != "" {
			path := "/allow"
			return admissionregistrationv1.WebhookClientConfig{CABundle: caPEM,
				Service: &admissionregistrationv1.ServiceReference{Namespace: webhookNS, Name: h.service, Path: &path}}
		}
		return admissionregistrationv1.WebhookClientConfig{CABundle: caPEM, URL: &h.url}
	}
	validating := []hook{
		{name: "allow", label: "allow", url: base + "/allow", side: &none, policy: &fail, timeout: &ten},
		{name: "deny", label: "deny", url: base + "/deny", side: &none, policy: &fail, timeout: &ten},
		{name: "warn", label: "warn", url: base + "/warn", side: &none, policy: &fail, timeout: &ten},
		{name: "slow-fail", label: "slow-fail", url: base + "/slow", side: &none, policy: &fail, timeout: &one},
		{name: "slow-ignore", label: "slow-ignore", url: base + "/slow", side: &none, policy: &ignore, timeout: &one},
		{name: "down-fail", label: "down-fail", url: deadURL, side: &none, policy: &fail, timeout: &ten},
		{name: "down-ignore", label: "down-ignore", url: deadURL, side: &none, policy: &ignore, timeout: &ten},
		{name: "side-effects", label: "side-effects", url: base + "/allow", side: &onDryRun, policy: &fail, timeout: &ten},
		{name: "svc-missing", label: "svc-missing", service: "no-such-service", side: &none, policy: &fail, timeout: &ten},
		// A Service kproxy cannot dial (an ExternalName nothing resolves):
		// what a webhook inside a real cluster looks like from outside it.
		{name: "svc-exists", label: "svc-exists", service: "webhook-svc", side: &none, policy: &fail, timeout: &two},
		{name: "deny-dry-run", label: "deny-dry-run", url: base + "/deny-dry-run", side: &none, policy: &fail, timeout: &ten},
		{name: "deny-real", label: "deny-real", url: base + "/deny-real", side: &none, policy: &fail, timeout: &ten},
		{name: "matchcond", label: "matchcond", url: base + "/deny", side: &none, policy: &fail, timeout: &ten,
			conditions: []admissionregistrationv1.MatchCondition{{Name: "not-skipped",
				Expression: "!('skip' in object.metadata.?annotations.orValue({}))"}}},
	}
	mutating := []hook{
		{name: "mutate", label: "mutate", url: base + "/mutate", side: &none, policy: &fail, timeout: &ten},
		{name: "mdeny", label: "mdeny", url: base + "/deny", side: &none, policy: &fail, timeout: &ten},
		{name: "badpatch", label: "badpatch", url: base + "/badpatch", side: &none, policy: &fail, timeout: &ten},
		{name: "mdown-ignore", label: "mdown-ignore", url: deadURL, side: &none, policy: &ignore, timeout: &ten},
	}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kproxy-corpus"}}
	for _, h := range validating {
		vwc.Webhooks = append(vwc.Webhooks, admissionregistrationv1.ValidatingWebhook{
			Name: h.name + ".corpus.kproxy.test", ClientConfig: clientConfig(h), Rules: rules,
			FailurePolicy: h.policy, SideEffects: h.side, TimeoutSeconds: h.timeout, AdmissionReviewVersions: []string{"v1"},
			NamespaceSelector: nsSel, ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"wh": h.label}},
			MatchConditions: h.conditions,
		})
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kproxy-corpus"}}
	for _, h := range mutating {
		mwc.Webhooks = append(mwc.Webhooks, admissionregistrationv1.MutatingWebhook{
			Name: h.name + ".corpus.kproxy.test", ClientConfig: clientConfig(h), Rules: rules,
			FailurePolicy: h.policy, SideEffects: h.side, TimeoutSeconds: h.timeout, AdmissionReviewVersions: []string{"v1"},
			NamespaceSelector: nsSel, ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"wh": h.label}},
		})
	}
	ctx := context.Background()
	ar := adminClient().AdmissionregistrationV1()
	_ = ar.ValidatingWebhookConfigurations().Delete(ctx, vwc.Name, metav1.DeleteOptions{})
	_ = ar.MutatingWebhookConfigurations().Delete(ctx, mwc.Name, metav1.DeleteOptions{})
	if _, err := ar.ValidatingWebhookConfigurations().Create(ctx, vwc, createOpts); err != nil {
		t.Fatal(err)
	}
	if _, err := ar.MutatingWebhookConfigurations().Create(ctx, mwc, createOpts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = ar.ValidatingWebhookConfigurations().Delete(ctx, vwc.Name, metav1.DeleteOptions{})
		_ = ar.MutatingWebhookConfigurations().Delete(ctx, mwc.Name, metav1.DeleteOptions{})
	})
}

// serveWebhooks serves h over TLS on loopback until the test ends, as
// admission webhooks the apiserver calls: it returns the base URL and the
// CA bundle that verifies the server (a CA named name-ca of its own).
func serveWebhooks(t *testing.T, name string, h http.Handler) (base string, caBundle []byte) {
	t.Helper()
	ca, err := pki.NewCA(name + "-ca")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.Leaf{CommonName: name, Server: true, IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{leaf.TLSCertificate()}}}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	return "https://" + ln.Addr().String(), pki.CertPEM(ca.Cert)
}

// reviewAdmission answers one AdmissionReview: allowed, as answer leaves
// or changes the response.
func reviewAdmission(w http.ResponseWriter, r *http.Request, answer func(*admissionv1.AdmissionRequest, *admissionv1.AdmissionResponse)) {
	var ar admissionv1.AdmissionReview
	b, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(b, &ar); err != nil || ar.Request == nil {
		http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
		return
	}
	resp := &admissionv1.AdmissionResponse{UID: ar.Request.UID, Allowed: true}
	answer(ar.Request, resp)
	ar.Response, ar.Request = resp, nil
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(ar)
}

// untilWebhooksCalled waits until the apiserver calls the webhooks just
// configured for ConfigMaps in ns: a dry-run create of one named probe
// fails saying says. Then it waits past the seconds in which a change of
// webhooks makes an admission verdict unknown (admission_late.go).
func untilWebhooksCalled(t *testing.T, ns, probe, says string) {
	t.Helper()
	untilCalled(t, ns, "configmaps", "ConfigMap", probe, says)
}

// untilCalled is untilWebhooksCalled for objects of another kind (plural,
// kind) in ns.
func untilCalled(t *testing.T, ns, plural, kind, probe, says string) {
	t.Helper()
	untilWebhooksCalledWith(t, "/api/v1/namespaces/"+ns+"/"+plural, fmt.Sprintf(`{"apiVersion":"v1","kind":%q,"metadata":{"name":%q}}`, kind, probe), says)
}

// untilWebhooksCalledWith waits until a dry-run POST of body to path
// fails saying says, and past the seconds in which a change of webhooks
// makes an admission verdict unknown.
func untilWebhooksCalledWith(t *testing.T, path, body, says string) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := adminClient().CoreV1().RESTClient().Post().AbsPath(path).Param("dryRun", "All").
			SetHeader("Content-Type", "application/json").Body([]byte(body)).Do(ctx).Error()
		if err != nil && strings.Contains(err.Error(), says) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the webhooks are not called after 30s (last answer: %v)", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(3 * time.Second)
}

// configMapSender creates ConfigMaps in ns through a kproxy with one
// replay worker, as admin, and returns each create's record once the
// apiserver answered it want.
func configMapSender(t *testing.T, ns string) func(name, query string, want int) *record.Record {
	send := objectSender(t, ns)
	return func(name, query string, want int) *record.Record {
		t.Helper()
		return send("configmaps", "ConfigMap", name, query, want)
	}
}

// objectSender is configMapSender for objects of any core kind (plural,
// kind) with an empty spec.
func objectSender(t *testing.T, ns string) func(plural, kind, name, query string, want int) *record.Record {
	send, _ := objectSenders(t, ns)
	return send
}

// objectSenders is objectSender and its DELETE of an object by name
// (plural, name), which returns the DELETE's record.
func objectSenders(t *testing.T, ns string) (send func(plural, kind, name, query string, want int) *record.Record, del func(plural, name string, want int) *record.Record) {
	recs, r, c := oneReplayWorker(t)
	del = func(plural, name string, want int) *record.Record {
		t.Helper()
		got := do(t, c, r.base, request{method: "DELETE", path: "/api/v1/namespaces/" + ns + "/" + plural + "/" + name, user: "admin"})
		if got.status != want {
			t.Fatalf("delete %s: the apiserver answered %d, want %d: %s", name, got.status, want, got.body)
		}
		for {
			if rec := nextRecord(t, recs); rec.Request.Namespace == ns && rec.Request.Method == "DELETE" {
				return rec
			}
		}
	}
	return func(plural, kind, name, query string, want int) *record.Record {
		t.Helper()
		got := do(t, c, r.base, request{method: "POST", path: "/api/v1/namespaces/" + ns + "/" + plural + query, user: "admin",
			body: fmt.Sprintf(`{"apiVersion":"v1","kind":%q,"metadata":{"name":%q}}`, kind, name)})
		if got.status != want {
			t.Fatalf("%s: the apiserver answered %d, want %d: %s", name, got.status, want, got.body)
		}
		for {
			if rec := nextRecord(t, recs); rec.Request.Namespace == ns && rec.Request.Method == "POST" {
				return rec
			}
		}
	}, del
}
