package e2e

import (
	"crypto/tls"
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/kproxy/kproxy/internal/pki"
	"github.com/kproxy/kproxy/internal/record"
)

func issue(t *testing.T, ca *pki.CA, l pki.Leaf) *tls.Certificate {
	t.Helper()
	l.Client = true
	c, err := ca.Issue(l)
	if err != nil {
		t.Fatal(err)
	}
	tc := c.TLSCertificate()
	return &tc
}

// TestCertificateCaller sends the same requests with the same client
// certificate directly and through kproxy (which forwards it by
// impersonation) and expects the same answers, denials and 401s included.
func TestCertificateCaller(t *testing.T) {
	// dave may impersonate erin (and nobody else).
	grantImpersonation(t, "impersonate-erin", "erin", userSubject("dave"))
	// Anyone authenticated may impersonate "anyones-double": a grant to
	// system:authenticated, which the apiserver's authentication adds to
	// a certificate's groups (found by a probe: kproxy's run of the
	// impersonation filter asked without it, and refused with 403 what
	// the apiserver allows).
	grantImpersonation(t, "impersonate-anyones-double", "anyones-double", rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"})
	stranger, err := pki.NewCA("not-the-cluster-ca")
	if err != nil {
		t.Fatal(err)
	}
	dave := issue(t, cluster.CA, pki.Leaf{CommonName: "dave", Organization: []string{"devs"}})
	untrusted := issue(t, stranger, pki.Leaf{CommonName: "dave", Organization: []string{"devs"}})
	expired := issue(t, cluster.CA, pki.Leaf{CommonName: "dave", NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)})
	fp, err := cluster.FrontProxyClient()
	if err != nil {
		t.Fatal(err)
	}
	frontProxy := &fp

	k := startKproxy(t, kproxyOptions{})
	kf := startKproxy(t, kproxyOptions{mode: "forward"})
	routes := []route{directRoute(), reverseRoute(k), forwardRoute(kf)}
	ns := "/api/v1/namespaces/" + testNS
	ssr := `{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Add(kv[i], kv[i+1])
		}
		return out
	}
	cases := []struct {
		name   string
		cert   *tls.Certificate
		req    request
		status int
	}{
		{"allowed", dave, request{method: "GET", path: ns + "/configmaps"}, 200},
		{"denied", dave, request{method: "GET", path: ns + "/secrets"}, 403},
		{"who am i", dave, request{method: "POST", path: "/apis/authentication.k8s.io/v1/selfsubjectreviews", body: ssr}, 201},
		// The apiserver names its CAs in the TLS certificate request; a Go
		// client then does not send a certificate from another CA at all,
		// so the request is anonymous (403), not 401.
		{"untrusted CA", untrusted, request{method: "GET", path: ns + "/configmaps"}, 403},
		{"expired", expired, request{method: "GET", path: ns + "/configmaps"}, 401},
		{"certificate outranks token", dave, request{method: "POST", path: "/apis/authentication.k8s.io/v1/selfsubjectreviews", body: ssr, user: "admin"}, 201},
		{"untrusted certificate with a valid token", untrusted, request{method: "POST", path: "/apis/authentication.k8s.io/v1/selfsubjectreviews", body: ssr, user: "alice"}, 201},
		{"impersonation allowed", dave, request{method: "GET", path: ns + "/configmaps", header: h("Impersonate-User", "erin")}, 403},
		{"impersonation allowed, who", dave, request{method: "POST", path: "/apis/authentication.k8s.io/v1/selfsubjectreviews", body: ssr, header: h("Impersonate-User", "erin")}, 201},
		{"impersonation allowed to every authenticated user", dave, request{method: "POST", path: "/apis/authentication.k8s.io/v1/selfsubjectreviews", body: ssr, header: h("Impersonate-User", "anyones-double")}, 201},
		{"impersonation denied", dave, request{method: "GET", path: ns + "/configmaps", header: h("Impersonate-User", "frank")}, 403},
		{"impersonation group denied", dave, request{method: "GET", path: ns + "/configmaps", header: h("Impersonate-User", "erin", "Impersonate-Group", "system:masters")}, 403},
		{"impersonate group without user", dave, request{method: "GET", path: ns + "/configmaps", header: h("Impersonate-Group", "devs")}, 400},
		{"front proxy", frontProxy, request{method: "POST", path: "/apis/authentication.k8s.io/v1/selfsubjectreviews", body: ssr,
			header: h("X-Remote-User", "frank", "X-Remote-Group", "devs", "X-Remote-Group", "qa", "X-Remote-Extra-Team", "blue")}, 201},
		{"front proxy allowed", frontProxy, request{method: "GET", path: ns + "/configmaps", header: h("X-Remote-User", "frank", "X-Remote-Group", "devs")}, 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var want exchange
			for i, r := range routes {
				got := do(t, r.client(tc.cert), r.base, tc.req)
				if got.status != tc.status {
					t.Fatalf("%s: status %d, want %d; body: %s", r.name, got.status, tc.status, got.body)
				}
				if i == 0 {
					want = got
					continue
				}
				if got.norm != want.norm {
					t.Errorf("%s: body differs from direct\n direct: %s\n %s: %s", r.name, want.norm, r.name, got.norm)
				}
				if g, w := got.header.Get("Content-Type"), want.header.Get("Content-Type"); g != w {
					t.Errorf("%s: Content-Type %q, direct %q", r.name, g, w)
				}
			}
		})
	}
}

// TestRecordedGroups: a record's request.groups are the caller's groups
// as the apiserver resolves them, which a SelfSubjectReview answers: a
// certificate's (and a front proxy's) had no system:authenticated, which
// the apiserver's authentication adds (probe R: a flow filter on
// ~g system:authenticated missed every certificate caller).
func TestRecordedGroups(t *testing.T) {
	stream := record.NewStream()
	recs, _, cancel := stream.Subscribe(64)
	defer cancel()
	k := startKproxy(t, kproxyOptions{stream: stream})
	r := reverseRoute(k)
	dave := issue(t, cluster.CA, pki.Leaf{CommonName: "dave", Organization: []string{"devs"}})
	fp, err := cluster.FrontProxyClient()
	if err != nil {
		t.Fatal(err)
	}
	ssr := request{method: "POST", path: "/apis/authentication.k8s.io/v1/selfsubjectreviews", body: `{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`}
	cases := []struct {
		name string
		cert *tls.Certificate
		user string
		hdr  http.Header
	}{
		{"certificate", dave, "", nil},
		{"token", nil, "alice", nil},
		{"front proxy", &fp, "", http.Header{"X-Remote-User": {"frank"}, "X-Remote-Group": {"devs", "qa"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := ssr
			req.user, req.header = c.user, c.hdr
			got := do(t, r.client(c.cert), r.base, req)
			if got.status != 201 {
				t.Fatalf("status %d: %s", got.status, got.body)
			}
			var review authenticationv1.SelfSubjectReview
			if err := json.Unmarshal(got.body, &review); err != nil {
				t.Fatal(err)
			}
			rec := waitRecord(t, recs, got.header.Get("Audit-Id"))
			if want := review.Status.UserInfo.Groups; !slices.Equal(rec.Request.Groups, want) {
				t.Errorf("recorded groups %q; the apiserver resolved %q", rec.Request.Groups, want)
			}
		})
	}
}
