package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/textproto"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/kproxy/kproxy/internal/pki"
	"github.com/kproxy/kproxy/internal/stages"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// The forwarding decision held against the apiserver's own authenticator.
//
// kproxy decides, per request, to forward with the caller's own credentials
// (token), without credentials (anonymous), by impersonating a verified
// certificate caller, or to answer 401 itself. Whatever it decides, the
// apiserver must end up with the identity it would have found had the
// request come directly, certificate included. The reference is
// kube-apiserver's authenticator built by its own Config.New from the same
// flags; the upstream of a forwarded request sees it without the client
// certificate (kproxy's connection carries none, or kproxy's own).

type identityWorld struct {
	proxy *Proxy
	ref   authenticator.Request
	certs []*x509.Certificate // index 0: no certificate
}

var (
	worldOnce sync.Once
	world     *identityWorld
	worldErr  error
)

const fuzzToken = "alice-token"

func newIdentityWorld(t testing.TB) *identityWorld {
	worldOnce.Do(func() { world, worldErr = buildIdentityWorld() })
	if worldErr != nil {
		t.Fatal(worldErr)
	}
	return world
}

func buildIdentityWorld() (*identityWorld, error) {
	dir, err := os.MkdirTemp("", "kproxy-identity-fuzz-")
	if err != nil {
		return nil, err
	}
	clientCA, err := pki.NewCA("cluster-ca")
	if err != nil {
		return nil, err
	}
	frontCA, err := pki.NewCA("front-proxy-ca")
	if err != nil {
		return nil, err
	}
	stranger, err := pki.NewCA("stranger")
	if err != nil {
		return nil, err
	}
	write := func(name string, b []byte) (string, error) {
		p := filepath.Join(dir, name)
		return p, os.WriteFile(p, b, 0o600)
	}
	caFile, err := write("ca.crt", pki.CertPEM(clientCA.Cert))
	if err != nil {
		return nil, err
	}
	fpFile, err := write("front-proxy-ca.crt", pki.CertPEM(frontCA.Cert))
	if err != nil {
		return nil, err
	}
	tokFile, err := write("tokens.csv", []byte(fuzzToken+",alice,alice-uid,devs\n"))
	if err != nil {
		return nil, err
	}
	args := []string{
		"--client-ca-file=" + caFile, "--token-auth-file=" + tokFile, "--anonymous-auth=true",
		"--requestheader-client-ca-file=" + fpFile, "--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-", "--authorization-mode=RBAC",
	}
	o, _, err := apiserver.OptionsFromArgs(args)
	if err != nil {
		return nil, err
	}
	// Not Complete: it insists on service-account flags this world
	// does not need.
	ref, err := stages.APIServerAuthenticator(context.Background(), o)
	if err != nil {
		return nil, err
	}
	pool := func(ca *pki.CA) *x509.CertPool { p := x509.NewCertPool(); p.AddCert(ca.Cert); return p }
	certAuth := NewCertAuthenticator(pool(clientCA), &RequestHeaderOptions{
		ClientCA: pool(frontCA), AllowedNames: []string{"front-proxy-client"},
		UsernameHeaders: []string{"X-Remote-User"}, GroupHeaders: []string{"X-Remote-Group"},
		ExtraHeaderPrefixes: []string{"X-Remote-Extra-"},
	})
	now := time.Now()
	leaves := []struct {
		ca *pki.CA
		l  pki.Leaf
	}{
		{clientCA, pki.Leaf{CommonName: "dave", Organization: []string{"devs"}, Client: true}},
		{clientCA, pki.Leaf{CommonName: "dave", Client: true, NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-24 * time.Hour)}},
		{stranger, pki.Leaf{CommonName: "dave", Organization: []string{"devs"}, Client: true}},
		{clientCA, pki.Leaf{CommonName: "dave", Server: true}}, // wrong usage
		{frontCA, pki.Leaf{CommonName: "front-proxy-client", Client: true}},
		{frontCA, pki.Leaf{CommonName: "someone-else", Client: true}}, // front-proxy CA, name not allowed
		{clientCA, pki.Leaf{CommonName: "mallory", Organization: []string{"system:masters"}, Client: true}},
		{stranger, pki.Leaf{CommonName: "mallory", Organization: []string{"system:masters"}, Client: true}},
	}
	w := &identityWorld{ref: ref, certs: []*x509.Certificate{nil}}
	for _, l := range leaves {
		c, err := l.ca.Issue(l.l)
		if err != nil {
			return nil, err
		}
		w.certs = append(w.certs, c.Cert)
	}
	w.proxy = &Proxy{certAuth: certAuth}
	return w, nil
}

