// Package credential says which credentials a request carries, as the
// kube-apiserver's own authenticators read them. It is the one place in
// kproxy that decides "did the caller bring a credential": the proxy uses it
// to choose how to forward a caller, the replay and kproxy explain use it to
// describe what was presented.
//
// The rule that matters for security: an Authorization header is not a
// credential by its presence. The apiserver's bearer-token authenticator
// ignores Basic, junk and an empty "Bearer", and its WebSocket authenticator
// reads the bearer subprotocol only on a real WebSocket upgrade. A request
// with a certificate the apiserver rejects and such an ignored header is a
// 401 there; a proxy that forwarded it without the certificate would serve
// it as system:anonymous. So this package runs the apiserver's own
// bearertoken and websocket request authenticators, with a token
// authenticator that only notes the token, instead of re-deriving their
// parsing rules.
package credential

import (
	"context"
	"crypto/x509"
	"errors"
	"net/http"
	"slices"
	"strings"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	"k8s.io/apiserver/pkg/authentication/request/websocket"
)

// Token sources, as the apiserver's token authenticators read them.
const (
	SourceAuthorization = "Authorization: Bearer"
	SourceWebSocket     = "WebSocket bearer subprotocol"
)

// Presented is what a request carries, in the apiserver's terms. It holds
// the token itself for the few callers that must read it (describing a
// rejected JWT from its public claims); never log or record it.
type Presented struct {
	// Certificate is the client certificate from the TLS handshake, or nil.
	// Whether it verifies is the certificate authenticators' call.
	Certificate *x509.Certificate
	// Token is the bearer token the apiserver's token authenticators would
	// be asked about, and TokenSource where it was found.
	Token       string
	TokenSource string
	// TokenError is set when the token authenticators reject the request's
	// token credential before asking about it (a malformed WebSocket bearer
	// subprotocol): the apiserver answers 401 for it.
	TokenError error
	// IgnoredAuthorization is the scheme of an Authorization header the
	// apiserver does not read as a credential (Basic, junk, an empty
	// Bearer), for explanations.
	IgnoredAuthorization string
	// IgnoredWebSocketToken is set when a bearer subprotocol was sent on a
	// request that is not a WebSocket upgrade: the apiserver ignores it.
	IgnoredWebSocketToken bool
}

// HasTokenCredential reports whether the apiserver's token authenticators
// will decide about this request (accept or reject it): a non-empty bearer
// token, or a malformed one they reject. Only then may a request whose
// certificate was rejected be forwarded without that certificate: the
// apiserver's union answers by the token either way.
func (p Presented) HasTokenCredential() bool {
	return p.Token != "" || p.TokenError != nil
}

// HasCertificate reports a client certificate in the TLS handshake.
func (p Presented) HasCertificate() bool { return p.Certificate != nil }

// None reports a request the apiserver would treat as carrying no
// credential at all (anonymous, where anonymous auth is on).
func (p Presented) None() bool { return !p.HasCertificate() && !p.HasTokenCredential() }

// Describe names what the request presented, never a secret.
func (p Presented) Describe() string {
	var kinds []string
	if c := p.Certificate; c != nil {
		kinds = append(kinds, "a client certificate (CN="+quote(c.Subject.CommonName)+", O="+listOf(c.Subject.Organization)+", issuer "+quote(c.Issuer.CommonName)+")")
	}
	switch {
	case p.Token != "":
		kinds = append(kinds, "a bearer token ("+p.TokenSource+")")
	case p.TokenError != nil:
		kinds = append(kinds, "a malformed bearer token ("+p.TokenError.Error()+")")
	}
	if p.IgnoredAuthorization != "" {
		kinds = append(kinds, "an Authorization: "+p.IgnoredAuthorization+" header, which the apiserver does not read as a credential")
	}
	if p.IgnoredWebSocketToken {
		kinds = append(kinds, "a WebSocket bearer subprotocol on a request that is not a WebSocket upgrade, which the apiserver ignores")
	}
	if len(kinds) == 0 {
		return "a request without credentials"
	}
	return strings.Join(kinds, " and ")
}

// Inspect reads r's credentials with the apiserver's own request
// authenticators. It does not modify r (they strip a token they accept, so
// they run on a copy of the headers).
func Inspect(r *http.Request) Presented {
	var p Presented
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		p.Certificate = r.TLS.PeerCertificates[0]
	}
	// The authenticators read these headers and the context; a copy of
	// only these (every request is inspected on its way upstream, and
	// again by the replay's explanation) is enough for them to strip.
	probe := &http.Request{Method: r.Method, URL: r.URL, Header: make(http.Header, len(probedHeaders))}
	for _, k := range probedHeaders {
		if v, ok := r.Header[k]; ok {
			probe.Header[k] = slices.Clone(v)
		}
	}
	probe = probe.WithContext(context.Background())

	var seen string
	note := authenticator.TokenFunc(func(_ context.Context, token string) (*authenticator.Response, bool, error) {
		seen = token
		return nil, false, errNoted
	})
	// kube-apiserver's union asks both token authenticators, bearer token
	// first; either may decide.
	var errs []error
	for _, a := range []struct {
		source string
		auth   authenticator.Request
	}{
		{SourceAuthorization, bearertoken.New(note)},
		{SourceWebSocket, websocket.NewProtocolAuthenticator(note)},
	} {
		seen = ""
		_, _, err := a.auth.AuthenticateRequest(probe)
		switch {
		case seen != "" && p.Token == "":
			p.Token, p.TokenSource = seen, a.source
		case err != nil && !errors.Is(err, errNoted):
			errs = append(errs, err)
		}
	}
	if p.Token == "" && len(errs) > 0 {
		p.TokenError = errs[0]
	}
	if p.TokenSource != SourceAuthorization {
		if a := strings.TrimSpace(r.Header.Get("Authorization")); a != "" {
			p.IgnoredAuthorization = schemeOf(a)
		}
	}
	if p.Token == "" && p.TokenError == nil {
		for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
			if strings.Contains(v, "base64url.bearer.authorization.k8s.io.") {
				p.IgnoredWebSocketToken = true
			}
		}
	}
	return p
}

// probedHeaders are the headers the bearer-token and WebSocket-protocol
// authenticators read (canonical keys): the token, and what makes a
// request a WebSocket upgrade.
var probedHeaders = []string{"Authorization", "Connection", "Upgrade", "Sec-Websocket-Protocol"}

// errNoted stops the apiserver's authenticators after the token was noted.
var errNoted = errors.New("token noted")

// schemeOf names the scheme of an Authorization header the apiserver
// ignores. Only well-known scheme names are repeated: a header without a
// scheme may be a token sent without "Bearer ", a secret.
func schemeOf(header string) string {
	scheme, rest, _ := strings.Cut(header, " ")
	switch s := strings.ToLower(scheme); s {
	case "bearer":
		if strings.TrimSpace(rest) == "" {
			return "Bearer with no token"
		}
		return "Bearer with a space before the token"
	case "basic", "digest", "negotiate", "ntlm", "hoba", "mutual", "aws4-hmac-sha256", "token":
		return scheme
	}
	return "<value without a known scheme>"
}

func quote(s string) string { return "\"" + s + "\"" }

func listOf(v []string) string { return "[" + strings.Join(v, " ") + "]" }
