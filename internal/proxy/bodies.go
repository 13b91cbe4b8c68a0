package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/kproxy/kproxy/internal/decode"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/stages"
)

// With --capture-bodies a write's record carries its body (as JSON, secrets
// redacted) and its Impersonate-* headers: what replaying the request
// later needs (kproxy test generate), and what the TUI's Request tab shows.

// captureBody fills the record's body and impersonation from the replay's
// copy of the request.
func captureBody(rec *record.Request, req *stages.Request) {
	rec.Impersonate = impersonateHeaders(req.HTTP.Header)
	if len(req.Body) == 0 {
		return
	}
	if req.Info != nil && (req.Info.Subresource == "proxy" || req.Info.Verb == "proxy") {
		// What a proxy subresource carries is its backend's (a login
		// form, an API's JSON), not a Kubernetes object: kproxy cannot
		// tell what in it is secret (found by a probe: a password posted
		// through services/proxy was captured).
		rec.BodyNote = "not captured: the body of a proxy subresource is its backend's, not a Kubernetes object, and kproxy cannot tell what in it is secret"
		return
	}
	if !stages.IsWrite(req.Info) {
		return
	}
	if req.BodyTruncated {
		rec.BodyNote = fmt.Sprintf("not captured: over the apiserver's %d MiB request limit", stages.MaxBodyBytes>>20)
		return
	}
	v, err := decode.Value(req.Body)
	if err != nil {
		// A parser's error may quote the body (YAML's invalid map key
		// renders the key's values: probe AD).
		rec.BodyNote = "not captured: " + record.RedactEchoes(err.Error())
		return
	}
	resource, name := "", ""
	if req.Info != nil {
		resource, name = req.Info.Resource, req.Info.Name
	}
	b, err := json.Marshal(record.RedactBodyOf(resource, name, v))
	if err != nil {
		rec.BodyNote = "not captured: " + err.Error()
		return
	}
	rec.Body = b
}

func impersonateHeaders(h http.Header) *record.Impersonation {
	var im record.Impersonation
	for k, vs := range h {
		ck := http.CanonicalHeaderKey(k)
		switch {
		case ck == "Impersonate-User":
			im.User = vs[0]
		case ck == "Impersonate-Uid":
			im.UID = vs[0]
		case ck == "Impersonate-Group":
			im.Groups = append(im.Groups, vs...)
		case strings.HasPrefix(ck, "Impersonate-Extra-"):
			if im.Extra == nil {
				im.Extra = map[string][]string{}
			}
			// As the apiserver reads the key: lowercased, then unescaped
			// ("%41bc" is "Abc").
			key := strings.ToLower(strings.TrimPrefix(ck, "Impersonate-Extra-"))
			if u, err := url.PathUnescape(key); err == nil {
				key = u
			}
			im.Extra[key] = append(im.Extra[key], vs...)
		}
	}
	if im.User == "" && im.UID == "" && len(im.Groups) == 0 && im.Extra == nil {
		return nil
	}
	return &im
}
