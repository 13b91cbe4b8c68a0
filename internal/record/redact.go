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
// Parameters are split on '&' and on ';', which some servers and older Go
// versions also accept as a separator: whatever a server could parse as a
// parameter is redacted.
func RedactQuery(raw string) string {
	if raw == "" {
		return ""
	}
	var b strings.Builder
	for len(raw) > 0 {
		i := strings.IndexAny(raw, "&;")
		part, sep := raw, ""
		if i >= 0 {
			part, sep, raw = raw[:i], raw[i:i+1], raw[i+1:]
		} else {
			raw = ""
		}
		if k, _, ok := strings.Cut(part, "="); ok {
			name, err := url.QueryUnescape(k)
			if err != nil {
				name = k
			}
			if sensitiveQuery[strings.ToLower(strings.TrimSpace(name))] {
				part = k + "=" + Redacted
			}
		}
		b.WriteString(part + sep)
	}
	return b.String()
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

// lastApplied is the annotation kubectl apply keeps the applied object in:
// a Secret's holds its data.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// RedactBody redacts what a request body to resource must not leave in a
// record: a Secret's data and stringData values (and the copy kubectl
// apply keeps in an annotation), a JSON patch's values on secrets, and a
// TokenReview's token. v is the body decoded from JSON.
func RedactBody(resource string, v any) any {
	switch b := v.(type) {
	case map[string]any:
		kind, _ := b["kind"].(string)
		switch {
		case resource == "secrets" || kind == "Secret":
			for _, field := range []string{"data", "stringData"} {
				if m, ok := b[field].(map[string]any); ok {
					for k := range m {
						m[k] = Redacted
					}
				} else if _, ok := b[field]; ok {
					b[field] = Redacted
				}
			}
			if md, ok := b["metadata"].(map[string]any); ok {
				if ann, ok := md["annotations"].(map[string]any); ok {
					if _, ok := ann[lastApplied]; ok {
						ann[lastApplied] = Redacted
					}
				}
			}
		case resource == "tokenreviews" || kind == "TokenReview":
			if spec, ok := b["spec"].(map[string]any); ok {
				if _, ok := spec["token"]; ok {
					spec["token"] = Redacted
				}
			}
		}
		return b
	case []any:
		// A JSON patch: on a Secret every value may be data.
		if resource != "secrets" {
			return b
		}
		for _, op := range b {
			if m, ok := op.(map[string]any); ok {
				if _, ok := m["value"]; ok {
					m["value"] = Redacted
				}
			}
		}
		return b
	}
	if resource == "secrets" || resource == "tokenreviews" {
		return Redacted
	}
	return v
}
