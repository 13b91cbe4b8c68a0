package record

import (
	"net/http"
	"net/url"
	"strings"
)

// Redacted replaces a secret value.
const Redacted = "REDACTED"

// sensitiveQuery are query parameters that can carry credentials. The
// apiserver itself accepts access_token on websocket requests.
var sensitiveQuery = map[string]bool{
	"access_token": true,
	"token":        true,
	"password":     true,
}

// RedactQuery returns the raw query with credential-bearing parameters'
// values replaced. It keeps the order and encoding of everything else.
func RedactQuery(raw string) string {
	if raw == "" {
		return ""
	}
	parts := strings.Split(raw, "&")
	changed := false
	for i, p := range parts {
		k, _, ok := strings.Cut(p, "=")
		if !ok {
			continue
		}
		name, err := url.QueryUnescape(k)
		if err != nil {
			name = k
		}
		if sensitiveQuery[strings.ToLower(name)] {
			parts[i] = k + "=" + Redacted
			changed = true
		}
	}
	if !changed {
		return raw
	}
	return strings.Join(parts, "&")
}

// RedactSecretObject blanks the values of a Secret's data and stringData in
// an unstructured object (as decoded from JSON), keeping the keys so that an
// explanation can still name them. Other kinds are returned unchanged.
func RedactSecretObject(obj map[string]any) map[string]any {
	if obj == nil {
		return nil
	}
	if kind, _ := obj["kind"].(string); kind != "Secret" {
		return obj
	}
	for _, field := range []string{"data", "stringData"} {
		m, ok := obj[field].(map[string]any)
		if !ok {
			continue
		}
		for k := range m {
			m[k] = Redacted
		}
	}
	return obj
}

// credentialHeaders carry credentials whole: their values never reach a
// record.
var credentialHeaders = map[string]bool{
	"Authorization":       true,
	"Proxy-Authorization": true,
	"Cookie":              true,
	"Set-Cookie":          true,
}

// bearerProtocol is the WebSocket subprotocol prefix that carries a bearer
// token (the apiserver's authenticator reads it from there).
const bearerProtocol = "base64url.bearer.authorization.k8s.io."

// RedactHeaders copies h with credentials replaced: Authorization,
// Proxy-Authorization and cookies wholly; in Sec-WebSocket-Protocol, the
// token-carrying subprotocol only. The scheme of an Authorization value
// (Bearer, Basic) is kept, since it says which authenticator reads it.
func RedactHeaders(h http.Header) map[string][]string {
	if len(h) == 0 {
		return nil
	}
	out := make(map[string][]string, len(h))
	for k, vs := range h {
		ck := http.CanonicalHeaderKey(k)
		c := make([]string, len(vs))
		for i, v := range vs {
			switch {
			case credentialHeaders[ck]:
				c[i] = Redacted
				if scheme, _, ok := strings.Cut(v, " "); ok && knownScheme(scheme) {
					c[i] = scheme + " " + Redacted
				}
			case ck == "Sec-Websocket-Protocol":
				c[i] = redactProtocols(v)
			default:
				c[i] = v
			}
		}
		out[ck] = c
	}
	return out
}

func redactProtocols(v string) string {
	parts := strings.Split(v, ",")
	for i, p := range parts {
		t := strings.TrimSpace(p)
		if strings.HasPrefix(strings.ToLower(t), bearerProtocol) {
			parts[i] = strings.Replace(p, t, bearerProtocol+Redacted, 1)
		}
	}
	return strings.Join(parts, ",")
}

// knownScheme reports an authorization scheme worth keeping: anything else
// before a space might be part of the credential itself.
func knownScheme(s string) bool {
	switch strings.ToLower(s) {
	case "bearer", "basic":
		return true
	}
	return false
}
