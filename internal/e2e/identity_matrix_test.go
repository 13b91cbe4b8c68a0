package e2e

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/pki"
	"github.com/kproxy/kproxy/internal/record"
)

// The security suite: kproxy never serves a caller more than the apiserver
// would. Every combination of client certificate, Authorization header and
// Impersonate-* headers is sent directly and through kproxy (reverse and
// forward mode, HTTP/1.1 and HTTP/2) as a SelfSubjectReview, and each route
// must get the direct answer: the same status, and the same identity (or
// the same refusal). Certificates are sent whatever CAs the server names,
// as an attacker's client would. One failure here is a release blocker.

// matrixCert is a client certificate a caller may present.
type matrixCert struct {
	name   string
	cert   *tls.Certificate
	remote http.Header // headers that come with it (front-proxy callers)
}

// matrixAuth is an Authorization header, or a WebSocket bearer.
type matrixAuth struct {
	name    string
	header  http.Header
	upgrade bool // sent as a WebSocket upgrade: HTTP/1.1 only
}

type matrixImp struct {
	name   string
	header http.Header
}

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		// Raw keys: odd casing reaches the wire as written (HTTP/1.1).
		h[kv[i]] = append(h[kv[i]], kv[i+1])
	}
	return h
}

func wsBearer(token string) string {
	return "base64url.bearer.authorization.k8s.io." + base64.RawURLEncoding.EncodeToString([]byte(token)) + ", v5.channel.k8s.io"
}

// alwaysSend makes a TLS client present cert whatever CAs the server names
// in its certificate request (Go's client otherwise sends only a matching
// one).
func alwaysSend(base *tls.Config, cert *tls.Certificate) *tls.Config {
	c := base.Clone()
	if cert != nil {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	return c
}

func matrixClient(r route, cert *tls.Certificate) *http.Client {
	tr := &http.Transport{TLSClientConfig: alwaysSend(r.tls, cert), Proxy: r.prox, DisableCompression: true, ForceAttemptHTTP2: r.h2}
	if r.h2 {
		return &http.Client{Timeout: time.Minute, Transport: requireH2{tr}}
	}
	return &http.Client{Timeout: time.Minute, Transport: tr}
}

func forwardH2Route(k *kproxy) route {
	r := forwardRoute(k)
	r.name, r.h2 = "forward-h2", true
	return r
}

const ssrPath = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
const ssrBody = `{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`

func sendSSR(t *testing.T, c *http.Client, base string, headers ...http.Header) exchange {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), "POST", base+ssrPath, strings.NewReader(ssrBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for _, h := range headers {
		for k, v := range h {
			req.Header[k] = append(req.Header[k], v...)
		}
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", ssrPath, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	ex := exchange{status: resp.StatusCode, header: resp.Header, body: b}
	ex.norm, ex.rawBody = normalize(b)
	return ex
}

func grantImpersonation(t *testing.T, role, target string, subjects ...rbacv1.Subject) {
	t.Helper()
	ctx := context.Background()
	cs := adminClient()
	if err := localcluster.Apply(ctx, cs, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"users"}, Verbs: []string{"impersonate"}, ResourceNames: []string{target}}},
	}); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.Apply(ctx, cs, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   subjects,
	}); err != nil {
		t.Fatal(err)
	}
}

func userSubject(name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}
}

