package e2e

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	jose "gopkg.in/go-jose/go-jose.v2"
	"gopkg.in/go-jose/go-jose.v2/jwt"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"

	"github.com/kproxy/kproxy/internal/pki"
)

// identityServers are the external parts of authentication and
// authorization a real cluster talks to, run by the test process: an OIDC
// issuer (discovery and JWKS) for the structured JWT authenticator, a
// TokenReview webhook and a SubjectAccessReview webhook. The apiserver and
// kproxy's replay both call them.
type identityServers struct {
	issuer   string
	key      *rsa.PrivateKey
	stranger *rsa.PrivateKey // signs tokens the issuer never published
	srv      []*http.Server
	// Flags for kube-apiserver (and so for kproxy, which reads them).
	flags []string
	// Webhooks that change their minds, as a test says: the token
	// webhook refuses "hook-flip" once flipToken is set (hook:flip
	// otherwise), and the authorization webhook denies hook:flip the
	// configmaps it reads once flipAuthz is set.
	flipToken, flipAuthz atomic.Bool
	// The token webhook fails (500) every call for "hook-down" once
	// downToken is set, and counts them in downCalls.
	downToken atomic.Bool
	downCalls atomic.Int64
}

const oidcAudience = "kproxy-e2e"

func startIdentityServers(dir string) (*identityServers, error) {
	ca, err := pki.NewCA("e2e-identity-ca")
	if err != nil {
		return nil, err
	}
	leaf, err := ca.Issue(pki.Leaf{CommonName: "e2e-identity", Server: true, IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		return nil, err
	}
	caFile := filepath.Join(dir, "identity-ca.crt")
	if err := os.WriteFile(caFile, pki.CertPEM(ca.Cert), 0o644); err != nil {
		return nil, err
	}
	s := &identityServers{}
	if s.key, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		return nil, err
	}
	if s.stranger, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		return nil, err
	}
	serve := func(h http.Handler) (string, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		srv := &http.Server{Handler: h, TLSConfig: &tls.Config{Certificates: []tls.Certificate{leaf.TLSCertificate()}}, ReadHeaderTimeout: 10 * time.Second}
		go srv.ServeTLS(ln, "", "")
		s.srv = append(s.srv, srv)
		return "https://" + ln.Addr().String(), nil
	}

	// OIDC issuer.
	mux := http.NewServeMux()
	if s.issuer, err = serve(mux); err != nil {
		return nil, err
	}
	mux.HandleFunc("/.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"issuer": s.issuer, "jwks_uri": s.issuer + "/jwks",
			"id_token_signing_alg_values_supported": []string{"RS256"}})
	})
	mux.HandleFunc("/jwks", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &s.key.PublicKey, KeyID: "e2e", Algorithm: "RS256", Use: "sig"}}})
	})
	authnConfig := fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: AuthenticationConfiguration
jwt:
- issuer:
    url: %s
    audiences: [%s]
    certificateAuthority: |
%s
  claimMappings:
    username: {claim: sub, prefix: "oidc:"}
    groups: {claim: groups, prefix: "oidc:"}
  claimValidationRules:
  - expression: "claims.sub != 'banned'"
    message: "the subject is banned"
