package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

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

// TestDeleteMarkedThenDeletedByAnother: a terminal pod (Succeeded, bound
// to a node nobody runs) deleted by the garbage collector's delete (uid
// and resourceVersion preconditions) while a kubelet's delete (grace
// period 0, uid precondition) lands between the first delete's mark and
// its own deletion: the apiserver answers the first 200, with the marked
// pod and no resourceVersion. The replay read the pod as it last was
// before its deletion, the first delete's own mark, and refused the
// precondition: 409 predicted for 200 (probe R, 2026-12-07: 2 of the
// garbage collector's 147 pod deletes, and 21 of 60 tries of a race). Both
// go through kproxy, as many times as it takes to race.
func TestDeleteMarkedThenDeletedByAnother(t *testing.T) {
	ctx := context.Background()
	ns := podNamespace(t, "delete-raced")
	recs, r, c := oneReplayWorker(t)
	cs := adminClient()
	raced, answered := 0, 0
	for i := 0; i < 60 && raced < 3; i++ {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i)},
			Spec: corev1.PodSpec{NodeName: "kproxy-test-ghost-node", Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
		pod, err := cs.CoreV1().Pods(ns).Create(ctx, pod, createOpts)
		if err != nil {
			t.Fatal(err)
		}
		pod.Status.Phase = corev1.PodSucceeded
		if pod, err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		body := fmt.Sprintf(`{"apiVersion":"v1","kind":"DeleteOptions","preconditions":{"uid":%q,"resourceVersion":%q},"propagationPolicy":"Background"}`, pod.UID, pod.ResourceVersion)
		path := "/api/v1/namespaces/" + ns + "/pods/" + pod.Name
		var wg sync.WaitGroup
		wg.Go(func() {
			// The kubelet's, through kproxy too: both take the same way.
			time.Sleep(time.Duration(i%20) * 250 * time.Microsecond)
			kubelet := fmt.Sprintf(`{"apiVersion":"v1","kind":"DeleteOptions","gracePeriodSeconds":0,"preconditions":{"uid":%q}}`, pod.UID)
			req, _ := http.NewRequestWithContext(ctx, "DELETE", r.base+path, strings.NewReader(kubelet))
			req.Header.Set("Authorization", "Bearer "+tokenOf("admin"))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := c.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
		got := do(t, c, r.base, request{method: "DELETE", path: path, user: "admin", body: body})
		wg.Wait()
		rec := waitRecord(t, recs, got.header.Get("Audit-Id"))
		if got.status != 200 {
			continue // the kubelet's delete came first: 404 or 409
		}
		answered++
		var head struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		_ = json.Unmarshal(got.body, &head)
		if head.Metadata.ResourceVersion == "" {
			raced++
		}
		if p := rec.Predicted; p.Stage == record.StageUnknown || p.Status != 200 {
			t.Errorf("delete %s (answered with resourceVersion %q): predicted %d (stage %s) %q, the apiserver answered 200",
				pod.Name, head.Metadata.ResourceVersion, p.Status, p.Stage, p.Message)
		}
	}
	t.Logf("%d deletes answered 200, %d of them raced by the kubelet's (no resourceVersion in the answer)", answered, raced)
	if raced == 0 {
		t.Errorf("no delete raced the kubelet's in 60 tries: the case this test is for did not happen")
	}
}
