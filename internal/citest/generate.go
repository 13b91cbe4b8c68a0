package citest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"

	utilnet "k8s.io/apimachinery/pkg/util/net"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/testfile"
)

// Generate turns recorded traffic into a test file whose expectations are
// the answers the apiserver gave: its status and reason, its warnings,
// and the deciding stage where kproxy's prediction agreed with it. It
// returns notes on the records it could not turn into a case, and why.
func Generate(recs []*record.Record, name string) (*testfile.File, []string) {
	f := &testfile.File{APIVersion: testfile.APIVersion, Kind: testfile.Kind, Metadata: testfile.Metadata{Name: name}}
	var notes []string
	names := map[string]int{}
	for _, r := range recs {
		c, why := caseOf(r)
		if why != "" {
			notes = append(notes, fmt.Sprintf("record %s (%s %s → %d) skipped: %s", r.ID, r.Request.Method, r.Request.Path, r.Actual.Status, why))
			continue
		}
		base := c.Name
		if n := names[base]; n > 0 {
			c.Name = fmt.Sprintf("%s #%d", base, n+1)
		}
		names[base]++
		f.Cases = append(f.Cases, *c)
	}
	return f, notes
}

func caseOf(r *record.Record) (*testfile.Case, string) {
	if r.RerunOf != "" {
		return nil, "a re-run, not traffic"
	}
	if r.Actual.Status == 0 || r.Actual.Error != "" {
		return nil, "no answer from the apiserver (kproxy answered: " + r.Actual.Error + ")"
	}
	if m := strings.ToUpper(r.Request.Method); !slices.Contains(testfile.Methods(), m) {
		// The apiserver answers such a method 405 (or refuses it first);
		// a test file sends only the methods a request to it has.
		return nil, "a test case sends " + strings.Join(testfile.Methods(), ", ") + "; not " + r.Request.Method
	}
	if r.Actual.Status == http.StatusUnauthorized || r.Identity == "rejected" {
		return nil, "the credential was refused, and credentials are never captured: write this case by hand with a token or tokenFile"
	}
	c := &testfile.Case{}
	var notes []string
	switch u := r.Request.User; u {
	case "system:anonymous":
		c.Anonymous = true
	case "":
		return nil, "the record does not say who sent it"
	default:
		c.User = u
		for _, g := range r.Request.Groups {
			if g != "system:authenticated" {
				c.Groups = append(c.Groups, g)
			}
		}
	}
	switch {
	case r.Request.Impersonate != nil:
		im := *r.Request.Impersonate
		c.Impersonate = &testfile.Identity{User: im.User, Groups: im.Groups, UID: im.UID, Extra: im.Extra}
	case r.Request.ActingAs != "":
		c.Impersonate = &testfile.Identity{User: r.Request.ActingAs}
		notes = append(notes, "the impersonated groups were not captured (record with --capture-bodies)")
	}
	path := r.Request.Path
	if r.Request.Query != "" {
		path += "?" + r.Request.Query
		if strings.Contains(r.Request.Query, record.Redacted) {
			notes = append(notes, "the query had a credential, redacted in the capture")
		}
	}
	c.Request = testfile.Request{Method: r.Request.Method, Path: path, Headers: keptHeaders(r.Request.Headers)}
	if ct := r.Request.ContentType; ct != "" && hasBody(r.Request.Method) {
		c.Request.ContentType = ct
	}
	if hasBody(r.Request.Method) && r.Request.BodyBytes > 0 {
		if len(r.Request.Body) == 0 {
			why := "a write without its body in the capture: record with kproxy serve --capture-bodies"
			if r.Request.BodyNote != "" {
				why = "its body was not captured: " + r.Request.BodyNote
			}
			return nil, why
		}
		var body any
		if err := json.Unmarshal(r.Request.Body, &body); err != nil {
			return nil, "its captured body is not JSON: " + err.Error()
		}
		c.Request.Body = body
		// The body is sent as JSON whatever it was recorded as (it is
		// captured decoded), except patches, whose type says how to apply.
		if !strings.Contains(c.Request.ContentType, "patch") {
			c.Request.ContentType = "application/json"
		}
		if strings.Contains(string(r.Request.Body), record.Redacted) {
			notes = append(notes, "Secret values or tokens in the body were redacted in the capture; the case sends the redacted values")
		}
	}
	c.Expect.Status = r.Actual.Status
	if r.Actual.Status >= 400 {
		c.Expect.Reason = r.Actual.Reason
	}
	p := r.Predicted
	switch {
	case p.Stage == record.StageUnknown:
		notes = append(notes, "kproxy could not predict it, so the deciding stage is not asserted")
	case p.Status == r.Actual.Status && r.Actual.Status >= 400:
		c.Expect.Stage = p.Stage
	case p.Status == r.Actual.Status:
		c.Expect.Stage = testfile.StageNone
	default:
		notes = append(notes, fmt.Sprintf("kproxy predicted %d at %s, the apiserver answered %d: the deciding stage is not asserted", p.Status, p.Stage, r.Actual.Status))
	}
	// The record keeps each Warning header as sent (299 - "text"); a
	// case matches the text, as kproxy test run reads it (found by a
	// probe: every case with a warning failed).
	for _, h := range r.Actual.Warnings {
		text := h
		if ws, _, err := utilnet.ParseWarningHeader(h); err == nil {
			text = ws.Text
		}
		c.Expect.Warnings = append(c.Expect.Warnings, "^"+regexp.QuoteMeta(text)+"$")
	}
	c.Name = caseName(r)
	c.Note = strings.Join(slices.Compact(notes), "; ")
	return c, ""
}

// droppedHeaders are not part of what a case asks: credentials and
// identity (the case says who), what the client library adds about the
// connection, and what the engine sets itself.
var droppedHeaders = map[string]bool{
	"Authorization": true, "Proxy-Authorization": true, "Cookie": true, "Content-Type": true, "Content-Length": true,
	"User-Agent": true, "Accept-Encoding": true, "Connection": true, "Host": true, "Audit-Id": true,
	"Traceparent": true, "Tracestate": true, "Te": true, "Upgrade": true, "Keep-Alive": true, "Transfer-Encoding": true,
}

// keptHeaders are the recorded request headers a case sends again:
// Accept, conditional and content negotiation headers, and the like.
func keptHeaders(h map[string][]string) map[string]string {
	out := map[string]string{}
	for k, vs := range h {
		ck := http.CanonicalHeaderKey(k)
		if droppedHeaders[ck] || strings.HasPrefix(ck, "Impersonate-") || strings.HasPrefix(ck, "X-Remote-") {
			continue
		}
		if slices.ContainsFunc(vs, func(v string) bool { return strings.Contains(v, record.Redacted) }) {
			continue
		}
		out[ck] = strings.Join(vs, ", ")
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func hasBody(method string) bool {
	return method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch
}

// caseName: "alice get pods web-0 in default → 200".
func caseName(r *record.Record) string {
	q := r.Request
	who := q.User
	if q.ActingAs != "" {
		who += " as " + q.ActingAs
	}
	what := q.Verb
	if q.Resource != "" {
		res := q.Resource
		if q.Subresource != "" {
			res += "/" + q.Subresource
		}
		what += " " + res
		if q.Name != "" {
			what += " " + q.Name
		}
		if q.Namespace != "" {
			what += " in " + q.Namespace
		}
	} else {
		what = q.Method + " " + q.Path
	}
	return fmt.Sprintf("%s %s → %d", who, what, r.Actual.Status)
}