`, s.issuer, oidcAudience, indentPEM(pki.CertPEM(ca.Cert)))
	authnFile := filepath.Join(dir, "authentication-config.yaml")
	if err := os.WriteFile(authnFile, []byte(authnConfig), 0o644); err != nil {
		return nil, err
	}

	// TokenReview webhook: "hook-alice" is hook:alice in group hook-users.
	tokenURL, err := serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var tr authenticationv1.TokenReview
		if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if tr.Spec.Token == "hook-down" && s.downToken.Load() {
			s.downCalls.Add(1)
			http.Error(w, "the e2e token webhook is down", http.StatusInternalServerError)
			return
		}
		switch {
		case tr.Spec.Token == "hook-alice":
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true,
				User: authenticationv1.UserInfo{Username: "hook:alice", UID: "hook-uid-1", Groups: []string{"hook-users"}}}
		case tr.Spec.Token == "hook-flip" && !s.flipToken.Load(), tr.Spec.Token == "hook-down":
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true,
				User: authenticationv1.UserInfo{Username: "hook:flip", UID: "hook-uid-2", Groups: []string{"hook-users"}}}
		default:
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: false, Error: "unknown token"}
		}
		json.NewEncoder(w).Encode(tr)
	}))
	if err != nil {
		return nil, err
	}
	// SubjectAccessReview webhook: hook users may read configmaps, are
	// explicitly denied secrets, and get no opinion otherwise.
	authzURL, err := serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var sar authorizationv1.SubjectAccessReview
		if err := json.NewDecoder(r.Body).Decode(&sar); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ra := sar.Spec.ResourceAttributes
		isHook := false
		for _, g := range sar.Spec.Groups {
			isHook = isHook || g == "hook-users"
		}
		switch {
		case sar.Spec.User == "hook:flip" && s.flipAuthz.Load() && ra != nil && ra.Resource == "configmaps":
			sar.Status = authorizationv1.SubjectAccessReviewStatus{Denied: true, Reason: "the e2e webhook changed its mind about hook:flip"}
		case isHook && ra != nil && ra.Resource == "configmaps" && (ra.Verb == "get" || ra.Verb == "list"):
			sar.Status = authorizationv1.SubjectAccessReviewStatus{Allowed: true, Reason: "the e2e webhook lets hook users read configmaps"}
		case isHook && ra != nil && ra.Resource == "secrets":
			sar.Status = authorizationv1.SubjectAccessReviewStatus{Denied: true, Reason: "the e2e webhook keeps hook users away from secrets"}
		default:
			sar.Status = authorizationv1.SubjectAccessReviewStatus{}
		}
		json.NewEncoder(w).Encode(sar)
	}))
	if err != nil {
		return nil, err
	}
	kubeconfig := func(name, server string) (string, error) {
		path := filepath.Join(dir, name+".kubeconfig")
		content := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: hook
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: apiserver
contexts:
- name: hook
  context: {cluster: hook, user: apiserver}
current-context: hook
`, server, caFile)
		return path, os.WriteFile(path, []byte(content), 0o644)
	}
	tokenKC, err := kubeconfig("token-webhook", tokenURL)
	if err != nil {
		return nil, err
	}
	authzKC, err := kubeconfig("authz-webhook", authzURL)
	if err != nil {
		return nil, err
	}
	s.flags = []string{
		"--authentication-config=" + authnFile,
		"--authentication-token-webhook-config-file=" + tokenKC,
		"--authentication-token-webhook-version=v1",
		"--authorization-webhook-config-file=" + authzKC,
		"--authorization-webhook-version=v1",
		// Cache nothing: the corpus asks the same question of the
		// apiserver and of the replay, and both must ask the webhook.
		"--authorization-webhook-cache-authorized-ttl=0s",
		"--authorization-webhook-cache-unauthorized-ttl=0s",
	}
	return s, nil
}

// token mints a JWT for the corpus: "oidc:valid", "oidc:expired",
// "oidc:wrong-audience", "oidc:unknown-key", "oidc:banned".
func (s *identityServers) token(kind string) (string, error) {
	key, iss, aud, sub := s.key, s.issuer, oidcAudience, "alice"
	now := time.Now()
	exp := now.Add(time.Hour)
	switch kind {
	case "oidc:expired":
		exp = now.Add(-time.Hour)
	case "oidc:wrong-audience":
		aud = "someone-else"
	case "oidc:unknown-key":
		key = s.stranger
	case "oidc:banned":
		sub = "banned"
	case "oidc:valid":
	default:
		return "", fmt.Errorf("no OIDC token kind %q", kind)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", "e2e"))
	if err != nil {
		return "", err
	}
	claims := jwt.Claims{Issuer: iss, Subject: sub, Audience: jwt.Audience{aud}, Expiry: jwt.NewNumericDate(exp),
		IssuedAt: jwt.NewNumericDate(now.Add(-2 * time.Hour)), NotBefore: jwt.NewNumericDate(now.Add(-2 * time.Hour))}
	return jwt.Signed(signer).Claims(claims).Claims(map[string]any{"groups": []string{"devs"}}).CompactSerialize()
}

func (s *identityServers) close() {
	for _, srv := range s.srv {
		srv.Close()
	}
}

func indentPEM(b []byte) string {
	out := ""
	for _, l := range splitLines(string(b)) {
		out += "      " + l + "\n"
	}
	return out
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}
