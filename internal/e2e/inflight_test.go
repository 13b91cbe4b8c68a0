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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// TestWritesRacedInFlight: writes whose answer turns on another write
// to the same object that landed while they were in flight, the races a
// probe of concurrent writers found predicted wrong (each about once in
// a few dozen races there). Here each race is made on demand: a
// validating webhook holds the apiserver's call for the write (not the
// replay's, a dry run) until the other write has landed, so the replay
// reads the object before it and the apiserver's store after it.
func TestWritesRacedInFlight(t *testing.T) {
	ctx := context.Background()
	ns := lateNamespace(t, "inflight")
	var mu sync.Mutex
	gate := make(chan struct{}) // closed: the apiserver's held call goes on
	held := make(chan string, 16)
	replayed := make(chan string, 16)
	base, caPEM := serveWebhooks(t, "inflight", http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		reviewAdmission(w, req, func(ar *admissionv1.AdmissionRequest, _ *admissionv1.AdmissionResponse) {
			if !strings.Contains(string(ar.Object.Raw), `"hold":"yes"`) {
				return
			}
			if ar.DryRun != nil && *ar.DryRun {
				replayed <- ar.Name // kproxy's replay: never held
				return
			}
			mu.Lock()
			g := gate
			mu.Unlock()
			held <- ar.Name
			select {
			case <-g:
			case <-time.After(20 * time.Second):
			case <-req.Context().Done():
			}
		})
	}))
	url := base + "/hold"
	none, fail, timeout := admissionregistrationv1.SideEffectClassNone, admissionregistrationv1.Fail, int32(30)
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: ns},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "hold.inflight.kproxy.test", ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: caPEM, URL: &url},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
			}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
			FailurePolicy:     &fail, SideEffects: &none, TimeoutSeconds: &timeout, AdmissionReviewVersions: []string{"v1"},
		}}}
	ar := adminClient().AdmissionregistrationV1().ValidatingWebhookConfigurations()
	if _, err := ar.Create(ctx, vwc, createOpts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ar.Delete(context.Background(), vwc.Name, metav1.DeleteOptions{}) })

	stream := record.NewStream()
	recs, _, cancel := stream.Subscribe(256)
	t.Cleanup(cancel)
	r := reverseRoute(startKproxy(t, kproxyOptions{stream: stream}))
	c := r.client(nil)
	cms := "/api/v1/namespaces/" + ns + "/configmaps"
	send := func(t *testing.T, q request, want int) {
		t.Helper()
		q.user = "admin"
		if got := do(t, c, r.base, q); got.status != want {
			t.Fatalf("%s %s: the apiserver answered %d, want %d: %s", q.method, q.path, got.status, want, got.body)
		}
	}
	// Until the apiserver and kproxy's replay both call the webhook (it
	// holds nothing while the gate is open).
	close(gate)
	deadline := time.Now().Add(30 * time.Second)
	for n := 0; ; n++ {
		send(t, request{method: "POST", path: cms, body: fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"probe-%d"},"data":{"hold":"yes"}}`, n)}, 201)
		<-held
		called := false
		select {
		case <-replayed:
			called = true
		case <-time.After(2 * time.Second):
		}
		if called {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("kproxy's replay never called the webhook within 30s")
		}
	}
	// The records so far are not this test's.
	drain := func() {
		for {
			select {
			case <-recs:
			case <-time.After(2 * time.Second):
				return
			}
		}
	}
	drain()
	for len(held) > 0 {
		<-held
	}
	for len(replayed) > 0 {
		<-replayed
	}

	// race sends the held write in the background, waits until the
	// apiserver holds it and kproxy's replay has read the object, sends
	// the other write, and lets the held one go on. It returns the held
	// write's record.
	race := func(t *testing.T, heldWrite request, heldStatus int, other request, otherStatus int) *record.Record {
		t.Helper()
		mu.Lock()
		gate = make(chan struct{})
		g := gate
		mu.Unlock()
		since := time.Now()
		done := make(chan struct{})
		go func() {
			defer close(done)
			send(t, heldWrite, heldStatus)
		}()
		select {
		case <-held:
		case <-time.After(20 * time.Second):
			t.Fatal("the apiserver did not call the webhook")
		}
		// A create's replay calls the webhook before it reads the
		// object; a patch's reads it first, then waits for the
		// apiserver's answer before it goes on.
		select {
		case <-replayed:
		case <-time.After(2 * time.Second):
		}
		time.Sleep(500 * time.Millisecond)
		send(t, other, otherStatus)
		close(g)
		<-done
		for len(held) > 0 {
			<-held // the retried call after a conflict
		}
		for len(replayed) > 0 {
			<-replayed
		}
		for {
			rec := nextRecord(t, recs)
			if rec.Request.Method == heldWrite.method && rec.Request.Namespace == ns && rec.Actual.Status == heldStatus && !rec.Start.Before(since) {
				return rec
			}
		}
	}

	t.Run("a create whose name was taken until an earlier copy was deleted", func(t *testing.T) {
		// Before: predicted 409 AlreadyExists from the copy the replay
		// read, which a delete removed before the apiserver's create.
		send(t, request{method: "POST", path: cms, body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"taken"}}`}, 201)
		rec := race(t, request{method: "POST", path: cms, body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"taken"},"data":{"hold":"yes"}}`}, 201,
			request{method: "DELETE", path: cms + "/taken"}, 200)
		if rec.Predicted.Status != 201 {
			t.Errorf("predicted %d at %s (%s), the apiserver answered 201", rec.Predicted.Status, rec.Predicted.Stage, rec.Predicted.Message)
		}
	})
	t.Run("a server-side apply that created its object once an earlier copy was deleted", func(t *testing.T) {
		// Probe AM (an apply and a delete of one name sent at once, 9 of
		// 40 tries): the delete landed first and the apply created the
		// object (201); the replay, reading the earlier copy, had
		// predicted 409 for a conflict with its other manager, or 200 (an
		// update) for an apply of another field, as here: the held apply
		// met the earlier copy, and its store retried it after the delete.
		apply := func(manager, data string) request {
			return request{method: "PATCH", path: cms + "/applied?fieldManager=" + manager, contentType: "application/apply-patch+yaml",
				body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"applied"},"data":` + data + `}`}
		}
		send(t, apply("m1", `{"s":"a"}`), 201)
		rec := race(t, apply("m2", `{"t":"b","hold":"yes"}`), 201, request{method: "DELETE", path: cms + "/applied"}, 200)
		if rec.Predicted.Status != 201 {
			t.Errorf("predicted %d at %s (%s), the apiserver answered 201", rec.Predicted.Status, rec.Predicted.Stage, rec.Predicted.Message)
		}
	})
	t.Run("a merge patch refused once another made the object immutable", func(t *testing.T) {
		// Before: predicted 200 from the object as the replay read it,
		// still mutable; the apiserver's store retried the patch on the
		// immutable one (422).
		send(t, request{method: "POST", path: cms, body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"frozen"}}`}, 201)
		rec := race(t, request{method: "PATCH", path: cms + "/frozen", contentType: "application/merge-patch+json", body: `{"data":{"hold":"yes"}}`}, 422,
			request{method: "PATCH", path: cms + "/frozen", contentType: "application/merge-patch+json", body: `{"immutable":true}`}, 200)
		if rec.Predicted.Stage != record.StageUnknown || !strings.Contains(rec.Predicted.Message, "the object changed while this request was in flight") {
			t.Errorf("predicted %d at %s (%s), the apiserver answered 422 (%s): want unknown, the object changed in flight",
				rec.Predicted.Status, rec.Predicted.Stage, rec.Predicted.Message, rec.Actual.Message)
		}
	})
	t.Run("a finalizer added while the object is being deleted", func(t *testing.T) {
		send(t, request{method: "POST", path: cms, body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"kept","finalizers":["e2e.kproxy.test/keep"]}}`}, 201)
		t.Cleanup(func() {
			_ = do(t, c, r.base, request{method: "PATCH", user: "admin", path: cms + "/kept", contentType: "application/merge-patch+json", body: `{"metadata":{"finalizers":null}}`})
		})
		rec := race(t, request{method: "PATCH", path: cms + "/kept", contentType: "application/merge-patch+json",
			body: `{"metadata":{"finalizers":["e2e.kproxy.test/keep","e2e.kproxy.test/more"]},"data":{"hold":"yes"}}`}, 422,
			request{method: "DELETE", path: cms + "/kept"}, 200)
		if rec.Predicted.Stage != record.StageUnknown || !strings.Contains(rec.Predicted.Message, "the object changed while this request was in flight") {
			t.Errorf("predicted %d at %s (%s), the apiserver answered 422 (%s): want unknown, the object changed in flight",
				rec.Predicted.Status, rec.Predicted.Stage, rec.Predicted.Message, rec.Actual.Message)
		}
	})
}

