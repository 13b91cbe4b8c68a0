package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// TestEvictionRefusedReplayedLate: an eviction the apiserver refused with
// 429 for its PodDisruptionBudget, replayed after the budget was
// replenished (the disruption controller's doing when a pod turns healthy
// again). The replay reads the budget as it is now and would allow the
// eviction: before, the record predicted 201 for the apiserver's 429, a
// confident miss. The race is made on demand: the one replay worker is
// held while the request is answered and the budget replenished.
func TestEvictionRefusedReplayedLate(t *testing.T) {
	recs, r, c := oneReplayWorker(t)
	hold := startReplayHold(t, r, c, recs)
	run := fmt.Sprintf("evict-late-%d", time.Now().UnixNano())
	ns := "/api/v1/namespaces/" + testNS
	pdb := "/apis/policy/v1/namespaces/" + testNS + "/poddisruptionbudgets/" + run
	budget := func(allowed int) request {
		return request{method: "PATCH", path: pdb + "/status", contentType: "application/merge-patch+json",
			body: fmt.Sprintf(`{"status":{"observedGeneration":1,"disruptionsAllowed":%d,"currentHealthy":1,"desiredHealthy":%d,"expectedPods":1}}`, allowed, 1-allowed)}
	}
	evict := request{method: "POST", path: ns + "/pods/" + run + "/eviction", body: `{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"` + run + `"}}`}
	send := func(q request, want int) {
		t.Helper()
		q.user = "admin"
		if got := do(t, c, r.base, q); got.status != want {
			t.Fatalf("%s %s: %d %s, want %d", q.method, q.path, got.status, got.body, want)
		}
	}
	// A running, ready pod guarded by a budget that allows no disruption.
	send(request{method: "POST", path: ns + "/pods", body: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"` + run + `","labels":{"pdb":"` + run + `"}},"spec":{"nodeName":"node-1","containers":[{"name":"c","image":"registry.k8s.io/pause:3.10"}]}}`}, 201)
	send(request{method: "PATCH", path: ns + "/pods/" + run + "/status", contentType: "application/merge-patch+json",
		body: `{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}`}, 200)
	send(request{method: "POST", path: "/apis/policy/v1/namespaces/" + testNS + "/poddisruptionbudgets",
		body: `{"apiVersion":"policy/v1","kind":"PodDisruptionBudget","metadata":{"name":"` + run + `"},"spec":{"maxUnavailable":1,"selector":{"matchLabels":{"pdb":"` + run + `"}}}}`}, 201)
	send(budget(0), 200)
	for range 4 {
		nextRecord(t, recs)
	}

	// Replayed in time: the replay meets the budget the request met.
	send(evict, 429)
	if rec := nextRecord(t, recs); rec.Predicted.Status != 429 {
		t.Errorf("eviction refused for its budget, replayed in time: predicted %d at %s (%s), the apiserver answered 429", rec.Predicted.Status, rec.Predicted.Stage, rec.Predicted.Message)
	}

	// Replayed late: the budget is replenished before the replay reads it.
	hold.hold(t)
	send(evict, 429)
	send(budget(1), 200)
	hold.release()
	if rec := evictionAmong(t, recs, 3); rec.Predicted.Stage != record.StageUnknown || !strings.Contains(rec.Predicted.Message, `refused the request with 429 ("Cannot evict pod as it would violate the pod's disruption budget.")`) {
		t.Errorf("eviction refused (429), replayed after the budget was replenished: predicted %d at %s (%s), want unknown: the budget was read late", rec.Predicted.Status, rec.Predicted.Stage, rec.Predicted.Message)
	}

	// Replayed after the pod was deleted: before, predicted 404.
	send(budget(0), 200)
	nextRecord(t, recs)
	hold.hold(t)
	send(evict, 429)
	send(request{method: "DELETE", path: ns + "/pods/" + run + "?gracePeriodSeconds=0"}, 200)
	hold.release()
	if rec := evictionAmong(t, recs, 3); rec.Predicted.Stage != record.StageUnknown || !strings.Contains(rec.Predicted.Message, "deleted between the apiserver's read and the replay's") {
		t.Errorf("eviction refused (429), replayed after the pod was deleted: predicted %d at %s (%s), want unknown: the pod was deleted since", rec.Predicted.Status, rec.Predicted.Stage, rec.Predicted.Message)
	}
}

// evictionAmong is the one eviction's record among the next n.
func evictionAmong(t *testing.T, recs <-chan *record.Record, n int) *record.Record {
	t.Helper()
	var found *record.Record
	for range n {
		if rec := nextRecord(t, recs); rec.Request.Method == "POST" && strings.HasSuffix(rec.Request.Path, "/eviction") {
			found = rec
		}
	}
	if found == nil {
		t.Fatalf("no eviction among the next %d records", n)
	}
	return found
}

// replayHold holds kproxy's replays on demand, for tests that need a
// replay to run after a later change (a race, made to happen): a
// validating webhook on configmaps labelled with the hold's name answers
// the apiserver at once and holds the replay's call (a dry run) while the
// hold is on. With one replay worker, every replay queued behind the held
// one waits too.
type replayHold struct {
	r       route
	c       *http.Client
	recs    <-chan *record.Record
	label   string
	mu      sync.Mutex
	on      chan struct{} // closed to release; nil when not holding
	dryRuns chan struct{} // a dry-run call arrived
	n       int
}

// startReplayHold registers the hold's webhook and waits until kproxy's
// replay calls it.
func startReplayHold(t *testing.T, r route, c *http.Client, recs <-chan *record.Record) *replayHold {
	t.Helper()
	h := &replayHold{r: r, c: c, recs: recs, label: fmt.Sprintf("hold-%d", time.Now().UnixNano()), dryRuns: make(chan struct{}, 64)}
	base, caPEM := serveWebhooks(t, "e2e-hold", http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		reviewAdmission(w, req, func(ar *admissionv1.AdmissionRequest, _ *admissionv1.AdmissionResponse) {
			if ar.DryRun == nil || !*ar.DryRun {
				return
			}
			h.mu.Lock()
			on := h.on
			h.mu.Unlock()
			h.dryRuns <- struct{}{}
			if on != nil {
				select {
				case <-on:
				case <-req.Context().Done():
				}
			}
		})
	}))
	t.Cleanup(h.release) // before the server closes

	url := base + "/hold"
	none, ignore := admissionregistrationv1.SideEffectClassNone, admissionregistrationv1.Ignore
	timeout := int32(30)
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kproxy-e2e-" + h.label},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "hold.e2e.kproxy.test", ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: caPEM, URL: &url},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
			}},
			FailurePolicy: &ignore, SideEffects: &none, TimeoutSeconds: &timeout, AdmissionReviewVersions: []string{"v1"},
			ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kproxy-e2e-hold": h.label}},
		}}}
	ctx := context.Background()
	ar := adminClient().AdmissionregistrationV1().ValidatingWebhookConfigurations()
	if _, err := ar.Create(ctx, vwc, createOpts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ar.Delete(ctx, vwc.Name, metav1.DeleteOptions{}) })

	// kproxy reads webhook configurations from an informer: until it has
	// this one, a replay does not call it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		h.create(t)
		nextRecord(t, recs)
		select {
		case <-h.dryRuns:
			return h
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("kproxy's replay never called the hold webhook (ValidatingWebhookConfiguration " + vwc.Name + ") within 30s")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// create sends a configmap create the hold's webhook sees.
func (h *replayHold) create(t *testing.T) {
	t.Helper()
	h.n++
	body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"%s-%d","labels":{"kproxy-e2e-hold":"%s"}}}`, h.label, h.n, h.label)
	if got := do(t, h.c, h.r.base, request{method: "POST", path: "/api/v1/namespaces/" + testNS + "/configmaps", user: "admin", body: body}); got.status != 201 {
		t.Fatalf("the hold's configmap: %d %s", got.status, got.body)
	}
}

