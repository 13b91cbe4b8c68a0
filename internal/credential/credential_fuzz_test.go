package credential

import (
	"encoding/base64"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// describeVocabulary is every fixed text Describe is made of: the
// sources, schemeOf's answers, the apiserver's WebSocket authenticator's
// errors, Describe's own phrases, and the ignored-Authorization sentence
// with each scheme in it (a secret may cross from the scheme into the
// sentence: "token h" in "token header"). A secret may coincide with a
// piece of it.
var describeVocabulary = strings.ToLower(strings.Join(append(ignoredSentences(), []string{
	SourceAuthorization, SourceWebSocket,
	"Bearer with no token", "Bearer with a space before the token", "<value without a known scheme>",
	"basic digest negotiate ntlm hoba mutual aws4-hmac-sha256 token",
	"invalid bearer token", "multiple base64.bearer.authorization tokens specified",
	"invalid base64.bearer.authorization token encoding", "invalid base64.bearer.authorization token", "missing additional subprotocol",
	"a request without credentials", "a bearer token (", "a malformed bearer token (", ") and ", "an Authorization: ",
	" header, which the apiserver does not read as a credential",
	"a WebSocket bearer subprotocol on a request that is not a WebSocket upgrade, which the apiserver ignores",
}...), "\x00"))

// ignoredSentences is Describe's sentence for an Authorization header it
// does not read, with each scheme schemeOf names.
func ignoredSentences() []string {
	var out []string
	for _, scheme := range append(strings.Fields("Basic Digest Negotiate NTLM HOBA Mutual AWS4-HMAC-SHA256 Token"),
		"<value without a known scheme>", "Bearer with no token", "Bearer with a space before the token") {
		out = append(out, "an Authorization: "+scheme+" header, which the apiserver does not read as a credential")
	}
	return out
}

// FuzzInspect reads arbitrary credential headers (Authorization, a
// WebSocket bearer subprotocol, on an upgrade or not) with the
// apiserver's own request authenticators. It checks that Inspect never
// panics and never changes the request; that a token it finds is in the
// headers; that its verdicts agree with each other; and that Describe,
// which lands in explanations and records, never repeats a token or an
// Authorization value's credential.
func FuzzInspect(f *testing.F) {
	auths := []string{"", "Bearer alice-token", "Bearer", "Bearer ", "Bearer  alice-token", "bEaReR x y", "  Bearer abc  ",
		"Basic YWxpY2U6c2VjcmV0", "Negotiate s3cr3t-negotiation", "s3cr3t-token-without-scheme", "Bearer\tabc", "token abc", "Bearer \x00"}
	protos := []string{"", "v5.channel.k8s.io", "base64url.bearer.authorization.k8s.io.!!!, v5.channel.k8s.io",
		"BASE64URL.BEARER.AUTHORIZATION.K8S.IO.YWJj, v5.channel.k8s.io", "base64url.bearer.authorization.k8s.io.,x"}
	for i, a := range auths {
		for j, p := range protos {
			f.Add(a, p, (i+j)%2 == 0, "")
		}
		f.Add(a, "", true, "websocket-s3cr3t")
	}
	f.Add("", "", true, "a,b")
	f.Fuzz(func(t *testing.T, authz, protocol string, upgrade bool, wsToken string) {
		r, _ := http.NewRequest(http.MethodGet, "https://kproxy/api/v1/pods", nil)
		if authz != "" {
			r.Header.Set("Authorization", authz)
		}
		if protocol != "" {
			r.Header.Add("Sec-WebSocket-Protocol", protocol)
		}
		if wsToken != "" {
			r.Header.Add("Sec-WebSocket-Protocol", "base64url.bearer.authorization.k8s.io."+base64.RawURLEncoding.EncodeToString([]byte(wsToken))+", v4.channel.k8s.io")
		}
		if upgrade {
			r.Header.Set("Connection", "Upgrade")
			r.Header.Set("Upgrade", "websocket")
		}
		before := r.Header.Clone()
		p := Inspect(r)
		if !equalHeaders(r.Header, before) {
			t.Fatalf("Inspect changed the request's headers: %v, was %v", r.Header, before)
		}

		switch p.TokenSource {
		case "":
			if p.Token != "" {
				t.Fatalf("token %q without a source", p.Token)
			}
		case SourceAuthorization:
			if !strings.Contains(authz, p.Token) || p.IgnoredAuthorization != "" {
				t.Fatalf("token %q from Authorization %q (ignored: %q)", p.Token, authz, p.IgnoredAuthorization)
			}
		case SourceWebSocket:
			if !upgrade || p.Token != wsToken && !slices.Contains(webSocketTokens(protocol), p.Token) {
				t.Fatalf("token %q from the WebSocket subprotocol %q / %q (upgrade %v)", p.Token, protocol, wsToken, upgrade)
			}
		default:
			t.Fatalf("token source %q", p.TokenSource)
		}
		if p.Token != "" && p.TokenError != nil {
			t.Fatalf("both a token and a token error (%v)", p.TokenError)
		}
		if p.HasTokenCredential() != (p.Token != "" || p.TokenError != nil) || p.None() != !p.HasTokenCredential() {
			t.Fatalf("verdicts disagree: %+v", p)
		}
		if (p.IgnoredAuthorization != "") != (strings.TrimSpace(authz) != "" && p.TokenSource != SourceAuthorization) {
			t.Fatalf("Authorization %q: ignored %q with token source %q", authz, p.IgnoredAuthorization, p.TokenSource)
		}

		d := strings.ToLower(p.Describe())
		secrets := []string{p.Token, wsToken, strings.TrimSpace(authz)}
		if _, cred, ok := strings.Cut(strings.TrimSpace(authz), " "); ok {
			secrets = append(secrets, strings.TrimSpace(cred))
		}
		for _, s := range secrets {
			s = strings.ToLower(s)
			if len(s) >= 4 && strings.Contains(d, s) && !strings.Contains(describeVocabulary, s) {
				t.Fatalf("Describe repeats the secret %q: %s", s, p.Describe())
			}
		}
	})
}

// webSocketTokens decodes the bearer-token subprotocols in protocol as the
// apiserver does (base64url without padding, not requiring canonical
// trailing bits: "er" decodes as "eg" does).
func webSocketTokens(protocol string) []string {
	const prefix = "base64url.bearer.authorization.k8s.io."
	var out []string
	for _, v := range strings.Split(protocol, ",") {
		if enc, ok := strings.CutPrefix(strings.TrimSpace(v), prefix); ok {
			if b, err := base64.RawURLEncoding.DecodeString(enc); err == nil {
				out = append(out, string(b))
			}
		}
	}
	return out
}
