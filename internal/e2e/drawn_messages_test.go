package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// TestDrawnMessages: refusals whose wording kube-apiserver leaves to
// chance, the status and the errors fixed: LimitRanger's errors for one
// container, listed walking its LimitRange's maps; RBAC's list of the
// roles a caller's bindings name and nobody created, in its informer's
// order; the name generateName draws, named by a refusal of the object.
// The replay draws again, so its message may differ from the
// apiserver's in that order or name only: record.SameMessage calls them
// the same, which the what-if diff (kproxy test run --overlay) and the
// TUI's re-run rely on. Each record must agree with the apiserver's
// answer in status and reason, and in message up to that; the orders
// must differ at least once in 32 tries (each order came back about one
// time in four straight from the apiserver: a miss is about one run in
// three million).
func TestDrawnMessages(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	ns := podNamespace(t, "drawn")
	if _, err := cs.CoreV1().LimitRanges(ns).Create(ctx, &corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: "caps"}, Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{
		{Type: corev1.LimitTypeContainer, Max: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("128Mi")}}}}}, createOpts); err != nil {
		t.Fatal(err)
	}
	// carol's bindings here name roles that do not exist (a role deleted,
	// a binding applied before its role).
	for _, b := range []struct{ name, kind string }{{"gone-a", "ClusterRole"}, {"gone-b", "ClusterRole"}, {"gone-c", "Role"}} {
		if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: b.name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: b.kind, Name: b.name},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "carol"}}}, createOpts); err != nil {
			t.Fatal(err)
		}
	}
	// Past the seconds in which a change of LimitRanges or RBAC makes a
	// verdict unknown (admission_late.go, rbac_late.go).
	time.Sleep(3 * time.Second)
	recs, r, c := oneReplayWorker(t)

	t.Run("LimitRanger's errors", func(t *testing.T) {
		drawnWording(t, 32, func(try int) *record.Record {
			return sendForRecord(t, recs, r, c, ns, []int{403}, request{method: "POST", path: "/api/v1/namespaces/" + ns + "/pods", user: "admin",
				body: fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"over-%d"},"spec":{"containers":[{"name":"c","image":"busybox","resources":{"limits":{"cpu":"1","memory":"256Mi"}}}]}}`, try)})
		})
	})
	t.Run("RBAC's missing roles", func(t *testing.T) {
		drawnWording(t, 32, func(int) *record.Record {
			return sendForRecord(t, recs, r, c, ns, []int{403}, request{method: "GET", path: "/api/v1/namespaces/" + ns + "/secrets", user: "carol"})
		})
	})
	t.Run("a generated name", func(t *testing.T) {
		drawnWording(t, 1, func(int) *record.Record {
			return sendForRecord(t, recs, r, c, ns, []int{422}, request{method: "POST", path: "/api/v1/namespaces/" + ns + "/configmaps", user: "admin",
				body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"generateName":"drawn-"},"data":{"bad key":"x"}}`})
		})
	})
}

// drawnWording sends up to tries requests (try) until the replay's
// message and the apiserver's differ in text, and fails unless every
// prediction is the apiserver's answer in status and reason, and in
// message up to record.SameMessage, and unless the texts differed once.
func drawnWording(t *testing.T, tries int, try func(n int) *record.Record) {
	t.Helper()
	worded := 0
	for n := 1; n <= tries && worded == 0; n++ {
		rec := try(n)
		p, a := rec.Predicted, rec.Actual
		switch {
		case p.Stage == record.StageUnknown:
			t.Errorf("try %d: unknown: %s", n, p.Message)
		case p.Status != a.Status || p.Reason != a.Reason || !record.SameMessage(p.Message, a.Message):
			t.Errorf("try %d: predicted %d %s %q, the apiserver answered %d %s %q", n, p.Status, p.Reason, p.Message, a.Status, a.Reason, a.Message)
		case p.Message != a.Message:
			worded++
			t.Logf("try %d: the same refusal, worded apart:\n  replay:    %s\n  apiserver: %s", n, p.Message, a.Message)
		}
	}
	if worded == 0 {
		t.Errorf("in %d tries the replay worded every refusal as the apiserver did: the path under test was not taken", tries)
	}
}