// hold holds the replay worker: it returns once a replay waits in the
// webhook. Its record comes after release.
func (h *replayHold) hold(t *testing.T) {
	t.Helper()
	h.mu.Lock()
	h.on = make(chan struct{})
	h.mu.Unlock()
	h.create(t)
	select {
	case <-h.dryRuns:
	case <-time.After(30 * time.Second):
		t.Fatal("the hold's replay did not reach its webhook within 30s")
	}
}

// release lets the held replay, and those queued behind it, run.
// releaseAndCheck releases the hold and reads the hold's own record, then
// the records of the requests sent while it held, in order: each is
// unknown saying why[i] or, where why[i] is "", predicted as the
// apiserver answered. after names what the replays ran after.
func (h *replayHold) releaseAndCheck(t *testing.T, after string, why ...string) {
	t.Helper()
	h.release()
	nextRecord(t, h.recs) // the hold's own
	for i, w := range why {
		rec := nextRecord(t, h.recs)
		switch {
		case w != "" && (rec.Predicted.Stage != record.StageUnknown || !strings.Contains(rec.Predicted.Message, w)):
			t.Errorf("request %d, %s %s (answered %d), replayed after %s: predicted %d at %s (%s), want unknown saying %q",
				i, rec.Request.Method, rec.Request.Path, rec.Actual.Status, after, rec.Predicted.Status, rec.Predicted.Stage, rec.Predicted.Message, w)
		case w == "" && rec.Predicted.Status != rec.Actual.Status:
			t.Errorf("request %d, %s %s, replayed after %s: predicted %d at %s (%s), the apiserver answered %d",
				i, rec.Request.Method, rec.Request.Path, after, rec.Predicted.Status, rec.Predicted.Stage, rec.Predicted.Message, rec.Actual.Status)
		}
	}
}

