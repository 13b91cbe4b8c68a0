package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/pki"
	"github.com/kproxy/kproxy/internal/record"
)

// TestImpersonationSuccessCache: kube-apiserver's constrained
// impersonation keeps a success 10 s (for each mode, by caller and wanted
// user), without asking the authorizer again (found by a probe).
//   - A certificate caller, whose impersonation kproxy decides itself:
//     allowed through kproxy, then its binding deleted; directly it is
//     refused at once (the apiserver's cache never saw it), and through
//     kproxy it had been allowed for 10 s more from kproxy's own filter's
//     cache: more access than directly. It is refused now.
//   - A token caller, whose impersonation the apiserver decides: allowed
//     directly, then its binding deleted; through kproxy the apiserver
//     still allows it from its cache (201), which the replay, reading
//     RBAC as it is, had predicted 403. It says unknown now, naming the
//     cache.
func TestImpersonationSuccessCache(t *testing.T) {
	ctx := context.Background()
	const role = "cache-impersonate-user-info"
	if err := localcluster.Apply(ctx, adminClient(), &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"users"}, Verbs: []string{"impersonate:user-info"}},
			{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"selfsubjectreviews"}, Verbs: []string{"impersonate-on:user-info:create"}},
		},
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = adminClient().RbacV1().ClusterRoles().Delete(context.Background(), role, metav1.DeleteOptions{})
	})
	bind := func(name string, subject rbacv1.Subject) {
		t.Helper()
		if err := localcluster.Apply(ctx, adminClient(), &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{subject},
		}); err != nil {
			t.Fatal(err)
		}
	}
	unbind := func(name string) {
		t.Helper()
		if err := adminClient().RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	stream := record.NewStream()
	recs, _, cancel := stream.Subscribe(64)
	t.Cleanup(cancel)
	k := startKproxy(t, kproxyOptions{stream: stream})
	through, direct := reverseH2Route(k), directRoute()
	direct.h2 = true

	// A certificate caller, allowed through kproxy, then revoked.
	cu := matrixCert{cert: issue(t, cluster.CA, pki.Leaf{CommonName: "cache-cu"})}
	as := hdr("Impersonate-User", "cache-wanted")
	bind("cache-cu", userSubject("cache-cu"))
	if got := sendSSR(t, matrixClient(through, cu.cert), through.base, as); got.status != http.StatusCreated {
		t.Fatalf("a certificate caller impersonating through kproxy: %d %s, want 201", got.status, got.body)
	}
	nextRecord(t, recs)
	revoked := time.Now()
	unbind("cache-cu")
	// Wait for the apiserver's authorizer to see the delete by asking it
	// (a SubjectAccessReview is not cached), not by impersonating: a
	// direct impersonation allowed before its RBAC informer caught up
	// would be cached for 10 s itself, and the comparison lost.
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 5*time.Second, true, func(ctx context.Context) (bool, error) {
		sar, err := adminClient().AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User: "cache-cu",
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Group: "authentication.k8s.io", Resource: "users", Verb: "impersonate:user-info", Name: "cache-wanted",
				},
			},
		}, metav1.CreateOptions{})
		return err == nil && !sar.Status.Allowed, nil
	})
	if err != nil {
		t.Fatalf("the apiserver's authorizer still allows the certificate caller after its binding was deleted: %v", err)
	}
	if got := sendSSR(t, matrixClient(direct, cu.cert), direct.base, as); got.status != http.StatusForbidden {
		t.Fatalf("the certificate caller revoked, directly: %d %s, want 403", got.status, got.body)
	}
	got := sendSSR(t, matrixClient(through, cu.cert), through.base, as)
	if since := time.Since(revoked); since >= 10*time.Second {
		t.Fatalf("the test took %v after the revocation, past the 10 s a cached success lasts: it proves nothing", since)
	}
	if got.status != http.StatusForbidden {
		t.Errorf("a certificate caller revoked, refused directly, through kproxy: %d %s, want 403 (a success kproxy remembered)", got.status, got.body)
	}
	nextRecord(t, recs)

	// A token caller, allowed directly, then revoked: the apiserver keeps
	// allowing it for 10 s.
	bearer := hdr("Authorization", "Bearer "+tokenOf("alice"))
	bind("cache-alice", userSubject("alice"))
	if got := sendSSR(t, matrixClient(direct, nil), direct.base, bearer, as); got.status != http.StatusCreated {
		t.Fatalf("alice impersonating directly: %d %s, want 201", got.status, got.body)
	}
	unbind("cache-alice")
	time.Sleep(time.Second) // kproxy's informer sees the delete
	got = sendSSR(t, matrixClient(through, nil), through.base, bearer, as)
	if got.status != http.StatusCreated {
		t.Fatalf("alice revoked a second ago, through kproxy: %d %s, want 201 from the apiserver's cache of successes", got.status, got.body)
	}
	rec := nextRecord(t, recs)
	if p := rec.Predicted; p.Stage != record.StageUnknown || !strings.Contains(p.Message, "constrained impersonation keeps a success 10s") {
		t.Errorf("alice allowed from the apiserver's cache: predicted %d at %s %q, want unknown naming the cache", p.Status, p.Stage, p.Message)
	}
}