func TestIdentityMatrix(t *testing.T) {
	// dave (certificate), alice (token) and frank (front proxy) may
	// impersonate erin, and nobody else.
	grantImpersonation(t, "matrix-impersonate-erin", "erin", userSubject("dave"), userSubject("alice"), userSubject("frank"))

	stranger, err := pki.NewCA("not-the-cluster-ca")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	fp, err := cluster.FrontProxyClient()
	if err != nil {
		t.Fatal(err)
	}
	wrongUsage, err := cluster.CA.Issue(pki.Leaf{CommonName: "dave", Organization: []string{"devs"}, Server: true})
	if err != nil {
		t.Fatal(err)
	}
	wu := wrongUsage.TLSCertificate()
	certs := []matrixCert{
		{name: "no certificate"},
		{name: "valid certificate", cert: issue(t, cluster.CA, pki.Leaf{CommonName: "dave", Organization: []string{"devs"}})},
		{name: "expired certificate", cert: issue(t, cluster.CA, pki.Leaf{CommonName: "dave", NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-24 * time.Hour)})},
		{name: "untrusted certificate", cert: issue(t, stranger, pki.Leaf{CommonName: "dave", Organization: []string{"devs"}})},
		{name: "server-usage certificate", cert: &wu},
		{name: "front-proxy certificate", cert: &fp, remote: hdr("X-Remote-User", "frank", "X-Remote-Group", "devs", "X-Remote-Extra-Team", "blue")},
		{name: "front-proxy certificate without X-Remote-User", cert: &fp},
		{name: "certificate claiming system:masters", cert: issue(t, cluster.CA, pki.Leaf{CommonName: "mallory", Organization: []string{"system:masters"}})},
		{name: "untrusted certificate claiming system:masters", cert: issue(t, stranger, pki.Leaf{CommonName: "mallory", Organization: []string{"system:masters"}})},
	}
	upgrade := hdr("Connection", "Upgrade", "Upgrade", "websocket")
	auths := []matrixAuth{
		{name: "no Authorization"},
		{name: "valid token", header: hdr("Authorization", "Bearer "+tokenOf("alice"))},
		{name: "invalid token", header: hdr("Authorization", "Bearer not-a-valid-token")},
		{name: "empty Bearer", header: hdr("Authorization", "Bearer")},
		{name: "Basic", header: hdr("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("alice:password")))},
		{name: "junk", header: hdr("Authorization", "junk-without-a-scheme")},
		{name: "WebSocket bearer on an upgrade", header: merge(hdr("Sec-WebSocket-Protocol", wsBearer(tokenOf("alice"))), upgrade), upgrade: true},
		{name: "WebSocket bearer without an upgrade", header: hdr("Sec-WebSocket-Protocol", wsBearer(tokenOf("alice")))},
	}
	imps := []matrixImp{
		{name: "no impersonation"},
		{name: "allowed impersonation", header: hdr("Impersonate-User", "erin")},
		{name: "denied impersonation", header: hdr("Impersonate-User", "frank-the-admin")},
		{name: "odd casing", header: hdr("impersonate-user", "erin", "IMPERSONATE-GROUP", "system:masters")},
		{name: "duplicates", header: hdr("Impersonate-User", "erin", "Impersonate-User", "admin", "Impersonate-Group", "devs", "Impersonate-Group", "devs")},
		{name: "spoofed front-proxy headers", header: hdr("X-Remote-User", "admin", "X-Remote-Group", "system:masters")},
	}

	k := startKproxy(t, kproxyOptions{})
	kf := startKproxy(t, kproxyOptions{mode: "forward"})
	routes := []route{reverseRoute(k), reverseH2Route(k), forwardRoute(kf), forwardH2Route(kf)}
	direct := directRoute()
	clients := map[string]*http.Client{}
	client := func(r route, c matrixCert) *http.Client {
		key := r.name + "/" + c.name
		if clients[key] == nil {
			clients[key] = matrixClient(r, c.cert)
		}
		return clients[key]
	}

	cases, compared := 0, 0
	for _, c := range certs {
		for _, a := range auths {
			for _, im := range imps {
				name := c.name + ", " + a.name + ", " + im.name
				cases++
				t.Run(name, func(t *testing.T) {
					want := sendSSR(t, client(direct, c), direct.base, c.remote, a.header, im.header)
					for _, r := range routes {
						if r.h2 && a.upgrade {
							// HTTP/2 has no Connection/Upgrade headers
							// (a client cannot send this request over it).
							continue
						}
						got := sendSSR(t, client(r, c), r.base, c.remote, a.header, im.header)
						compared++
						if got.status != want.status {
							t.Errorf("%s: status %d, directly %d\n direct: %s\n %s: %s", r.name, got.status, want.status, want.body, r.name, got.body)
							continue
						}
						if got.norm != want.norm {
							t.Errorf("%s: answer differs from direct\n direct: %s\n %s: %s", r.name, want.norm, r.name, got.norm)
						}
						// kproxy's own answers (a certificate it refuses, a
						// certificate caller's impersonation) carry the
						// headers the apiserver's do (an Audit-Id of its own).
						if (got.header.Get("Audit-Id") == "") != (want.header.Get("Audit-Id") == "") || got.header.Get("Cache-Control") != want.header.Get("Cache-Control") {
							t.Errorf("%s: Audit-Id %q and Cache-Control %q, directly %q and %q", r.name, got.header.Get("Audit-Id"), got.header.Get("Cache-Control"),
								want.header.Get("Audit-Id"), want.header.Get("Cache-Control"))
						}
					}
				})
			}
		}
	}
	t.Logf("%d identity combinations, %d answers through kproxy compared with direct", cases, compared)
	if cases != len(certs)*len(auths)*len(imps) || compared < cases*2 {
		t.Fatalf("the matrix ran %d cases and %d comparisons", cases, compared)
	}
}

func merge(hs ...http.Header) http.Header {
	out := http.Header{}
	for _, h := range hs {
		for k, v := range h {
			out[k] = append(out[k], v...)
		}
	}
	return out
}

// TestRevokedImpersonationStopsAtOnce deletes the binding that lets a
// certificate caller impersonate someone, and expects the very next
// request through kproxy to be refused, as soon as the apiserver refuses
// it directly: kproxy keeps no allow the apiserver would not.
func TestRevokedImpersonationStopsAtOnce(t *testing.T) {
	ctx := context.Background()
	grantImpersonation(t, "revoke-impersonate-gina", "gina", userSubject("dave"))
	dave := issue(t, cluster.CA, pki.Leaf{CommonName: "dave", Organization: []string{"devs"}})
	k := startKproxy(t, kproxyOptions{})
	kf := startKproxy(t, kproxyOptions{mode: "forward"})
	routes := []route{reverseRoute(k), reverseH2Route(k), forwardRoute(kf), forwardH2Route(kf)}
	asGina := hdr("Impersonate-User", "gina")
	direct := directRoute()
	dc := matrixClient(direct, dave)
	clients := make([]*http.Client, len(routes))
	for i, r := range routes {
		clients[i] = matrixClient(r, dave)
		// Warm up: the permission is used (and would be cached) first.
		for range 3 {
			if got := sendSSR(t, clients[i], r.base, asGina); got.status != http.StatusCreated || !strings.Contains(got.norm, `"username":"gina"`) {
				t.Fatalf("%s: before the revocation: %d %s", r.name, got.status, got.body)
			}
		}
	}
	if err := adminClient().RbacV1().ClusterRoleBindings().Delete(ctx, "revoke-impersonate-gina", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The apiserver's own RBAC cache catches up within moments; from the
	// moment it refuses directly, kproxy must refuse too.
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return sendSSR(t, dc, direct.base, asGina).status == http.StatusForbidden, nil
	}); err != nil {
		t.Fatalf("the apiserver still lets dave impersonate gina: %v", err)
	}
	for i, r := range routes {
		if got := sendSSR(t, clients[i], r.base, asGina); got.status != http.StatusForbidden {
			t.Errorf("%s: right after the revocation: %d %s, want 403 as directly", r.name, got.status, got.body)
		}
	}
}