func (h *replayHold) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.on != nil {
		close(h.on)
		h.on = nil
	}
}

// TestNamespaceGoneReplayedLate: writes the apiserver refused in a
// terminating namespace (403, and a finalize's 409), replayed after the
// namespace was finalized away. Before, the replay met no namespace and
// predicted 404, a confident miss (seen in TestControllerSession, whose
// namespace controller empties and removes namespaces while replays
// queue).
func TestNamespaceGoneReplayedLate(t *testing.T) {
	recs, r, c := oneReplayWorker(t)
	hold := startReplayHold(t, r, c, recs)
	ctx := context.Background()
	cs := adminClient()
	name := fmt.Sprintf("gone-late-%d", time.Now().UnixNano())
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, createOpts); err != nil {
		t.Fatal(err)
	}
	// No namespace controller runs here: deleted, the namespace stays
	// terminating, its "kubernetes" finalizer in place, until finalized.
	if err := cs.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	ns, err := cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	finalize := func(rv string) request {
		return request{method: "PUT", path: "/api/v1/namespaces/" + name + "/finalize", user: "admin",
			body: `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"` + name + `","resourceVersion":"` + rv + `"},"spec":{"finalizers":[]}}`}
	}
	hold.hold(t)
	sent := []struct {
		req  request
		want int
		why  string // the prediction's unknown says
	}{
		{request{method: "POST", path: "/api/v1/namespaces/" + name + "/configmaps", user: "admin",
			body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"late"}}`}, 403, "so its NamespaceLifecycle found the namespace"},
		{finalize("1"), 409, "the apiserver answered 409 (a conflict with the stored object), and the replay found no object"},
		{finalize(ns.ResourceVersion), 200, ""},
	}
	for _, s := range sent {
		if got := do(t, c, r.base, s.req); got.status != s.want {
			hold.release()
			t.Fatalf("%s %s: %d %s, want %d", s.req.method, s.req.path, got.status, got.body, s.want)
		}
	}
	if _, err := cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{}); err == nil {
		t.Log("the namespace is still there after its finalize: the replays may not run late")
	}
	whys := make([]string, len(sent))
	for i, s := range sent {
		whys[i] = s.why
	}
	hold.releaseAndCheck(t, "the namespace was gone", whys...)
}
