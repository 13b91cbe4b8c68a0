package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	ns := lateNamespace(t, "token-late")
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "worker"}}, createOpts); err != nil {
		t.Fatal(err)
	}
	pod, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: corev1.PodSpec{ServiceAccountName: "worker",
		Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}, createOpts)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "worker", &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	recs, r, c := oneReplayWorker(t)
	// kproxy's replay has synced the namespace (admin's dry-run create of
	// a configmap in it is predicted); the token is used only once, below:
	// a token the replay authenticated earlier is cached.
	waitPredicted(t, recs, r, c, request{method: "POST", path: "/api/v1/namespaces/" + ns + "/configmaps?dryRun=All", user: "admin",
		body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"probe"}}`})
	queueWrites(t, r, c, 40)
	got := do(t, c, r.base, request{method: "GET", path: "/api/v1/namespaces/" + ns + "/configmaps",
		header: http.Header{"Authorization": {"Bearer " + tr.Status.Token}}})
	if got.status != 403 {
		t.Fatalf("the pod's token: answered %d, want 403 (authenticated, not allowed): %s", got.status, got.body)
	}
	if err := cs.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	seen := 0
	for range 41 {
		rec := nextRecord(t, recs)
		if rec.Request.Namespace != ns {
			continue
		}
		seen++
		if rec.Predicted.Stage != record.StageUnknown || !strings.Contains(rec.Predicted.Message, "the object the token is bound to") {
			t.Errorf("the pod's token, answered %d, replayed after the pod was deleted: predicted %+v, want unknown naming the bound object",
				rec.Actual.Status, rec.Predicted)
		}
		if st := stageNamed(rec, record.StageAuthentication); !strings.Contains(st.Explanation, "service account token has been invalidated") {
			t.Errorf("authentication does not say what it read now: %s", st.Explanation)
		}
	}
	if seen != 1 {
		t.Errorf("%d records of the request in %s", seen, ns)
	}
}
