package record

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"sigs.k8s.io/yaml"
)

// Redacted replaces a secret value.
const Redacted = "REDACTED"

// sensitiveQuery are query parameters that can carry credentials: the
// apiserver itself accepts access_token on websocket requests; a proxy
// subresource passes any query to its backend, whose keys and signatures
// may be named otherwise (a probe: api_key, client_secret, passwd,
// X-Amz-Signature, sig and id_token were captured verbatim). Names as
// credentialName tells headers are redacted too; no query parameter of
// the apiserver's own is.
var sensitiveQuery = map[string]bool{
	"access_token": true,
	"token":        true,
	"password":     true,
	"sig":          true,
	"code":         true,
	"sid":          true,
	"otp":          true,
}

// credentialQuery reports a query parameter named as a backend's
// credentials are, beyond credentialName's words (a probe: pwd, pass,
// private_key, accesskey, AWSAccessKeyId, jwt, bearer, client_assertion,
// SAMLResponse, sessionid, jsessionid, ticket reached the capture). No
// query parameter of the apiserver's own has any of these in its name.
func credentialQuery(n string) bool {
	for _, w := range []string{"pwd", "pass", "key", "jwt", "bearer", "assertion", "saml", "session", "ticket", "cookie"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
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
			if n := strings.ToLower(strings.TrimSpace(name)); sensitiveQuery[n] || credentialName(n) || credentialQuery(n) {
				part = k + "=" + Redacted
			}
		}
		b.WriteString(part + sep)
	}
	return b.String()
}

// RedactSecretObject blanks the values of a Secret's data and stringData
// (and of any field a Secret does not have) in an unstructured object (as decoded from JSON), keeping the keys so that an
// explanation can still name them. Other kinds are returned unchanged.
func RedactSecretObject(obj map[string]any) map[string]any {
	if obj == nil {
		return nil
	}
	if kind, _ := obj["kind"].(string); kind != "Secret" {
		return obj
	}
	redactSecretFields(obj)
	return obj
}

// secretKeeps are a Secret's top-level fields that hold no data. Every
// other field's values are redacted, known (data, stringData) or not: a
// misspelled one ("stringdata", "Data") is dropped or refused by the
// apiserver, but its values were meant as data (probe F, 2026-12-06).
var secretKeeps = map[string]bool{"apiVersion": true, "kind": true, "metadata": true, "type": true, "immutable": true}

// redactSecretFields blanks the values of every field of a Secret (as
// decoded from JSON) but secretKeeps, keeping a map's keys so that an
// explanation can still name them.
func redactSecretFields(obj map[string]any) {
	for field, v := range obj {
		if secretKeeps[field] {
			continue
		}
		if m, ok := v.(map[string]any); ok {
			for k := range m {
				m[k] = Redacted
			}
		} else {
			obj[field] = Redacted
		}
	}
}

// credentialHeaders carry credentials whole: their values never reach a
// record.
var credentialHeaders = map[string]bool{
	"Authorization":       true,
	"Proxy-Authorization": true,
	"Cookie":              true,
	"Set-Cookie":          true,
}

// redactHelmRelease redacts the release a Helm ConfigMap (helm's
// HELM_DRIVER=configmap, labelled owner=helm) holds: the chart's rendered
// manifests, Secrets and values included, gzipped in data.release (a
// probe recovered a Secret's value from a capture). helm's Secret driver's
// is a Secret's data, redacted as any.
func redactHelmRelease(b map[string]any) {
	md, _ := b["metadata"].(map[string]any)
	labels, _ := md["labels"].(map[string]any)
	if owner, _ := labels["owner"].(string); owner != "helm" {
		return
	}
	redactHelmReleaseData(b)
}

// redactHelmReleaseData redacts data.release, every binaryData value (a
// probe: a merge patch of binaryData kept), and the copy kubectl apply
// keeps in an annotation (a probe: kept there).
func redactHelmReleaseData(b map[string]any) {
	if data, ok := b["data"].(map[string]any); ok {
		if _, ok := data["release"]; ok {
			data["release"] = Redacted
		}
	}
	if bin, ok := b["binaryData"].(map[string]any); ok {
		for k := range bin {
			bin[k] = Redacted
		}
	}
	md, _ := b["metadata"].(map[string]any)
	if ann, ok := md["annotations"].(map[string]any); ok {
		if _, ok := ann[lastApplied]; ok {
			ann[lastApplied] = Redacted
		}
	}
}