// TestForwardModeRefusesOtherHosts: kproxy in forward mode is not an open
// proxy. A CONNECT to any host but the apiserver is refused, and so is a
// plain-HTTP proxy request.
func TestForwardModeRefusesOtherHosts(t *testing.T) {
	kf := startKproxy(t, kproxyOptions{mode: "forward"})
	u, _ := url.Parse(cluster.URL)
	// localhost names the apiserver too, but not as clients were told to.
	others := []string{"example.com:443", "127.0.0.1:1", "localhost:" + u.Port()}
	for _, host := range others {
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: kf.addr}), TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		resp, err := c.Get("https://" + host + "/version")
		if err == nil {
			resp.Body.Close()
			t.Errorf("CONNECT %s through kproxy: %s, want a refused tunnel", host, resp.Status)
			continue
		}
		if !strings.Contains(err.Error(), "Forbidden") {
			t.Errorf("CONNECT %s through kproxy: %v, want 403 Forbidden", host, err)
		}
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: kf.addr})}}
	resp, err := c.Get(strings.Replace(cluster.URL, "https://", "http://", 1) + "/version")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("plain HTTP through kproxy to %s: %s, want 403", cluster.URL, resp.Status)
	}
}

// TestMalformedImpersonationAfterRBACChange: Impersonate-Group or
// Impersonate-Uid without Impersonate-User is refused (400) by the
// impersonation filter before any authorizer is asked, so a change of
// RBAC just before it bears on nothing: it is predicted 400. Before, it
// was said unknown, "the apiserver's impersonation allowed the request
// (it answered 400, which only a request past authorization gets)"
// (probe AD, 17 records).
func TestMalformedImpersonationAfterRBACChange(t *testing.T) {
	r, recs := recordedKproxy(t)
	role := fmt.Sprintf("malformed-impersonation-%d", time.Now().UnixNano())
	grantImpersonation(t, role, "erin", userSubject("alice"))
	t.Cleanup(func() {
		_ = adminClient().RbacV1().ClusterRoleBindings().Delete(context.Background(), role, metav1.DeleteOptions{})
		_ = adminClient().RbacV1().ClusterRoles().Delete(context.Background(), role, metav1.DeleteOptions{})
	})
	for _, h := range []http.Header{hdr("Impersonate-Group", "devs"), hdr("Impersonate-Uid", "uid-erin")} {
		got := sendSSR(t, r.client(nil), r.base, merge(hdr("Authorization", "Bearer "+tokenOf("alice")), h))
		rec := nextRecord(t, recs)
		if got.status != http.StatusBadRequest {
			t.Fatalf("%v: the apiserver answered %d %s, want 400: update the test", h, got.status, got.body)
		}
		if p := rec.Predicted; p.Status != http.StatusBadRequest || p.Stage != record.StageImpersonation {
			t.Errorf("%v, right after an RBAC change: predicted %d at %q (%s), the apiserver answered 400", h, p.Status, p.Stage, p.Message)
		}
	}
}
