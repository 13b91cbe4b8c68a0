package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// TestRBACChangedAfterRequest: requests replayed late, behind 40 queued
// writes, after RBAC changed. alice deletes the RoleBinding that lets her
// delete it: the apiserver allowed it (200), and the replay, reading RBAC
// after the delete, had predicted 403 at authorization. bob's list of
// secrets is refused (403), and then bob is granted it: the replay had
// predicted 200. alice, impersonating a user she may impersonate until
// the binding is deleted right after, had been predicted 403 at
// impersonation, and so had her list of secrets as that user, refused by
// the authorizer past impersonation (the status right, the stage wrong).
// All say unknown now, naming the change.
func TestRBACChangedAfterRequest(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	recs, r, c := oneReplayWorker(t)
	// attempt sets the state up in a namespace of its own, sends the three
	// requests behind queued writes, changes RBAC right after, and counts
	// the records that said unknown for the change. A replay that still
	// ran before the change (kproxy's informers are quick) must predict
	// the answer.
	attempt := func() (late int) {
		ns := lateNamespace(t, "rbac-late")
		role := func(name, resource string, verbs ...string) {
			t.Helper()
			nsRole(t, ns, name, rbacv1.PolicyRule{APIGroups: []string{rbacv1.GroupName, ""}, Resources: []string{resource}, Verbs: verbs})
		}
		bind := func(name, roleName, user string) { t.Helper(); nsBind(t, ns, name, roleName, user) }
		role("binding-admin", "rolebindings", "*")
		bind("alice-self", "binding-admin", "alice")
		role("secret-reader", "secrets", "list", "watch")

		// alice may impersonate this namespace's user (cluster-scoped: users).
		who := ns + "-user"
		if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: ns},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"users"}, ResourceNames: []string{who}, Verbs: []string{"impersonate"}}}}, createOpts); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: ns},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"}}}, createOpts); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), ns, metav1.DeleteOptions{})
			_ = cs.RbacV1().ClusterRoles().Delete(context.Background(), ns, metav1.DeleteOptions{})
		})
		impersonating := request{method: "GET", path: "/version", user: "alice", header: http.Header{"Impersonate-User": {who}}}
		// As that user, alice may not list secrets: past impersonation,
		// the authorizer refuses the user she impersonates.
		impersonatingList := request{method: "GET", path: "/api/v1/namespaces/" + ns + "/secrets", user: "alice", header: http.Header{"Impersonate-User": {who}}}
		// And bob's watch, refused just before he is granted it: a watch
		// gives its status as its answer begins, and is checked as any
		// request (a probe: predicted 200 for the apiserver's 403).
		bobWatch := request{method: "GET", path: "/api/v1/namespaces/" + ns + "/secrets?watch=1&timeoutSeconds=1", user: "bob"}
		// kproxy's replay has synced: alice may delete bindings and
		// impersonate, bob may not list secrets, all predicted.
		waitPredicted(t, recs, r, c, request{method: "GET", path: "/apis/rbac.authorization.k8s.io/v1/namespaces/" + ns + "/rolebindings/alice-self", user: "alice"})
		waitPredicted(t, recs, r, c, request{method: "GET", path: "/api/v1/namespaces/" + ns + "/secrets", user: "bob"})
		waitPredicted(t, recs, r, c, impersonating)
		waitPredicted(t, recs, r, c, impersonatingList)
		waitPredicted(t, recs, r, c, bobWatch)

		queueWrites(t, r, c, 40)
		if got := do(t, c, r.base, request{method: "DELETE", path: "/apis/rbac.authorization.k8s.io/v1/namespaces/" + ns + "/rolebindings/alice-self", user: "alice"}); got.status != 200 {
			t.Fatalf("alice deleting her own binding: %d %s", got.status, got.body)
		}
		if got := do(t, c, r.base, request{method: "GET", path: "/api/v1/namespaces/" + ns + "/secrets", user: "bob"}); got.status != 403 {
			t.Fatalf("bob listing secrets: %d %s", got.status, got.body)
		}
		if got := do(t, c, r.base, impersonating); got.status != 200 {
			t.Fatalf("alice as %s: %d %s", who, got.status, got.body)
		}
		if got := do(t, c, r.base, impersonatingList); got.status != 403 {
			t.Fatalf("alice as %s listing secrets: %d %s", who, got.status, got.body)
		}
		if got := do(t, c, r.base, bobWatch); got.status != 403 {
			t.Fatalf("bob watching secrets: %d %s", got.status, got.body)
		}
		bind("bob-reads", "secret-reader", "bob")
		if err := cs.RbacV1().ClusterRoleBindings().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		lateRecs, seen := tallyLate(t, recs, 45, func(rec *record.Record) bool { return rec.Request.Namespace == ns || rec.Request.Path == "/version" },
			"kproxy saw RBAC change after this request arrived", "an RBAC change")
		late = len(lateRecs)
		if seen != 5 {
			t.Errorf("%d records of the five requests", seen)
		}
		return late
	}
	late := 0
	for i := 0; i < 5 && late < 5; i++ {
		late += attempt()
	}
	if late < 5 {
		t.Errorf("%d of the requests replayed after the RBAC change in 5 attempts, want 5: the path under test was not taken", late)
	}
}

