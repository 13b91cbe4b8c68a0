package e2e

import (
	"context"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// TestEscalationChangedAfterRequest: alice, who may write RoleBindings
// but not read secrets, binds dave to a Role that reads secrets: the RBAC
// registry refuses it (403, "attempting to grant RBAC permissions not
// currently held"); alice is granted that Role right after. Replayed
// behind queued writes, the escalation check met alice holding it and
// predicted 201 (found by a probe: 3 of 8 tries). It says unknown,
// naming the RBAC change, at authorization; the reverse (allowed, then
// revoked) likewise.
func TestEscalationChangedAfterRequest(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	recs, r, c := oneReplayWorker(t)
	attempt := func() (late int) {
		ns := lateNamespace(t, "escalation-late")
		role := func(name string, rule rbacv1.PolicyRule) { t.Helper(); nsRole(t, ns, name, rule) }
		bind := func(name, roleName, user string) { t.Helper(); nsBind(t, ns, name, roleName, user) }
		role("binding-writer", rbacv1.PolicyRule{APIGroups: []string{rbacv1.GroupName}, Resources: []string{"rolebindings"}, Verbs: []string{"*"}})
		role("secret-reader", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}})
		role("cm-reader", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get"}})
		bind("alice-writes", "binding-writer", "alice")
		bind("alice-reads-cm", "cm-reader", "alice")
		grant := func(name, roleName string) request {
			return request{method: "POST", path: "/apis/rbac.authorization.k8s.io/v1/namespaces/" + ns + "/rolebindings", user: "alice",
				body: `{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding","metadata":{"name":"` + name + `"},` +
					`"roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"Role","name":"` + roleName + `"},` +
					`"subjects":[{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"dave"}]}`}
		}
		// Synced: alice's dry runs of both are predicted.
		dry := func(q request) request { q.path += "?dryRun=All"; return q }
		waitPredicted(t, recs, r, c, dry(grant("probe-secrets", "secret-reader")))
		waitPredicted(t, recs, r, c, dry(grant("probe-cm", "cm-reader")))

		queueWrites(t, r, c, 40)
		if got := do(t, c, r.base, grant("dave-secrets", "secret-reader")); got.status != 403 {
			t.Fatalf("alice granting a Role she lacks: %d %s", got.status, got.body)
		}
		if got := do(t, c, r.base, grant("dave-cm", "cm-reader")); got.status != 201 {
			t.Fatalf("alice granting a Role she holds: %d %s", got.status, got.body)
		}
		bind("alice-reads-secrets", "secret-reader", "alice")
		if err := cs.RbacV1().RoleBindings(ns).Delete(ctx, "alice-reads-cm", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		lateRecs, seen := tallyLate(t, recs, 42, func(rec *record.Record) bool { return rec.Request.Namespace == ns },
			"kproxy saw RBAC change after this request arrived", "an RBAC change")
		for _, rec := range lateRecs {
			saysAt(t, rec, "kproxy saw RBAC change after this request arrived", record.StageAuthorization)
		}
		if seen != 2 {
			t.Errorf("%d records of the two requests", seen)
		}
		return len(lateRecs)
	}
	late := 0
	for i := 0; i < 5 && late < 4; i++ {
		late += attempt()
	}
	if late < 4 {
		t.Errorf("%d of the requests replayed after the RBAC change in 5 attempts, want 4: the path under test was not taken", late)
	}
}