// credentialName reports a header named as credentials are: the
// apiserver reads none but Authorization, but a proxy subresource
// (services/proxy, pods/proxy, nodes/proxy) passes every header to its
// backend, and backends take keys and tokens in headers of their own (a
// probe's X-Api-Key was captured verbatim).
func credentialName(ck string) bool {
	l := strings.ToLower(ck)
	for _, w := range []string{"token", "secret", "passw", "apikey", "api-key", "api_key", "auth", "credential", "signature"} {
		if strings.Contains(l, w) {
			return true
		}
	}
	return false
}

// bearerProtocol is the WebSocket subprotocol prefix that carries a bearer
// token (the apiserver's authenticator reads it from there).
const bearerProtocol = "base64url.bearer.authorization.k8s.io."

// restatedHeaders are headers another field of the record already holds:
// they are left out of Request.Headers and Actual.Headers. Content-Length
// is Request.BodyBytes and Actual.ResponseBytes, Date is Start to the
// second, and the APF headers are Actual.FlowSchemaUID and
// Actual.PriorityLevelUID. Audit-Id stays, though Actual.AuditID holds
// it: it is what ties the response, as the client (or a HAR export) has
// it, to the apiserver's audit log.
var restatedHeaders = map[string]bool{
	"Content-Length":                    true,
	"Date":                              true,
	"X-Kubernetes-Pf-Flowschema-Uid":    true,
	"X-Kubernetes-Pf-Prioritylevel-Uid": true,
}

