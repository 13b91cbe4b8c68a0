package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// TestLimitRangeOrder: two LimitRanges in a namespace, one giving a
// container a default CPU limit of 2, the other capping CPU at 1 with a
// default of 500m. LimitRanger applies them in an order it draws for
// each request: the first to default the limit sets it, so a pod without
// resources is admitted (500m) or refused (2 over the cap of 1) as the
// draw goes, in the apiserver and, independently, in the replay. Where
// the two draws differ the record says unknown; where they agree the
// prediction is the apiserver's answer. The draw is not even (through
// kproxy demo the apiserver refused 12 creates of 16), so the two differ
// on about three creates in eight: thirty-two creates miss the path
// under test about once in three million runs.
func TestLimitRangeOrder(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	ns := podNamespace(t, "limit-order")
	cpu := func(q string) corev1.ResourceList {
		return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(q)}
	}
	for _, lr := range []*corev1.LimitRange{
		{ObjectMeta: metav1.ObjectMeta{Name: "defaults-high"}, Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{
			{Type: corev1.LimitTypeContainer, Default: cpu("2"), DefaultRequest: cpu("100m")}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "caps"}, Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{
			{Type: corev1.LimitTypeContainer, Max: cpu("1"), Default: cpu("500m"), DefaultRequest: cpu("100m")}}}},
	} {
		if _, err := cs.CoreV1().LimitRanges(ns).Create(ctx, lr, createOpts); err != nil {
			t.Fatal(err)
		}
	}
	// Past the seconds in which a change of LimitRanges makes an admission
	// verdict unknown (admission_late.go).
	time.Sleep(3 * time.Second)

	recs, r, c := oneReplayWorker(t)
	coinFlips(t, 32, "LimitRanger applies a namespace's LimitRanges in an order it draws again for each request", func(try int) *record.Record {
		return sendForRecord(t, recs, r, c, ns, []int{201, 403}, request{method: "POST", path: "/api/v1/namespaces/" + ns + "/pods", user: "admin",
			body: fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"try-%d"},"spec":{"containers":[{"name":"c","image":"busybox"}]}}`, try)})
	})
}
