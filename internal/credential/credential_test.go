package credential

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
)

func wsProtocol(token string) string {
	return "base64url.bearer.authorization.k8s.io." + base64.RawURLEncoding.EncodeToString([]byte(token))
}

func TestInspect(t *testing.T) {
	upgrade := []string{"Connection", "Upgrade", "Upgrade", "websocket"}
	cases := []struct {
		name    string
		headers []string
		cert    bool
		token   string
		source  string
		tokErr  bool
		ignored string
		ignWS   bool
	}{
		{name: "nothing"},
		{name: "bearer", headers: []string{"Authorization", "Bearer abc"}, token: "abc", source: SourceAuthorization},
		{name: "bearer, any case", headers: []string{"Authorization", "bEaReR abc"}, token: "abc", source: SourceAuthorization},
		{name: "bearer, extra words", headers: []string{"Authorization", "Bearer abc def"}, token: "abc", source: SourceAuthorization},
		{name: "bearer, surrounding space", headers: []string{"Authorization", "  Bearer abc  "}, token: "abc", source: SourceAuthorization},
		{name: "empty bearer", headers: []string{"Authorization", "Bearer"}, ignored: "Bearer with no token"},
		{name: "bearer and spaces", headers: []string{"Authorization", "Bearer   "}, ignored: "Bearer with no token"},
		{name: "space before token", headers: []string{"Authorization", "Bearer  abc"}, ignored: "Bearer with a space before the token"},
		{name: "tab separated", headers: []string{"Authorization", "Bearer\tabc"}, ignored: "<value without a known scheme>"},
		{name: "basic", headers: []string{"Authorization", "Basic YWxpY2U6cHc="}, ignored: "Basic"},
		{name: "junk is never repeated", headers: []string{"Authorization", "s3cr3t-token-without-scheme"}, ignored: "<value without a known scheme>"},
		{name: "websocket on upgrade", headers: append([]string{"Sec-WebSocket-Protocol", wsProtocol("abc") + ", v5.channel.k8s.io"}, upgrade...), token: "abc", source: SourceWebSocket},
		{name: "websocket without upgrade", headers: []string{"Sec-WebSocket-Protocol", wsProtocol("abc") + ", v5.channel.k8s.io"}, ignWS: true},
		{name: "websocket alone on upgrade", headers: append([]string{"Sec-WebSocket-Protocol", wsProtocol("abc")}, upgrade...), tokErr: true},
		{name: "websocket bad encoding", headers: append([]string{"Sec-WebSocket-Protocol", "base64url.bearer.authorization.k8s.io.!!!, v5.channel.k8s.io"}, upgrade...), tokErr: true},
		{name: "websocket twice", headers: append([]string{"Sec-WebSocket-Protocol", wsProtocol("a") + "," + wsProtocol("b") + ", v5.channel.k8s.io"}, upgrade...), tokErr: true},
		{name: "bearer wins over websocket", headers: append([]string{"Authorization", "Bearer abc", "Sec-WebSocket-Protocol", wsProtocol("ws") + ", v5.channel.k8s.io"}, upgrade...), token: "abc", source: SourceAuthorization},
		{name: "basic and websocket", headers: append([]string{"Authorization", "Basic x", "Sec-WebSocket-Protocol", wsProtocol("ws") + ", v5.channel.k8s.io"}, upgrade...), token: "ws", source: SourceWebSocket, ignored: "Basic"},
		{name: "certificate", cert: true},
		{name: "certificate and basic", cert: true, headers: []string{"Authorization", "Basic x"}, ignored: "Basic"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := http.NewRequest("GET", "https://kproxy/api", nil)
			for i := 0; i < len(tc.headers); i += 2 {
				r.Header.Add(tc.headers[i], tc.headers[i+1])
			}
			if tc.cert {
				r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{{Subject: pkix.Name{CommonName: "dave"}}}}
			}
			before := r.Header.Clone()
			p := Inspect(r)
			if p.Token != tc.token || p.TokenSource != tc.source {
				t.Errorf("token %q from %q, want %q from %q", p.Token, p.TokenSource, tc.token, tc.source)
			}
			if (p.TokenError != nil) != tc.tokErr {
				t.Errorf("token error %v, want error: %v", p.TokenError, tc.tokErr)
			}
			if p.IgnoredAuthorization != tc.ignored {
				t.Errorf("ignored Authorization %q, want %q", p.IgnoredAuthorization, tc.ignored)
			}
			if p.IgnoredWebSocketToken != tc.ignWS {
				t.Errorf("ignored WebSocket token %v, want %v", p.IgnoredWebSocketToken, tc.ignWS)
			}
			if p.HasCertificate() != tc.cert {
				t.Errorf("certificate %v, want %v", p.HasCertificate(), tc.cert)
			}
			if want := tc.token != "" || tc.tokErr; p.HasTokenCredential() != want {
				t.Errorf("HasTokenCredential %v, want %v", p.HasTokenCredential(), want)
			}
			if got := r.Header; !equalHeaders(got, before) {
				t.Errorf("Inspect changed the request's headers: %v, was %v", got, before)
			}
			d := p.Describe()
			if tc.token != "" && strings.Contains(d, tc.token) || strings.Contains(d, "s3cr3t") {
				t.Errorf("Describe repeats a secret: %s", d)
			}
		})
	}
}

func equalHeaders(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if strings.Join(v, "\x00") != strings.Join(b[k], "\x00") {
			return false
		}
	}
	return true
}