// verdict is what the apiserver concluded about a caller: 401, or a user.
type verdict struct {
	unauthorized bool
	user         user.Info
}

func (v verdict) String() string {
	if v.unauthorized {
		return "401"
	}
	return describeInfo(v.user)
}

func describeInfo(u user.Info) string {
	if u == nil {
		return "<nobody>"
	}
	g := slices.Clone(u.GetGroups())
	slices.Sort(g)
	return fmt.Sprintf("%q|%q|%q|%q", u.GetName(), u.GetUID(), g, u.GetExtra())
}

func (w *identityWorld) authenticate(r *http.Request) verdict {
	r = r.Clone(context.Background())
	resp, ok, err := w.ref.AuthenticateRequest(r)
	if err != nil || !ok {
		return verdict{unauthorized: true}
	}
	return verdict{user: resp.User}
}

// check holds one request's forwarding decision against the reference.
func (w *identityWorld) check(t *testing.T, r *http.Request) {
	t.Helper()
	direct := w.authenticate(r)
	id := w.proxy.identify(r.Clone(context.Background()))
	noCert := r.Clone(context.Background())
	noCert.TLS = &tls.ConnectionState{HandshakeComplete: true}
	var via verdict
	switch id.kind {
	case IdentityRejected:
		via = verdict{unauthorized: true}
	case IdentityCertificate:
		// What the apiserver makes of the impersonation headers kproxy
		// sends, after the hop: HTTP/1.1 trims the spaces around a
		// value, unless the request goes over HTTP/2. What no header
		// carries exactly, kproxy refuses (never more than directly).
		upgrade := r.Header.Get("Upgrade") != ""
		padded, why := forwardable(id.user, upgrade)
		if why != "" {
			return
		}
		h := http.Header{}
		setImpersonation(h, id.user)
		if !padded {
			for _, vs := range h {
				for i := range vs {
					vs[i] = textproto.TrimString(vs[i])
				}
			}
		}
		u, err := impersonatedBy(h)
		if err != nil {
			t.Fatal(err)
		}
		via = verdict{user: u}
	case IdentityToken, IdentityAnonymous:
		via = w.authenticate(noCert)
		if id.kind == IdentityAnonymous && (via.unauthorized || via.user.GetName() != user.Anonymous) {
			t.Errorf("kproxy forwards as anonymous, but upstream the request is %s", via)
		}
	default:
		t.Fatalf("unknown identity kind %q", id.kind)
	}
	if via.String() != direct.String() {
		t.Errorf("decision %s gives the apiserver %s; directly it is %s\nheaders: %v\ncertificate: %s",
			id.kind, via, direct, r.Header, certName(r))
	}
}

func certName(r *http.Request) string {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return "none"
	}
	c := r.TLS.PeerCertificates[0]
	return c.Subject.CommonName + " from " + c.Issuer.CommonName
}

func (w *identityWorld) request(cert uint8, authz, wsProtocol string, upgrade bool, remoteUser, remoteGroup string) *http.Request {
	r, _ := http.NewRequest("POST", "https://kproxy/apis/authentication.k8s.io/v1/selfsubjectreviews", nil)
	r.TLS = &tls.ConnectionState{HandshakeComplete: true}
	if c := w.certs[int(cert)%len(w.certs)]; c != nil {
		r.TLS.PeerCertificates = []*x509.Certificate{c}
	}
	set := func(k, v string) {
		if v != "" {
			r.Header.Add(k, v)
		}
	}
	set("Authorization", authz)
	set("Sec-WebSocket-Protocol", wsProtocol)
	if upgrade {
		r.Header.Set("Connection", "Upgrade")
		r.Header.Set("Upgrade", "websocket")
	}
	set("X-Remote-User", remoteUser)
	set("X-Remote-Group", remoteGroup)
	return r
}

