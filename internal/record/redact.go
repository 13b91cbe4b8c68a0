package record

import (
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