// RedactHeaders copies h for a record, with credentials replaced:
// Authorization, Proxy-Authorization and cookies wholly; in
// Sec-WebSocket-Protocol, the token-carrying subprotocol only. The scheme
// of an Authorization value (Bearer, Basic) is kept, since it says which
// authenticator reads it. Headers the record restates elsewhere
// (restatedHeaders) are left out.
func RedactHeaders(h http.Header) map[string][]string {
	if len(h) == 0 {
		return nil
	}
	out := make(map[string][]string, len(h))
	for k, vs := range h {
		ck := http.CanonicalHeaderKey(k)
		if restatedHeaders[ck] {
			continue
		}
		c := make([]string, len(vs))
		for i, v := range vs {
			switch {
			case credentialHeaders[ck] || credentialName(ck):
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
	if len(out) == 0 {
		return nil
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
// record: a Secret's data and stringData values, and those of any field a
// Secret does not have (and the copy kubectl
// apply keeps in an annotation), a JSON patch's values on secrets, a
// TokenReview's token, and the credentials of kubeconfigs a ConfigMap
// holds (RedactKubeconfig; in any patch of one too). v is the body decoded
// from JSON.
func RedactBody(resource string, v any) any { return RedactBodyOf(resource, "", v) }

// redactPatchValues redacts every value of a JSON patch, in place.
func redactPatchValues(ops []any) {
	for _, op := range ops {
		if m, ok := op.(map[string]any); ok {
			if _, ok := m["value"]; ok {
				m["value"] = Redacted
			}
		}
	}
}

// helmReleasePrefix begins the name of the ConfigMap (or Secret) helm
// keeps a release in.
const helmReleasePrefix = "sh.helm.release.v1."

// RedactBodyOf is RedactBody for a request to the object named name: a
// patch of a Helm release's ConfigMap carries no label to tell it by,
// its name does (a probe: a merge and a JSON patch of data.release kept).
func RedactBodyOf(resource, name string, v any) any {
	if resource == "configmaps" && strings.HasPrefix(name, helmReleasePrefix) {
		switch b := v.(type) {
		case map[string]any:
			redactKubeconfigs(b)
			redactHelmReleaseData(b)
			return b
		case []any:
			// A JSON patch: its values are the release, or parts of it.
			redactPatchValues(b)
			return b
		}
	}
	switch b := v.(type) {
	case map[string]any:
		kind, _ := b["kind"].(string)
		switch {
		case resource == "secrets" || kind == "Secret":
			redactSecretFields(b)
			if md, ok := b["metadata"].(map[string]any); ok {
				if ann, ok := md["annotations"].(map[string]any); ok {
					if _, ok := ann[lastApplied]; ok {
						ann[lastApplied] = Redacted
					}
				}
			}
		case resource == "tokenreviews" || kind == "TokenReview":
			// Whatever the spelling: the apiserver reads spec.token alone
			// (and refuses a "Token" as missing), but the value a client
			// put there is a token all the same (a probe: "Token" kept).
			for k, v := range b {
				if strings.EqualFold(k, "token") {
					b[k] = Redacted // misplaced, refused: a token all the same (probe AE)
					continue
				}
				if spec, ok := v.(map[string]any); ok && strings.EqualFold(k, "spec") {
					for f := range spec {
						if strings.EqualFold(f, "token") {
							spec[f] = Redacted
						}
					}
				}
			}
		case resource == "configmaps" || kind == "ConfigMap":
			redactKubeconfigs(b)
			redactHelmRelease(b)
			redactNonStringData(b)
		}
		return b
	case []any:
		if resource == "configmaps" {
			// A JSON patch of a ConfigMap: its values may be kubeconfigs.
			redactKubeconfigs(b)
			redactNonStringPatchData(b)
			return b
		}
		// A JSON patch: on a Secret every value may be data.
		if resource != "secrets" {
			return b
		}
		redactPatchValues(b)
		return b
	}
	if resource == "secrets" || resource == "tokenreviews" {
		return Redacted
	}
	return v
}

// redactNonStringData redacts a ConfigMap body's data and binaryData
// values that are not strings. A ConfigMap holds strings only, so the
// apiserver refuses such a body, but its value is whatever the client
// meant to store: a kubeconfig sent as an object (a probe: a server-side
// apply of data.kubeconfig as YAML, refused 500, recorded its token),
// which redactKubeconfigs, reading strings, does not know.
func redactNonStringData(b map[string]any) {
	for _, k := range []string{"data", "binaryData"} {
		m, ok := b[k].(map[string]any)
		if !ok {
			continue
		}
		for dk, v := range m {
			if _, ok := v.(string); !ok && v != nil {
				m[dk] = Redacted
			}
		}
	}
}

// redactNonStringPatchData is redactNonStringData for a JSON patch's
// operations on a ConfigMap's data or binaryData: a value that is not a
// string under /data/KEY, or a map's under /data.
func redactNonStringPatchData(ops []any) {
	for _, o := range ops {
		op, ok := o.(map[string]any)
		if !ok {
			continue
		}
		path, _ := op["path"].(string)
		v, has := op["value"]
		if !has || v == nil {
			continue
		}
		switch {
		case path == "/data" || path == "/binaryData":
			if m, ok := v.(map[string]any); ok {
				redactNonStringData(map[string]any{"data": m})
			} else if _, ok := v.(string); !ok {
				op["value"] = Redacted
			}
		case strings.HasPrefix(path, "/data/") || strings.HasPrefix(path, "/binaryData/"):
			if _, ok := v.(string); !ok {
				op["value"] = Redacted
			}
		}
	}
}

// RedactConfigMapObject redacts the credentials of the kubeconfigs a
// ConfigMap holds, in an unstructured object (as decoded from JSON): in
// its data and binaryData values and in the copy kubectl apply keeps in an
// annotation (RedactKubeconfig). Everything else is kept. Other kinds are
// returned unchanged (an object without a kind is taken for a ConfigMap).
func RedactConfigMapObject(obj map[string]any) map[string]any {
	if obj == nil {
		return nil
	}
	if kind, _ := obj["kind"].(string); kind != "ConfigMap" && kind != "" {
		return obj
	}
	redactKubeconfigs(obj)
	redactHelmRelease(obj)
	return obj
}

// redactKubeconfigs walks a decoded JSON value and redacts, in place, the
// credentials of every string that holds a kubeconfig, of the base64
// values of a binaryData map that hold one, and of the kubeconfigs inside
// a string that holds a JSON object (kubectl apply's last-applied
// annotation). It reports whether anything changed.
func redactKubeconfigs(v any) bool {
	changed := false
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok {
				if r, ok := redactKubeconfigString(s, false); ok {
					x[k], changed = r, true
				}
				continue
			}
			if bd, ok := e.(map[string]any); ok && k == "binaryData" {
				for bk, be := range bd {
					if s, ok := be.(string); ok {
						if r, ok := redactKubeconfigString(s, true); ok {
							bd[bk], changed = r, true
						}
					}
				}
				continue
			}
			if redactKubeconfigs(e) {
				changed = true
			}
		}
	case []any:
		for i, e := range x {
			if s, ok := e.(string); ok {
				if r, ok := redactKubeconfigString(s, false); ok {
					x[i], changed = r, true
				}
				continue
			}
			if redactKubeconfigs(e) {
				changed = true
			}
		}
	}
	return changed
}

// redactKubeconfigString redacts the kubeconfig s holds (base64-encoded
// when b64), or the kubeconfigs inside the JSON object s holds.
func redactKubeconfigString(s string, b64 bool) (string, bool) {
	if b64 {
		raw, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return s, false
		}
		r, ok := RedactKubeconfig(string(raw))
		if !ok {
			return s, false
		}
		return base64.StdEncoding.EncodeToString([]byte(r)), true
	}
	if r, ok := RedactKubeconfig(s); ok {
		return r, true
	}
	t := strings.TrimSpace(s)
	if !strings.HasPrefix(t, "{") || !strings.Contains(t, "users") {
		return s, false
	}
	var inner any
	if err := json.Unmarshal([]byte(t), &inner); err != nil || !redactKubeconfigs(inner) {
		return s, false
	}
	b, err := json.Marshal(inner)
	if err != nil {
		return Redacted, true
	}
	return string(b), true
}

// kubeconfigUserSecrets are the credentials of a kubeconfig's
// users[].user (client-certificate and client-key are paths: kept).
var kubeconfigUserSecrets = []string{"token", "password", "client-key-data"}

// authProviderSecrets are the credentials in users[].user.auth-provider.config
// (oidc, gcp, azure).
var authProviderSecrets = []string{"id-token", "refresh-token", "access-token", "client-secret"}

// RedactKubeconfig returns s with a kubeconfig's credentials replaced when
// s is a kubeconfig (JSON or YAML, kind Config, apiVersion v1; or no kind
// but a users list, which client-go loads as one): each user's token,
// password and client-key-data, its auth-provider's id-token,
// refresh-token, access-token and client-secret, and the values of exec
// environment variables whose names say token, secret, password or key.
// The rest (servers, CA data, user names, paths) is kept, re-encoded as
// YAML (JSON when s was JSON). Text that looks like a kubeconfig with
// credentials but does not parse is replaced whole. The second result
// says whether anything was redacted (s is returned as it is otherwise).
func RedactKubeconfig(s string) (string, bool) {
	if !strings.Contains(s, "users") {
		return s, false
	}
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(s), &cfg); err != nil {
		if strings.Contains(s, "clusters") && containsAny(s, "token", "password", "client-key-data") {
			return Redacted, true
		}
		return s, false
	}
	kind, _ := cfg["kind"].(string)
	apiVersion, _ := cfg["apiVersion"].(string)
	users, isList := cfg["users"].([]any)
	if !isList || (kind != "Config" && kind != "") || (apiVersion != "v1" && apiVersion != "") {
		return s, false
	}
	changed := false
	for _, u := range users {
		um, _ := u.(map[string]any)
		user, _ := um["user"].(map[string]any)
		if user == nil {
			continue
		}
		changed = redactKeys(user, kubeconfigUserSecrets) || changed
		if ap, ok := user["auth-provider"].(map[string]any); ok {
			if c, ok := ap["config"].(map[string]any); ok {
				changed = redactKeys(c, authProviderSecrets) || changed
			}
		}
		if ex, ok := user["exec"].(map[string]any); ok {
			env, _ := ex["env"].([]any)
			for _, e := range env {
				em, _ := e.(map[string]any)
				name, _ := em["name"].(string)
				if _, ok := em["value"]; ok && containsAny(strings.ToLower(name), "token", "secret", "password", "key") {
					em["value"], changed = Redacted, true
				}
			}
		}
	}
	if !changed {
		return s, false
	}
	var out []byte
	var err error
	if strings.HasPrefix(strings.TrimSpace(s), "{") {
		out, err = json.Marshal(cfg)
	} else {
		out, err = yaml.Marshal(cfg)
	}
	if err != nil {
		return Redacted, true
	}
	return string(out), true
}

// redactKeys replaces the values of keys in m; it reports whether any was
// there.
func redactKeys(m map[string]any, keys []string) bool {
	found := false
	for _, k := range keys {
		if _, ok := m[k]; ok {
			m[k], found = Redacted, true
		}
	}
	return found
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// valueRendering finds structured-merge-diff's Go rendering of a value in
// a server-side apply's error ("expected string, got
// &value.valueUnstructured{Value:987654321}"): the apiserver quotes the
// value itself, which for a Secret is its data (probe O, 2026-12-07).
var valueRendering = regexp.MustCompile(`&value\.value[A-Za-z]*\{(?:Value:)?`)

// RedactEchoes replaces what the apiserver's messages echo of a request's
// body or a stored object with REDACTED, keeping the rest of the message
// (what was wrong, and where). A message reaches records, explanations,
// spans and logs, and for a Secret (or a ConfigMap holding a kubeconfig
// or a Helm release, or a TokenReview) what it echoes is secret:
//   - structured-merge-diff's Go rendering of a server-side apply's value
//     ("expected string, got &value.valueUnstructured{Value:987654321}",
//     probe O);
//   - a field.Invalid quoting a whole object or a Go map (a merge patch
//     that does not decode: `patch: Invalid value: "{\"data\":…}"`, the
//     patched object with every stored value; a strategic merge patch:
//     `Invalid value: "map[data:map[…]]"`, probe AD);
//   - YAML's invalid map key, rendered with its values ("yaml: invalid
//     map key: map[interface {}]interface {}{\"pw\":…}", probe AD);
//   - the body's first 30 bytes, as text or hex, that the apiserver adds
//     to "the object provided is unrecognized" (summarizeData, probe AD),
//     and the whole body its missing kind or apiVersion quotes.
func RedactEchoes(s string) string {
	if len(s) < len(invalidMapKey) {
		return s
	}
	if strings.Contains(s, "&value.value") {
		s = redactValueRenderings(s)
	}
	if strings.Contains(s, `Invalid value: "`) {
		s = redactInvalidObjects(s)
	}
	if i := strings.Index(s, invalidMapKey); i >= 0 {
		end := strings.IndexByte(s[i:], '\n')
		if end < 0 {
			s = s[:i+len(invalidMapKey)] + Redacted
		} else {
			s = s[:i+len(invalidMapKey)] + Redacted + s[i+end:]
		}
	}
	if strings.HasPrefix(s, unrecognizedObject) && strings.HasSuffix(s, ")") {
		// The summary is 30 bytes at most, " ..." after: as text, it
		// begins within the last 37 bytes.
		tail := max(0, len(s)-37)
		if i := strings.LastIndex(s, " ("); i >= 0 && bodySummary.MatchString(s[i+2:len(s)-1]) {
			s = s[:i] + " (" + Redacted + ")"
		} else if i := strings.Index(s[tail:], " ({"); i >= 0 {
			s = s[:tail+i] + " (" + Redacted + ")"
		}
	}
	// runtime's missing kind or apiVersion quotes the whole body.
	if !strings.Contains(s, "' is missing in '") {
		return s
	}
	for _, marker := range []string{"Object 'Kind' is missing in '", "Object 'apiVersion' is missing in '"} {
		if i := strings.Index(s, marker); i >= 0 {
			from := i + len(marker)
			if end := strings.LastIndex(s[from:], "'"); end >= 0 {
				s = s[:from] + Redacted + s[from+end:]
			} else {
				s = s[:from] + Redacted
			}
		}
	}
	return s
}

const (
	invalidMapKey      = "invalid map key: "
	unrecognizedObject = "the object provided is unrecognized (must be of type "
)

// bodySummary is summarizeData's hex of a body (30 bytes at most, " ..."
// when cut) or its "<empty>".
var bodySummary = regexp.MustCompile(`^(?:<empty>|(?:[0-9a-f]{2}){1,30}(?: \.\.\.)?)$`)

// invalidObject finds a field.Invalid's quoted value; redacted when it is
// an object or a Go map.
var invalidObject = regexp.MustCompile(`Invalid value: "`)

// redactInvalidObjects replaces each quoted object or map a field.Invalid
// quotes, to its closing quote (escapes skipped; to the end when cut
// short).
func redactInvalidObjects(s string) string {
	isObject := func(rest string) bool { return strings.HasPrefix(rest, "{") || strings.HasPrefix(rest, "map[") }
	return redactMatches(s, invalidObject, isObject, closingQuote)
}

// redactValueRenderings replaces the values the apiserver quotes in its
// Go rendering of a server-side apply's fields (valueRendering) with
// REDACTED, keeping the rest of the message (the field's path and what
// was expected). The rendering's braces are matched, skipping quoted
// strings, so a value holding braces or quotes is redacted whole.
func redactValueRenderings(s string) string {
	return redactMatches(s, valueRendering, nil, closingBrace)
}

// redactMatches replaces what follows each match of re, where quoted
// says it is a quoted value (nil: always), up to the character closing
// finds (kept; -1: cut short, redacted to the end).
func redactMatches(s string, re *regexp.Regexp, quoted func(rest string) bool, closing func(s string, from int) int) string {
	var b strings.Builder
	last := 0
	for _, loc := range re.FindAllStringIndex(s, -1) {
		from := loc[1]
		if loc[0] < last || quoted != nil && !quoted(s[from:]) {
			continue // inside a value already redacted, or not one
		}
		b.WriteString(s[last:from])
		b.WriteString(Redacted)
		end := closing(s, from)
		if end < 0 {
			return b.String()
		}
		last = end
	}
	if b.Len() == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

// closingQuote is the index of the quote that closes a Go-quoted string
// begun just before from, or -1.
func closingQuote(s string, from int) int {
	for i := from; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return -1
}

// closingBrace is the index of the brace that closes the one opened just
// before from, skipping Go-quoted strings, or -1.
func closingBrace(s string, from int) int {
	depth := 1
	for i := from; i < len(s); i++ {
		switch s[i] {
		case '"', '`':
			q := s[i]
			for i++; i < len(s) && s[i] != q; i++ {
				if s[i] == '\\' && q == '"' {
					i++
				}
			}
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}

// RedactExplanations applies RedactEchoes to stages'
// explanations and their children's, in place.
func RedactExplanations(stages []StageResult) {
	for i := range stages {
		stages[i].Explanation = RedactEchoes(stages[i].Explanation)
		RedactExplanations(stages[i].Children)
	}
}

// ConfigMapMayHoldSecrets reports whether a ConfigMap's body (in any
// encoding) or name may hold what SecretStrings finds in one: a
// kubeconfig (its users), a Helm release (named or labelled helm), or
// binaryData (a kubeconfig base64-encoded). Most ConfigMaps hold none,
// and finding their values decodes the body three times (make bench's
// 2.9 MB writes, refused: kproxy's RSS peak had grown from +75 to +147
// MiB).
func ConfigMapMayHoldSecrets(name string, raw []byte) bool {
	return strings.Contains(name, "helm") || bytes.Contains(raw, []byte("users")) || bytes.Contains(raw, []byte("helm")) || bytes.Contains(raw, []byte("binaryData"))
}

// SecretStrings are the values RedactBodyOf takes out of a request body
// (JSON), for scrubbing from the messages of
// the request's answer: a refusal can quote them in free text (a probe: a
// ValidatingAdmissionPolicy's messageExpression quoting a Secret's data,
// which no echo pattern knows). Values shorter than 4 characters are left
// out: replacing them everywhere would say nothing and mangle messages.
func SecretStrings(resource, name string, body []byte) []string {
	// Decoded twice: RedactBodyOf redacts in place, and the original is
	// compared with it.
	var orig, copied any
	if json.Unmarshal(body, &orig) != nil || json.Unmarshal(body, &copied) != nil {
		return nil
	}
	var out []string
	var all func(o any) // every leaf of a value redacted whole
	all = func(o any) {
		switch ov := o.(type) {
		case map[string]any:
			for _, v := range ov {
				all(v)
			}
		case []any:
			for _, v := range ov {
				all(v)
			}
		case nil, bool:
		default:
			s, ok := ov.(string)
			if !ok {
				j, _ := json.Marshal(ov)
				s = string(j)
			}
			if len(s) >= 4 {
				out = append(out, s)
			}
		}
	}
	var walk func(o, r any)
	walk = func(o, r any) {
		if rs, ok := r.(string); ok {
			if os, ok := o.(string); !ok || os != rs {
				all(o)
				// A string redacted in part (a kubeconfig's credentials,
				// in a YAML or JSON text, base64-encoded or not): the
				// parts, which a policy may quote on their own (probe AG:
				// a kubeconfig's token).
				if ok && rs != Redacted {
					if oi, ri, ok := parsedPair(os, rs); ok {
						walk(oi, ri)
					}
				}
			}
			return
		}
		switch ov := o.(type) {
		case map[string]any:
			rv, _ := r.(map[string]any)
			for k, v := range ov {
				walk(v, rv[k])
			}
		case []any:
			rv, _ := r.([]any)
			for i, v := range ov {
				if i < len(rv) {
					walk(v, rv[i])
				}
			}
		}
	}
	walk(orig, RedactBodyOf(resource, name, copied))
	return out
}

// parsedPair parses a string and its redacted copy as YAML (JSON too),
// base64-decoding both first when both decode: the trees whose leaves
// differ where the redaction took something out.
func parsedPair(o, r string) (oi, ri any, ok bool) {
	if od, err := base64.StdEncoding.DecodeString(o); err == nil {
		if rd, err := base64.StdEncoding.DecodeString(r); err == nil {
			o, r = string(od), string(rd)
		}
	}
	if yaml.Unmarshal([]byte(o), &oi) != nil || yaml.Unmarshal([]byte(r), &ri) != nil {
		return nil, nil, false
	}
	switch oi.(type) {
	case map[string]any, []any:
		return oi, ri, true
	}
	return nil, nil, false
}

// ScrubValues replaces each of values in s with REDACTED: as it is, its
// standard base64 encoding, JSON-escaped (a value quoted inside a JSON
// string, as kubectl's last-applied-configuration annotation holds a
// Secret's stringData: probe AI), and, when it is base64 (a Secret's
// data), what it decodes to and that re-encoded on one line. Then what
// is derived from one (scrubRuns): a policy's message may quote part of a
// value, change its case or base64-encode a part (probe AH).
func ScrubValues(s string, values []string) string {
	if s == "" {
		return s
	}
	var plain []string // the values as text, for scrubRuns
	for _, v := range values {
		forms := []string{v, base64.StdEncoding.EncodeToString([]byte(v))}
		plain = append(plain, v)
		if d, err := base64.StdEncoding.DecodeString(v); err == nil && len(d) >= 4 {
			// And re-encoded on one line: base64 wrapped over lines
			// (as base64(1) prints it) decodes alike, and a policy
			// quotes a Secret's data unwrapped (probe AG).
			forms = append(forms, string(d), base64.StdEncoding.EncodeToString(d))
			plain = append(plain, string(d))
		}
		for _, f := range forms {
			s = strings.ReplaceAll(s, f, Redacted)
			for _, e := range jsonEscaped(f) {
				s = strings.ReplaceAll(s, e, Redacted)
			}
		}
	}
	for _, v := range plain {
		// Only a value that is one word (a password, a token, a key's
		// base64): a document's runs (a kubeconfig's "password:") are
		// ordinary words, and its credentials are values of their own
		// (SecretStrings).
		if !strings.ContainsFunc(v, unicode.IsSpace) {
			s = scrubRuns(s, v)
		}
	}
	return s
}

// jsonEscaped is v as it appears inside a JSON string, HTML characters
// escaped (Go's encoding/json, kubectl) and not, where that differs
// from v.
func jsonEscaped(v string) []string {
	var out []string
	for _, html := range []bool{true, false} {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(html)
		if enc.Encode(v) != nil {
			continue
		}
		e := strings.TrimSuffix(strings.TrimSpace(b.String()), `"`)
		e = strings.TrimPrefix(e, `"`)
		if e != v && !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return out
}

// minSecretRun is the shortest part of a secret value scrubRuns takes
// for the value's: shorter runs match ordinary words too often.
const minSecretRun = 8

// maxRunSource bounds the part of a value scrubRuns looks for runs of
// (a certificate chain is long; its first 4 KiB are what a message
// would quote).
const maxRunSource = 4096

// base64Token is a run of text that may be base64 of something.
var base64Token = regexp.MustCompile(`[A-Za-z0-9+/_-]{12,}={0,2}`)

// scrubRuns replaces with REDACTED every run of s that is a part of v at
// least minSecretRun bytes long, in any case, and every base64 token of s
// that decodes to text holding such a part.
func scrubRuns(s, v string) string {
	if len(v) < minSecretRun || len(s) < minSecretRun {
		return s
	}
	v = v[:min(len(v), maxRunSource)]
	if cut := runsOf(s, v); len(cut) > 0 {
		s = cutOut(s, cut)
	}
	var cut [][2]int
	for _, loc := range base64Token.FindAllStringIndex(s, -1) {
		tok := s[loc[0]:loc[1]]
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
			if d, err := enc.DecodeString(tok); err == nil && len(runsOf(string(d), v)) > 0 {
				cut = append(cut, [2]int{loc[0], loc[1]})
				break
			}
		}
	}
	if len(cut) > 0 {
		s = cutOut(s, cut)
	}
	return s
}

// maxRuns bounds the ranges runsOf collects: a text that repeats a part
// of a value that often (a value of one repeated character) is cut out
// whole.
const maxRuns = 4096

// runsOf is where in s a part of v at least minSecretRun bytes long
// appears, case aside (ASCII), as byte ranges that may overlap.
func runsOf(s, v string) [][2]int {
	ls, lv := asciiLower(s), asciiLower(v)
	var cut [][2]int
	seen := map[string]bool{}
	for i := 0; i+minSecretRun <= len(lv); i++ {
		w := lv[i : i+minSecretRun]
		if seen[w] {
			continue
		}
		seen[w] = true
		for from := 0; ; {
			j := strings.Index(ls[from:], w)
			if j < 0 {
				break
			}
			j += from
			if len(cut) == maxRuns {
				return [][2]int{{0, len(s)}}
			}
			cut = append(cut, [2]int{j, j + minSecretRun})
			from = j + 1
		}
	}
	return cut
}

// asciiLower lowers ASCII letters only, so that byte offsets stay those
// of the original.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// cutOut replaces the union of the ranges of s with one REDACTED per
// stretch, widened to whole UTF-8 characters.
func cutOut(s string, ranges [][2]int) string {
	slices.SortFunc(ranges, func(a, b [2]int) int { return a[0] - b[0] })
	var b strings.Builder
	last := 0
	for i := 0; i < len(ranges); {
		start, end := ranges[i][0], ranges[i][1]
		for i++; i < len(ranges) && ranges[i][0] <= end; i++ {
			end = max(end, ranges[i][1])
		}
		for start > 0 && !utf8.RuneStart(s[start]) {
			start--
		}
		for end < len(s) && !utf8.RuneStart(s[end]) {
			end++
		}
		if start < last {
			start = last
		}
		b.WriteString(s[last:start])
		b.WriteString(Redacted)
		last = end
	}
	b.WriteString(s[last:])
	return b.String()
}