// TestWritesRefusedReplayedLate: writes the apiserver refused for the
// object it found, or did not find, replayed after a later write changed
// that (a probe of concurrent writers saw each): a delete refused by its
// resourceVersion precondition (409), then deleted by another, was
// predicted 404; a scale of a Deployment not yet created (404), replayed
// after its create, was predicted 200. Both say unknown now.
func TestWritesRefusedReplayedLate(t *testing.T) {
	recs, r, c := oneReplayWorker(t)
	hold := startReplayHold(t, r, c, recs)
	run := fmt.Sprintf("refused-late-%d", time.Now().UnixNano())
	cms := "/api/v1/namespaces/" + testNS + "/configmaps"
	send := func(q request, want int) exchange {
		t.Helper()
		q.user = "admin"
		got := do(t, c, r.base, q)
		if got.status != want {
			t.Fatalf("%s %s: %d %s, want %d", q.method, q.path, got.status, got.body, want)
		}
		return got
	}
	send(request{method: "POST", path: cms, body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"` + run + `"}}`}, 201)
	nextRecord(t, recs)

	hold.hold(t)
	send(request{method: "DELETE", path: cms + "/" + run, body: `{"preconditions":{"resourceVersion":"1"}}`}, 409)
	send(request{method: "DELETE", path: cms + "/" + run}, 200)
	hold.releaseAndCheck(t, "the object's delete", "deleted between the apiserver's read and the replay's", "")

	// Two server-side applies a few milliseconds apart (a probe): b's is
	// refused for a conflict with a's field, and a's next apply gives the
	// field up; b's replay, reading after it, had predicted 200. The
	// object, unchanged since, was written as b's request arrived.
	apply := func(manager, data string, want int) {
		send(request{method: "PATCH", path: cms + "/" + run + "-ssa?fieldManager=" + manager, contentType: "application/apply-patch+yaml",
			body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"` + run + `-ssa"},"data":` + data + `}`}, want)
	}
	apply("a", `{"a":"1"}`, 201)
	nextRecord(t, recs)
	hold.hold(t)
	apply("b", `{"a":"2"}`, 409)
	apply("a", `{"b":"1"}`, 200)
	hold.releaseAndCheck(t, "an apply giving the field up", "as this request arrived, so it may have landed after the apiserver's read", "")

	deploys := "/apis/apps/v1/namespaces/" + testNS + "/deployments"
	hold.hold(t)
	send(request{method: "PUT", path: deploys + "/" + run + "/scale",
		body: `{"apiVersion":"autoscaling/v1","kind":"Scale","metadata":{"name":"` + run + `","namespace":"` + testNS + `"},"spec":{"replicas":2}}`}, 404)
	send(request{method: "POST", path: deploys, body: `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"` + run + `"},"spec":{"selector":{"matchLabels":{"app":"` + run +
		`"}},"template":{"metadata":{"labels":{"app":"` + run + `"}},"spec":{"containers":[{"name":"c","image":"registry.k8s.io/pause:3.10"}]}}}}`}, 201)
	hold.releaseAndCheck(t, "the deployment's create", "created, or deleted, between the apiserver's read", "")
}