// nsRole creates a Role of one rule in ns.
func nsRole(t *testing.T, ns, name string, rule rbacv1.PolicyRule) {
	t.Helper()
	if _, err := adminClient().RbacV1().Roles(ns).Create(context.Background(), &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{rule}}, createOpts); err != nil {
		t.Fatal(err)
	}
}

// nsBind binds user to the Role roleName in ns.
func nsBind(t *testing.T, ns, name, roleName, user string) {
	t.Helper()
	if _, err := adminClient().RbacV1().RoleBindings(ns).Create(context.Background(), &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: roleName},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}, createOpts); err != nil {
		t.Fatal(err)
	}
}

// tallyLate reads n records and sorts those keep picks: late when they
// say unknown with the phrase, in time when predicted as answered (status
// and message); any other prediction fails the test, described by around
// (what changed around the request). It returns the late records and how
// many it picked.
func tallyLate(t *testing.T, recs <-chan *record.Record, n int, keep func(*record.Record) bool, phrase, around string) (late []*record.Record, seen int) {
	t.Helper()
	for range n {
		rec := nextRecord(t, recs)
		if !keep(rec) {
			continue
		}
		seen++
		switch {
		case rec.Predicted.Stage == record.StageUnknown && strings.Contains(rec.Predicted.Message, phrase):
			late = append(late, rec)
		case rec.Predicted.Stage != record.StageUnknown && rec.Predicted.Status == rec.Actual.Status && rec.Predicted.Message == rec.Actual.Message:
			// replayed before the change
		default:
			t.Errorf("%s %s by %s, answered %d %q, replayed around %s: predicted %+v, want the answer or unknown saying %q",
				rec.Request.Method, rec.Request.Path, rec.Request.User, rec.Actual.Status, rec.Actual.Message, around, rec.Predicted, phrase)
		}
	}
	return late, seen
}

// saysAt checks that the stage that says a record's unknown (its
// explanation holding phrase) is stage, and no other says it: the
// stages before it passed, the ones after it "not replayed".
func saysAt(t *testing.T, rec *record.Record, phrase, stage string) {
	t.Helper()
	var at []string
	for _, st := range rec.Stages {
		if strings.Contains(st.Explanation, phrase) {
			at = append(at, st.Name)
		}
	}
	if len(at) != 1 || at[0] != stage {
		t.Errorf("%s %s by %s: %q said by %v, want %s alone", rec.Request.Method, rec.Request.Path, rec.Request.User, phrase, at, stage)
	}
}

// inNamespace picks the records of ns's requests.
func inNamespace(ns string) func(*record.Record) bool {
	return func(rec *record.Record) bool { return rec.Request.Namespace == ns }
}