func wsBearer(token string) string {
	return "base64url.bearer.authorization.k8s.io." + base64.RawURLEncoding.EncodeToString([]byte(token)) + ", v5.channel.k8s.io"
}

// identitySeeds are the e2e matrix's credential combinations.
func identitySeeds() [][]any {
	auths := []string{"", "Bearer " + fuzzToken, "Bearer not-a-token", "Bearer", "Bearer ", "Bearer  " + fuzzToken,
		"Basic YWxpY2U6cGFzc3dvcmQ=", "junk", "bearer " + fuzzToken, "Bearer\t" + fuzzToken}
	var seeds [][]any
	for cert := uint8(0); cert < 9; cert++ {
		for _, a := range auths {
			seeds = append(seeds, []any{cert, a, "", false, "", ""})
		}
		for _, up := range []bool{false, true} {
			seeds = append(seeds, []any{cert, "", wsBearer(fuzzToken), up, "", ""})
			seeds = append(seeds, []any{cert, "", wsBearer("not-a-token"), up, "", ""})
			seeds = append(seeds, []any{cert, "Basic eDp5", wsBearer(fuzzToken), up, "", ""})
			seeds = append(seeds, []any{cert, "", "base64url.bearer.authorization.k8s.io.YWxpY2U", up, "", ""})
		}
		seeds = append(seeds, []any{cert, "", "", false, "admin", "system:masters"})
		// Names the impersonation filter gives defaults to, and padding
		// HTTP/1.1 trims (found by a probe).
		seeds = append(seeds, []any{cert, "", "", false, "system:anonymous", ""})
		seeds = append(seeds, []any{cert, "", "", false, "system:serviceaccount:default:ghost", ""})
		seeds = append(seeds, []any{cert, "", "", false, "system:node:n9", ""})
		seeds = append(seeds, []any{cert, "", "", false, " frank", "system:masters "})
		seeds = append(seeds, []any{cert, "", "", true, "frank", " system:masters"})
		seeds = append(seeds, []any{cert, "Basic eDp5", "", false, "admin", ""})
	}
	return seeds
}

// TestForwardingDecisionMatchesAPIServer runs every seed combination.
func TestForwardingDecisionMatchesAPIServer(t *testing.T) {
	w := newIdentityWorld(t)
	for _, s := range identitySeeds() {
		w.check(t, w.request(s[0].(uint8), s[1].(string), s[2].(string), s[3].(bool), s[4].(string), s[5].(string)))
	}
}

// FuzzForwardingDecision: no request, however its credentials are spelled,
// reaches the apiserver as someone other than it would directly be.
func FuzzForwardingDecision(f *testing.F) {
	for _, s := range identitySeeds() {
		f.Add(s[0].(uint8), s[1].(string), s[2].(string), s[3].(bool), s[4].(string), s[5].(string))
	}
	f.Fuzz(func(t *testing.T, cert uint8, authz, wsProtocol string, upgrade bool, remoteUser, remoteGroup string) {
		w := newIdentityWorld(t)
		for _, v := range []string{authz, wsProtocol, remoteUser, remoteGroup} {
			if !validHeaderValue(v) {
				t.Skip("not a header value net/http would accept")
			}
		}
		w.check(t, w.request(cert, authz, wsProtocol, upgrade, remoteUser, remoteGroup))
	})
}

// validHeaderValue is what net/http's server accepts in a field value.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		b := v[i]
		if b == '\r' || b == '\n' || b == 0 || (b < 0x20 && b != '\t') || b == 0x7f {
			return false
		}
	}
	return true
}
