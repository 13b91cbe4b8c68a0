// Package flowview formats a capture record's columns the same way wherever
// flows are listed (kproxy flows, the TUI): who called, on what, what the
// replay predicted, what the apiserver answered, whether the two agree, and
// compact durations.
package flowview

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/kproxy/kproxy/internal/record"
)

// None is shown for a value the record does not have, as kubectl shows it.
const None = "<none>"

// Caller is who sent the request: the authenticated user, followed by
// " as USER" when the request impersonates someone else; with no user (a
// rejected credential, a token the apiserver did not accept), how kproxy
// forwarded the caller (record.Identity: "token", "certificate",
// "anonymous", "rejected").
func Caller(r *record.Record) string {
	q := r.Request
	switch {
	case q.User == "" && r.Identity == "":
		return None
	case q.User == "":
		return r.Identity
	case q.ActingAs != "" && q.ActingAs != q.User:
		return q.User + " as " + q.ActingAs
	}
	return q.User
}

// Verb is the Kubernetes verb the apiserver resolved (get, list, watch,
// create, ...), or the HTTP method when there is none.
func Verb(r *record.Record) string {
	if r.Request.Verb != "" {
		return r.Request.Verb
	}
	if r.Request.Method != "" {
		return r.Request.Method
	}
	return None
}

// Resource is what the request is about, in kubectl's words: the resource
// (with its API group for a non-core group, "deployments.apps") and
// subresource, then the object: "pods/log default/web-0" for a named
// namespaced object, "nodes node-1" for a named cluster-scoped one,
// "pods -n default" for a namespace's collection, "pods" for the whole
// cluster's. A non-resource request (/healthz, /version, discovery) is its
// path.
func Resource(r *record.Record) string {
	q := r.Request
	if q.Resource == "" {
		if q.Path == "" {
			return None
		}
		return q.Path
	}
	var b strings.Builder
	b.WriteString(q.Resource)
	if q.APIGroup != "" {
		b.WriteString("." + q.APIGroup)
	}
	if q.Subresource != "" {
		b.WriteString("/" + q.Subresource)
	}
	ns := q.ScopeNamespace()
	switch {
	case ns != "" && q.Name != "":
		b.WriteString(" " + ns + "/" + q.Name)
	case q.Name != "":
		b.WriteString(" " + q.Name)
	case ns != "":
		b.WriteString(" -n " + ns)
	}
	return b.String()
}

// Predicted is the replay's verdict: "403 @authorization" for a predicted
// refusal and the stage that decides it, the status alone ("201") for a
// predicted success, "unknown" when kproxy could not predict.
func Predicted(r *record.Record) string {
	p := r.Predicted
	switch p.Stage {
	case record.StageUnknown:
		return record.StageUnknown
	case "":
		return strconv.Itoa(p.Status)
	}
	return fmt.Sprintf("%d @%s", p.Status, p.Stage)
}

// Actual is the apiserver's answer: its status, or "error" when no answer
// came from it (record.Actual.Error says why), or None.
func Actual(r *record.Record) string {
	switch {
	case r.Actual.Status != 0:
		return strconv.Itoa(r.Actual.Status)
	case r.Actual.Error != "":
		return "error"
	}
	return None
}

// AgreementKind is how the prediction compares with the apiserver's answer.
type AgreementKind int

// The agreements of a prediction with the answer.
const (
	// Match: the apiserver answered the predicted status.
	Match AgreementKind = iota
	// Mismatch: it answered another status.
	Mismatch
	// Unknown: kproxy could not predict, or there is no answer to
	// compare with.
	Unknown
)

// String is the agreement's name: "match", "mismatch" or "unknown".
func (a AgreementKind) String() string {
	switch a {
	case Match:
		return "match"
	case Mismatch:
		return "mismatch"
	case Unknown:
		return "unknown"
	}
	return fmt.Sprintf("AgreementKind(%d)", int(a))
}

// Mark is the agreement's one-column mark, plain ASCII: "=", "!=" or "?".
func (a AgreementKind) Mark() string {
	switch a {
	case Match:
		return "="
	case Mismatch:
		return "!="
	}
	return "?"
}

