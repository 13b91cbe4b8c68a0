package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// TestCSRApprovalRBACChangedAfterRequest: bob approves a
// CertificateSigningRequest of a custom signer, with RBAC that lets him
// update its approval (the authorization stage) and approve for the signer
// (the CertificateApproval admission plugin asks the authorizer), and the
// second grant is deleted right after. The apiserver allowed it (200); the
// replay, behind queued writes, read RBAC after the delete and had its
// CertificateApproval refuse it, 403 predicted (a probe, 1 of 1). Admission
// plugins that ask the authorizer now count RBAC changed after the
// request as the authorization stage does: unknown, naming the change.
func TestCSRApprovalRBACChangedAfterRequest(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	recs, r, c := oneReplayWorker(t)
	const signer = "e2e.kproxy.test/late"
	name := fmt.Sprintf("csr-rbac-late-%d", time.Now().UnixNano()%1e6)
	clusterRole := func(suffix string, rule rbacv1.PolicyRule) string {
		t.Helper()
		n := name + "-" + suffix
		if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: n}, Rules: []rbacv1.PolicyRule{rule}}, createOpts); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.RbacV1().ClusterRoles().Delete(context.Background(), n, metav1.DeleteOptions{}) })
		return n
	}
	bind := func(role string) {
		t.Helper()
		if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "bob"}}}, createOpts); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), role, metav1.DeleteOptions{})
		})
	}
	bind(clusterRole("update", rbacv1.PolicyRule{APIGroups: []string{certificatesv1.GroupName}, Resources: []string{"certificatesigningrequests", "certificatesigningrequests/approval"}, Verbs: []string{"get", "update", "patch"}}))
	approver := clusterRole("approve", rbacv1.PolicyRule{APIGroups: []string{certificatesv1.GroupName}, Resources: []string{"signers"}, ResourceNames: []string{signer}, Verbs: []string{"approve"}})

	approve := func(csr string, dryRun bool) request {
		q := ""
		if dryRun {
			q = "?dryRun=All"
		}
		return request{method: "PATCH", path: "/apis/certificates.k8s.io/v1/certificatesigningrequests/" + csr + "/approval" + q, user: "bob",
			contentType: "application/json-patch+json", body: `[{"op":"add","path":"/status/conditions","value":[{"type":"Approved","status":"True","reason":"E2E","message":"approved by the test"}]}]`}
	}
	late := 0
	for try := 1; try <= 3 && late == 0; try++ {
		csr := servingCSR(t, "late")
		csr.GenerateName, csr.Name = "", fmt.Sprintf("%s-%d", name, try)
		csr.Spec.SignerName = signer
		if _, err := cs.CertificatesV1().CertificateSigningRequests().Create(ctx, csr, createOpts); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cs.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), csr.Name, metav1.DeleteOptions{})
		})
		bind(approver)
		// kproxy's replay has the grant: bob's approval, in dry run, is
		// predicted as the apiserver allows it.
		waitPredicted(t, recs, r, c, approve(csr.Name, true))
		queueWrites(t, r, c, 40)
		if got := do(t, c, r.base, approve(csr.Name, false)); got.status != 200 {
			t.Fatalf("bob approving %s: %d %s", csr.Name, got.status, got.body)
		}
		if err := cs.RbacV1().ClusterRoleBindings().Delete(ctx, approver, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		lateRecs, seen := tallyLate(t, recs, 41, func(rec *record.Record) bool { return rec.Request.Resource == "certificatesigningrequests" },
			"kproxy saw RBAC (which admission's authorizer checks read) change after this request arrived", "the deletion of bob's grant to approve")
		if seen != 1 {
			t.Errorf("%d records of the approval", seen)
		}
		for _, rec := range lateRecs {
			saysAt(t, rec, "which admission's authorizer checks read", record.StageValidatingAdmission)
		}
		late += len(lateRecs)
	}
	if late == 0 {
		t.Errorf("no approval replayed after the grant's deletion in 3 tries: the path under test was not taken")
	}
}
