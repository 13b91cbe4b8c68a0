package record

import (
	"net/url"
	"strings"
	"testing"
)

// FuzzRedactQuery: whatever a server could parse as a credential-bearing
// parameter (split on '&' or ';') has its value redacted, and nothing
// else changes.
func FuzzRedactQuery(f *testing.F) {
	for _, s := range []string{"", "a=b", "access_token=x", "limit=1;access_token=X", "acc%65ss_token=abc&watch=1",
		"token=a&token=b", "%zz=1;password=p", "a&&b;;=c", "TOKEN=x;x=token"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		out := RedactQuery(raw)
		if len(strings.FieldsFunc(out, isSep)) != len(strings.FieldsFunc(raw, isSep)) {
			t.Fatalf("RedactQuery(%q) = %q: the parameters changed", raw, out)
		}
		for _, p := range strings.FieldsFunc(out, isSep) {
			k, v, ok := strings.Cut(p, "=")
			if !ok {
				continue
			}
			name, err := url.QueryUnescape(k)
			if err != nil {
				name = k
			}
			if sensitiveQuery[strings.ToLower(strings.TrimSpace(name))] && v != Redacted {
				t.Fatalf("RedactQuery(%q) = %q: %s keeps its value", raw, out, name)
			}
		}
	})
}

func isSep(r rune) bool { return r == '&' || r == ';' }