// lateNamespace is a namespace of the test's own, named prefix-N, deleted
// after it.
func lateNamespace(t testing.TB, prefix string) string {
	t.Helper()
	ns := fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()%1e6)
	if _, err := adminClient().CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, createOpts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = adminClient().CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	return ns
}

// podNamespace is lateNamespace with the default ServiceAccount a pod
// create needs (no controller manager makes it here).
func podNamespace(t *testing.T, prefix string) string {
	t.Helper()
	ns := lateNamespace(t, prefix)
	if _, err := adminClient().CoreV1().ServiceAccounts(ns).Create(context.Background(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, createOpts); err != nil {
		t.Fatal(err)
	}
	return ns
}

// queueWrites sends n dry-run creates at once: their replays queue ahead
// of the next requests' (writes' replays go first).
func queueWrites(t *testing.T, r route, c *http.Client, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			do(t, c, r.base, request{method: "POST", path: "/api/v1/namespaces/" + testNS + "/configmaps?dryRun=All", user: "admin",
				body: fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"queued-%d"}}`, i)})
		})
	}
	wg.Wait()
}

// waitPredicted sends req until its record's prediction is the
// apiserver's answer (kproxy's replay has synced the state it reads).
func waitPredicted(t *testing.T, recs <-chan *record.Record, r route, c *http.Client, req request) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		do(t, c, r.base, req)
		rec := nextRecord(t, recs)
		if rec.Predicted.Stage != record.StageUnknown && rec.Predicted.Status == rec.Actual.Status {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("kproxy's replay of %s %s: predicted %+v, answered %d", req.method, req.path, rec.Predicted, rec.Actual.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestNodeGraphChangedAfterRequest: node1 (its kubelet's certificate)
// reads the secret of a pod bound to it, replayed late, behind 40 queued
// writes, after the pod is deleted: the apiserver's Node authorizer
// allowed it (200), and the replay's, whose graph no longer has the pod,
// had predicted 403. It says unknown now, naming the Node authorizer's
// graph.
func TestNodeGraphChangedAfterRequest(t *testing.T) {
	f := setupFixtures(t)
	ctx := context.Background()
	cs := adminClient()
	ns := podNamespace(t, "node-late")
	recs, r, c := oneReplayWorker(t)
	kubelet := r.client(f.certs["cert:node1"])
	// attempt binds a new pod with a secret of its own to node1, reads the
	// secret as node1 behind queued writes, deletes the pod right after,
	// and reports whether the read's replay ran after the deletion; one
	// that still ran before it must predict the answer.
	attempt := func(i int) (late bool) {
		name := fmt.Sprintf("app-%d", i)
		if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: map[string]string{"k": "v"}}, createOpts); err != nil {
			t.Fatal(err)
		}
		noToken := false
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{NodeName: "node1", AutomountServiceAccountToken: &noToken,
			Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
				EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}}}}}}}}, createOpts); err != nil {
			t.Fatal(err)
		}
		secret := request{method: "GET", path: "/api/v1/namespaces/" + ns + "/secrets/" + name}
		waitPredicted(t, recs, r, kubelet, secret)

		queueWrites(t, r, c, 40)
		if got := do(t, kubelet, r.base, secret); got.status != 200 {
			t.Fatalf("node1 reading its pod's secret: %d %s", got.status, got.body)
		}
		if err := cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		lateRecs, seen := tallyLate(t, recs, 41, inNamespace(ns), "kproxy saw the Node authorizer's graph (pods, nodes, volumes) change", "the pod's deletion")
		if seen != 1 {
			t.Errorf("%d records of the read", seen)
		}
		return len(lateRecs) > 0
	}
	late := false
	for i := 0; i < 5 && !late; i++ {
		late = attempt(i)
	}
	if !late {
		t.Errorf("no read of the 5 pods' secrets replayed after its pod's deletion: the path under test was not taken")
	}
}
