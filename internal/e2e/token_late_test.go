package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kproxy/kproxy/internal/record"
)

// TestBoundTokenPodDeletedAfterRequest: a pod's service-account token
// (bound to the pod, as the kubelet asks for it) used once, replayed
// behind 40 queued writes, after the pod is deleted: the apiserver
// authenticated it (403: the service account may not list configmaps),
// and the replay's authenticator, which finds the pod gone, had predicted
// 401 at authentication. It says unknown now, naming the token's bound
// object.
func TestBoundTokenPodDeletedAfterRequest(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	ns := accountNamespace(t, "token-late", "worker")
	recs, r, c := oneReplayWorker(t)
	// kproxy's replay has synced the namespace (admin's dry-run create of
	// a configmap in it is predicted).
	waitPredicted(t, recs, r, c, request{method: "POST", path: "/api/v1/namespaces/" + ns + "/configmaps?dryRun=All", user: "admin",
		body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"probe"}}`})
	// attempt uses a new pod's token once (a token the replay
	// authenticated earlier is cached) and reports whether its replay ran
	// after the pod's deletion; one that still ran before it (kproxy's
	// informers are quick) must predict the answer.
	attempt := func(i int) (late bool) {
		pod, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%d", i)}, Spec: corev1.PodSpec{ServiceAccountName: "worker",
			Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}, createOpts)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "worker", &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
			BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		queueWrites(t, r, c, 40)
		got := do(t, c, r.base, request{method: "GET", path: "/api/v1/namespaces/" + ns + "/configmaps",
			header: http.Header{"Authorization": {"Bearer " + tr.Status.Token}}})
		if got.status != 403 {
			t.Fatalf("the pod's token: answered %d, want 403 (authenticated, not allowed): %s", got.status, got.body)
		}
		if err := cs.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		lateRecs, seen := tallyLate(t, recs, 41, inNamespace(ns), "the object the token is bound to", "the pod's deletion")
		for _, rec := range lateRecs {
			if st := stageNamed(rec, record.StageAuthentication); !strings.Contains(st.Explanation, "service account token has been invalidated") {
				t.Errorf("authentication does not say what it read now: %s", st.Explanation)
			}
		}
		if seen != 1 {
			t.Errorf("%d records of the request in %s", seen, ns)
		}
		return len(lateRecs) > 0
	}
	late := false
	for i := 0; i < 5 && !late; i++ {
		late = attempt(i)
	}
	if !late {
		t.Errorf("no replay of the 5 tokens ran after its pod's deletion: the path under test was not taken")
	}
}

// TestTokenCachedByTheApiserver: a service account's token used directly
// against the apiserver (not through kproxy), then its service account
// deleted, then the token sent through kproxy within seconds: the
// apiserver authenticates it from its token cache (a success is not
// checked again for 10 s), and kproxy's authenticator, which never saw
// the token, finds the service account gone. Before, kproxy predicted 401
// at authentication; it says unknown now, naming the token cache.
func TestTokenCachedByTheApiserver(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	ns := accountNamespace(t, "token-cached", "cached")
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "cached", &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r, recs := recordedKproxy(t)
	c := r.client(nil)
	ssr := selfSubjectReview(tr.Status.Token)
	d := directRoute()
	if got := do(t, d.client(nil), d.base, ssr); got.status != 201 {
		t.Fatalf("the token, directly: answered %d, want 201: %s", got.status, got.body)
	}
	if err := cs.CoreV1().ServiceAccounts(ns).Delete(ctx, "cached", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// kproxy's informer has seen the deletion once admin's read of the
	// service account through it is predicted 404.
	waitPredicted(t, recs, r, c, request{method: "GET", path: "/api/v1/namespaces/" + ns + "/serviceaccounts/cached", user: "admin"})
	// The steps since the direct request take a second or two: well
	// inside the cache's 10 s.
	sendFromTokenCache(t, recs, r, c, ssr, "token")
}

// sendFromTokenCache sends ssr, whose token the apiserver authenticated
// a moment ago and whose object kproxy has seen go, through kproxy: the
// apiserver answers from its token cache (201), and the record says
// unknown, naming the cache.
func sendFromTokenCache(t *testing.T, recs <-chan *record.Record, r route, c *http.Client, ssr request, what string) {
	t.Helper()
	got := do(t, c, r.base, ssr)
	rec := nextRecord(t, recs)
	if got.status != 201 {
		t.Fatalf("the %s through kproxy: answered %d, want 201 (the apiserver's token cache): %s", what, got.status, got.body)
	}
	if rec.Predicted.Stage != record.StageUnknown || !strings.Contains(rec.Predicted.Message, "within the apiserver's token cache") {
		t.Errorf("a %s the apiserver authenticated from its cache: predicted %+v, want unknown naming the token cache", what, rec.Predicted)
	}
}

// TestBootstrapTokenCachedByTheApiserver is TestTokenCachedByTheApiserver
// for a bootstrap token (found by a probe): used directly, its Secret then
// deleted, the token sent through kproxy within seconds is authenticated
// from the apiserver's token cache. Before, kproxy predicted 401.
func TestBootstrapTokenCachedByTheApiserver(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	id := fmt.Sprintf("c%05d", time.Now().UnixNano()%100000)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + id}, Type: corev1.SecretTypeBootstrapToken,
		StringData: map[string]string{"token-id": id, "token-secret": "0123456789abcdef", "usage-bootstrap-authentication": "true"}}
	if _, err := cs.CoreV1().Secrets("kube-system").Create(ctx, secret, createOpts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.CoreV1().Secrets("kube-system").Delete(context.Background(), secret.Name, metav1.DeleteOptions{})
	})
	r, recs := recordedKproxy(t)
	c := r.client(nil)
	ssr := selfSubjectReview(id + ".0123456789abcdef")
	d := directRoute()
	// Until the apiserver's informer has the Secret.
	deadline := time.Now().Add(30 * time.Second)
	for got := do(t, d.client(nil), d.base, ssr); got.status != 201; got = do(t, d.client(nil), d.base, ssr) {
		if time.Now().After(deadline) {
			t.Fatalf("the bootstrap token, directly: answered %d, want 201: %s", got.status, got.body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := cs.CoreV1().Secrets("kube-system").Delete(ctx, secret.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPredicted(t, recs, r, c, request{method: "GET", path: "/api/v1/namespaces/kube-system/secrets/" + secret.Name, user: "admin"})
	sendFromTokenCache(t, recs, r, c, ssr, "bootstrap token")
}

// TestLegacyTokenInvalidatedWithinTheApiserversCache is
// TestTokenCachedByTheApiserver for a legacy token, a Secret's (found by
// a probe): used directly, its Secret then labelled invalid (the
// legacy-token cleaner's mark) or deleted, the token sent through kproxy
// within seconds is authenticated from the apiserver's token cache.
// Before, kproxy predicted 401: the legacy validator's words ("Token has
// been invalidated", "has been marked invalid") were not read as a change
// of the token's objects.
func TestLegacyTokenInvalidatedWithinTheApiserversCache(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	ns := accountNamespace(t, "legacy-cached", "legacy")
	r, recs := recordedKproxy(t)
	c := r.client(nil)
	d := directRoute()
	for _, tc := range []struct {
		name       string
		invalidate func(secret string) error
	}{
		{"labelled-invalid", func(secret string) error { return markLegacyInvalid(ctx, cs, ns, secret) }},
		{"secret-deleted", func(secret string) error {
			return cs.CoreV1().Secrets(ns).Delete(ctx, secret, metav1.DeleteOptions{})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			secret := "legacy-" + tc.name
			ssr := selfSubjectReview(legacyToken(t, cs, ns, "legacy", secret, ""))
			if got := do(t, d.client(nil), d.base, ssr); got.status != 201 {
				t.Fatalf("the legacy token, directly: answered %d, want 201: %s", got.status, got.body)
			}
			if err := tc.invalidate(secret); err != nil {
				t.Fatal(err)
			}
			sendFromTokenCache(t, recs, r, c, ssr, "legacy token")
		})
	}
}

// TestTokenCacheLapsedInTheApiserverFirst: a legacy token used through
// kproxy, its replay run a few hundred ms after the apiserver checked it
// (queued behind writes): each keeps the success for 10 s from its own
// check. Its Secret then labelled invalid, the token sent again and
// again around the 10 s mark: the apiserver checks afresh and refuses
// (401) while the replay's younger entry still accepts it. Before, kproxy
// predicted the success (found by a probe: 8 records in 7 runs, the
// window a few ms there, widened here by the queue); it says unknown now,
// naming the two caches.
func TestTokenCacheLapsedInTheApiserverFirst(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	ns := accountNamespace(t, "legacy-lapsed", "legacy")
	tok := legacyToken(t, cs, ns, "legacy", "legacy-lapsed", "")
	recs, r, c := oneReplayWorker(t)
	// The service account may not list configmaps: an authenticated
	// request is answered 403, a refused token 401.
	list := request{method: "GET", path: "/api/v1/namespaces/" + ns + "/configmaps", header: http.Header{"Authorization": {"Bearer " + tok}}}
	queueWrites(t, r, c, 100)
	first := time.Now()
	if got := do(t, c, r.base, list); got.status != 403 {
		t.Fatalf("the legacy token: answered %d, want 403 (authenticated, not allowed): %s", got.status, got.body)
	}
	// Its replay ran before the label: predicted as answered.
	if _, seen := tallyLate(t, recs, 101, inNamespace(ns), "no unknown expected", "nothing"); seen != 1 {
		t.Fatalf("%d records of the first request in %s", seen, ns)
	}
	if err := markLegacyInvalid(ctx, cs, ns, "legacy-lapsed"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(first.Add(10*time.Second - 200*time.Millisecond)))
	lapsed, refused := 0, 0
	for refused < 20 && time.Since(first) < 15*time.Second {
		got := do(t, c, r.base, list)
		rec := nextRecord(t, recs)
		if got.status != 401 {
			continue
		}
		refused++
		switch p := rec.Predicted; {
		case p.Stage == record.StageUnknown && strings.Contains(p.Message, "caches a token's success"):
			lapsed++
			saysAt(t, rec, "caches a token's success", record.StageAuthentication)
		case p.Stage == record.StageAuthentication && p.Status == 401:
			// Both caches had let the token go.
		default:
			t.Errorf("a request answered 401 %.0f ms after the token's first use: predicted %+v, want 401 or unknown naming the token caches",
				float64(time.Since(first).Milliseconds()), p)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("%d requests answered 401, %d of them while the replay's cache still held the token", refused, lapsed)
	if refused == 0 {
		t.Fatal("the apiserver never refused the labelled token")
	}
	if lapsed == 0 {
		t.Errorf("no request was answered 401 while the replay's cache held the token: the path under test was not taken")
	}
}

// selfSubjectReview is a SelfSubjectReview sent with token.
func selfSubjectReview(token string) request {
	return request{method: "POST", path: "/apis/authentication.k8s.io/v1/selfsubjectreviews",
		body:   `{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`,
		header: http.Header{"Authorization": {"Bearer " + token}, "Content-Type": {"application/json"}}}
}

// accountNamespace is a namespace of the test's own (lateNamespace) with
// service account sa.
func accountNamespace(t *testing.T, prefix, sa string) string {
	t.Helper()
	ns := lateNamespace(t, prefix)
	if _, err := adminClient().CoreV1().ServiceAccounts(ns).Create(context.Background(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, createOpts); err != nil {
		t.Fatal(err)
	}
	return ns
}

// markLegacyInvalid labels a legacy token's Secret as the legacy-token
// cleaner does: the legacy validator refuses its token from then on.
func markLegacyInvalid(ctx context.Context, cs kubernetes.Interface, ns, secret string) error {
	_, err := cs.CoreV1().Secrets(ns).Patch(ctx, secret, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"kubernetes.io/legacy-token-invalid-since":"2026-01-01"}}}`), metav1.PatchOptions{})
	return err
}
