package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/pki"
	"github.com/kproxy/kproxy/internal/record"
)

// TestIdentitiesForwardedExactly: kproxy forwards a certificate caller
// (and a front proxy's) by impersonation, and what the apiserver makes of
// the impersonation headers must be the caller as it sees it directly.
// A probe got more through kproxy than directly, three ways: a
// certificate for system:anonymous got system:unauthenticated (and with
// it /healthz and /version); one named like a service account got the
// service account's groups (and a secret they could read); a group with a
// space before it, " system:masters", reached the apiserver trimmed, as
// system:masters (HTTP/1.1 trims the spaces around a header's value),
// and so did an Impersonate-Group a caller sent over HTTP/2. Each caller
// sends a SelfSubjectReview (who the apiserver says it is) directly and
// through kproxy (reverse and forward mode), over HTTP/1.1 and HTTP/2,
// and must get the direct answer; where no impersonation carries the
// caller exactly (system:anonymous without system:unauthenticated, a
// control character), kproxy refuses it itself, never forwards it as
// someone else.
func TestIdentitiesForwardedExactly(t *testing.T) {
	ctx := context.Background()
	// dave (certificate) and alice (token) may impersonate erin, and the
	// group " padded" (a space before it), and nothing else.
	role := "exact-impersonate-padded"
	if err := localcluster.Apply(ctx, adminClient(), &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"users"}, Verbs: []string{"impersonate"}, ResourceNames: []string{"erin"}},
			{APIGroups: []string{""}, Resources: []string{"groups"}, Verbs: []string{"impersonate"}, ResourceNames: []string{" padded"}},
		},
	}); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.Apply(ctx, adminClient(), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{userSubject("dave"), userSubject("alice")},
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = adminClient().RbacV1().ClusterRoleBindings().Delete(context.Background(), role, metav1.DeleteOptions{})
		_ = adminClient().RbacV1().ClusterRoles().Delete(context.Background(), role, metav1.DeleteOptions{})
	})
	fp, err := cluster.FrontProxyClient()
	if err != nil {
		t.Fatal(err)
	}
	cert := func(cn string, groups ...string) matrixCert {
		return matrixCert{cert: issue(t, cluster.CA, pki.Leaf{CommonName: cn, Organization: groups})}
	}
	front := func(kv ...string) matrixCert { return matrixCert{cert: &fp, remote: hdr(kv...)} }
	dave := cert("dave", "devs")
	bearer := hdr("Authorization", "Bearer "+tokenOf("alice"))
	const refused = "kproxy cannot forward this request as its caller"
	stream := record.NewStream()
	recs, _, cancel := stream.Subscribe(256)
	t.Cleanup(cancel)
	k := startKproxy(t, kproxyOptions{stream: stream})
	kf := startKproxy(t, kproxyOptions{stream: stream, mode: "forward"})
	for _, tc := range []struct {
		name    string
		caller  matrixCert
		headers http.Header
		refuse  string // kproxy refuses it itself, saying this
		h1only  bool   // a header HTTP/2 has not
	}{
		{name: "a certificate for system:anonymous", caller: cert("system:anonymous"), refuse: "adds the group system:unauthenticated"},
		{name: "a certificate for system:anonymous in system:unauthenticated", caller: cert("system:anonymous", "system:unauthenticated")},
		{name: "a certificate named like a service account", caller: cert("system:serviceaccount:default:ghost")},
		{name: "a certificate named like a node, not in system:nodes", caller: cert("system:node:n9")},
		{name: "a certificate in the group \" system:masters\"", caller: cert("eve", " system:masters")},
		{name: "a certificate named \" system:kube-controller-manager\"", caller: cert(" system:kube-controller-manager")},
		{name: "a certificate with a control character", caller: cert("eve\x7f"), refuse: "no HTTP header can carry"},
		{name: "a front proxy's system:anonymous", caller: front("X-Remote-User", "system:anonymous"), refuse: "adds the group system:unauthenticated"},
		{name: "a front proxy's padded user", caller: front("X-Remote-User", " frank", "X-Remote-Group", "system:masters ")},
		// The apiserver lowercases a header's name before it unescapes an
		// extra's key: "%41bc" is "Abc", "K" is "k" (a probe's caller
		// arrived as "abc" and got past a policy refusing "Abc").
		{name: "a front proxy's extras with capitals", caller: front("X-Remote-User", "frank", "X-Remote-Extra-%41bc", "v", "X-Remote-Extra-%4B", "2", "X-Remote-Extra-K", "1")},
		{name: "a certificate impersonating a padded group", caller: dave, headers: hdr("Impersonate-User", "erin", "Impersonate-Group", " padded")},
		{name: "a token impersonating a padded group", headers: merge(bearer, hdr("Impersonate-User", "erin", "Impersonate-Group", " padded"))},
		// A header the Connection header names is the connection's own
		// to a proxy (RFC 9110), and the apiserver reads it all the
		// same: kproxy had sent the request on without it, as the
		// caller where the apiserver ran it as the user impersonated
		// (a probe: admin impersonating "nobody" listed kube-system's
		// Secrets through kproxy, 403 directly), as anonymous where the
		// apiserver authenticated its token. HTTP/2 has no Connection
		// header.
		{name: "a token impersonating, its Connection header naming Impersonate-User", h1only: true,
			headers: merge(bearer, hdr("Impersonate-User", "erin", "Connection", "Impersonate-User"))},
		{name: "a token, its Connection header naming Authorization", h1only: true, headers: merge(bearer, hdr("Connection", "keep-alive, Authorization"))},
		{name: "a certificate impersonating, its Connection header naming Impersonate-User", caller: dave, h1only: true,
			headers: hdr("Impersonate-User", "erin", "Connection", "Impersonate-User")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// HTTP/2 first: kube-apiserver's impersonation filter words a
			// refusal after the mode that last let the caller impersonate
			// (it remembers one per caller, as kproxy's filter does in
			// each kproxy), so each filter must have seen the caller's
			// allowed impersonation before its refused one.
			for _, r := range []route{reverseH2Route(k), forwardH2Route(kf), reverseRoute(k), forwardRoute(kf)} {
				if tc.h1only && r.h2 {
					continue
				}
				direct := directRoute()
				direct.h2 = r.h2
				want := sendSSR(t, matrixClient(direct, tc.caller.cert), direct.base, tc.caller.remote, tc.headers)
				got := sendSSR(t, matrixClient(r, tc.caller.cert), r.base, tc.caller.remote, tc.headers)
				rec := nextRecord(t, recs)
				switch {
				case tc.refuse != "":
					if got.status != http.StatusForbidden || !strings.Contains(string(got.body), refused) || !strings.Contains(string(got.body), tc.refuse) {
						t.Errorf("%s: %d %s, want kproxy's 403 saying %q (directly: %d %s)", r.name, got.status, got.body, tc.refuse, want.status, want.body)
					}
					// The record says kproxy answered, and the replay
					// what the apiserver would have.
					if !strings.HasPrefix(rec.Actual.Error, record.ErrorUnforwardable) || !rec.Actual.NoAnswer() {
						t.Errorf("%s: the record's error %q, want kproxy's refusal", r.name, rec.Actual.Error)
					}
					if rec.Predicted.Status != want.status {
						t.Errorf("%s: predicted %s %d %q, directly %d", r.name, rec.Predicted.Stage, rec.Predicted.Status, rec.Predicted.Message, want.status)
					}
				case got.status != want.status || got.norm != want.norm:
					t.Errorf("%s: %d %s\n directly: %d %s", r.name, got.status, got.norm, want.status, want.norm)
				case rec.Predicted.Status != got.status:
					t.Errorf("%s: predicted %s %d %q, answered %d", r.name, rec.Predicted.Stage, rec.Predicted.Status, rec.Predicted.Message, got.status)
				}
			}
		})
	}
}