// Agreement compares the predicted status with the actual one: Unknown when
// the prediction is "unknown" or there is no actual status (none, or one
// kproxy wrote because no answer came: record.Actual.NoAnswer), Mismatch when
// the statuses differ, Match otherwise. mark is kind.Mark(): "=", "!=",
// "?".
func Agreement(r *record.Record) (mark string, kind AgreementKind) {
	switch {
	case r.Predicted.Stage == record.StageUnknown || r.Actual.Status == 0 || r.Actual.NoAnswer():
		kind = Unknown
	case r.Predicted.Status != r.Actual.Status:
		kind = Mismatch
	default:
		kind = Match
	}
	return kind.Mark(), kind
}

// Duration formats nanoseconds compactly, two or three significant digits
// as kubectl shows ages: "850ns", "4.5µs", "340µs", "1.2ms", "35ms",
// "2.1s", "1m5s", "2h3m"; "0s" for zero.
func Duration(ns int64) string {
	if ns < 0 {
		return "-" + Duration(-ns)
	}
	units := []struct {
		size int64
		name string
	}{
		{int64(time.Second), "s"},
		{int64(time.Millisecond), "ms"},
		{int64(time.Microsecond), "µs"},
	}
	switch {
	case ns == 0:
		return "0s"
	case ns < int64(time.Microsecond):
		return strconv.FormatInt(ns, 10) + "ns"
	case ns >= int64(time.Minute):
		d := time.Duration(ns)
		if d >= time.Hour {
			d = d.Round(time.Minute)
			return fmt.Sprintf("%dh%dm", int64(d/time.Hour), int64(d%time.Hour/time.Minute))
		}
		d = d.Round(time.Second)
		if d >= time.Hour {
			return "1h0m"
		}
		return fmt.Sprintf("%dm%ds", int64(d/time.Minute), int64(d%time.Minute/time.Second))
	}
	for i, u := range units {
		if ns < u.size {
			continue
		}
		v := float64(ns) / float64(u.size)
		if v < 9.95 {
			return trimZero(strconv.FormatFloat(v, 'f', 1, 64)) + u.name
		}
		n := int64(math.Round(v))
		if n >= 1000 && i > 0 {
			// 999.6µs is 1ms, not 1000µs.
			return Duration(n * u.size)
		}
		if n >= 60 && u.name == "s" {
			return Duration(n * u.size)
		}
		return strconv.FormatInt(n, 10) + u.name
	}
	return strconv.FormatInt(ns, 10) + "ns"
}

// trimZero drops a ".0" decimal: "2.0" is "2".
func trimZero(s string) string { return strings.TrimSuffix(s, ".0") }

// Reason says why in one short phrase: for an unknown prediction, why
// kproxy could not predict (UnknownReason); otherwise the Status reason
// of the answer (Forbidden, NotFound, ...), else the predicted one, else
// what went wrong when no answer came; "" for a plain success.
func Reason(r *record.Record) string {
	switch {
	case r.Predicted.Stage == record.StageUnknown:
		return UnknownReason(r)
	case r.Actual.Reason != "":
		return r.Actual.Reason
	case r.Predicted.Reason != "":
		return r.Predicted.Reason
	case r.Actual.Error != "":
		return gist(r.Actual.Error)
	}
	return ""
}

// UnknownReason is the gist of why kproxy could not predict a request:
// the first clause of predicted.message, without its "cannot predict: "
// prefix, at most 80 characters, so that unknowns of the same cause group
// together. "" when the prediction is not unknown.
func UnknownReason(r *record.Record) string {
	if r.Predicted.Stage != record.StageUnknown {
		return ""
	}
	m := strings.TrimPrefix(strings.TrimSpace(r.Predicted.Message), "cannot predict: ")
	if m == "" {
		return "no reason given"
	}
	return gist(m)
}

// gistTime matches a time in a reason: RFC 3339, or a time of day.
var gistTime = regexp.MustCompile(`\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})?|\b\d{2}:\d{2}:\d{2}(\.\d+)?\b`)

// gistLen bounds a gist, in characters.
const gistLen = 80

// gist is a message's first clause: up to the first "; ", ". ", " (" or
// line break, at most gistLen characters.
func gist(m string) string {
	for _, sep := range []string{"\n", "; ", ". ", " ("} {
		if i := strings.Index(m, sep); i > 0 {
			m = m[:i]
		}
	}
	// Reasons that differ only by when (a document "last changed at"
	// one time or another) are one reason.
	m = gistTime.ReplaceAllString(m, "TIME")
	m = strings.TrimSuffix(strings.TrimSpace(m), ".")
	if rs := []rune(m); len(rs) > gistLen {
		m = string(rs[:gistLen-1]) + "…"
	}
	return m
}
