package e2e

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// TestDeleteMarkedThenDeleted: a pod that is not scheduled is deleted at
// once, in two writes of one request: the registry marks it
// (deletionTimestamp, grace period 0), then deletes it, moving the
// request's resourceVersion precondition onto the mark. The replay read
// the pod just before the deletion, found the request's own mark, and
// refused the precondition (409 for 200), or said unknown blaming another
// write (probe D, 2026-12-06: the garbage collector's deletes of finished
// Jobs' pods, 3 confidently wrong and 70 unknown). Each delete, with uid
// and resourceVersion preconditions as the garbage collector sends them,
// is predicted as answered.
func TestDeleteMarkedThenDeleted(t *testing.T) {
	ctx := context.Background()
	ns := podNamespace(t, "delete-marked")
	recs, r, c := oneReplayWorker(t)
	cs := adminClient()
	const pods = 6
	for i := range pods {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i)},
			Spec: corev1.PodSpec{NodeSelector: map[string]string{"kproxy.test/nowhere": "x"}, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, createOpts); err != nil {
			t.Fatal(err)
		}
	}
	for i := range pods {
		pod, err := cs.CoreV1().Pods(ns).Get(ctx, fmt.Sprintf("p%d", i), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		body := fmt.Sprintf(`{"apiVersion":"v1","kind":"DeleteOptions","preconditions":{"uid":%q,"resourceVersion":%q},"propagationPolicy":"Background"}`, pod.UID, pod.ResourceVersion)
		rec := sendForRecord(t, recs, r, c, ns, []int{200}, request{method: "DELETE", path: "/api/v1/namespaces/" + ns + "/pods/" + pod.Name, user: "admin", body: body})
		if p := rec.Predicted; p.Stage == record.StageUnknown || p.Status != 200 {
			t.Errorf("delete %s: predicted %d (stage %s) %q, the apiserver answered %d", pod.Name, p.Status, p.Stage, p.Message, rec.Actual.Status)
		}
	}
}
