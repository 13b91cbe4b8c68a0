package stages

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/munnerz/goautoneg"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// Non-resource requests past authorization: the apiserver's own handlers
// (its NonGoRestfulMux) answer them. Which paths it serves, and the state
// some answers depend on (its health, its OpenAPI index), are the
// apiserver's: kproxy reads them (served_docs.go) rather than guess from
// the replay server, which serves neither health checks nor OpenAPI nor
// the aggregator's paths. A path it does not serve is a 404 from its mux,
// decided here at decode (the handler's routing). What the replay cannot
// tell (conditional and range requests of OpenAPI documents, other
// methods, handlers of its own such as /debug) stays unknown, said so.

// nonResource is decode's verdict on a non-resource request that is not
// discovery or /version.
//
// Two routers answer these paths in the apiserver, and they differ on a
// trailing slash: its mux (PathRecorderMux) matches a path exactly, or by
// a prefix that ends in "/" (the index lists both kinds, the prefixes
// with their slash), so /livez/ and /openapi/v3/ are not /livez and
// /openapi/v3; go-restful's routes (/version, service-account issuer
// discovery, /api, /logs) take a path with or without one.
func (d decode) nonResource(ctx context.Context, req *Request) Result {
	r, raw := req.HTTP, req.Info.Path
	p := strings.TrimSuffix(raw, "/") // as go-restful routes it
	if p == "" {
		p = "/"
	}
	if healthEndpoint(raw) != "" {
		// The health handlers answer any method alike.
		return d.health(ctx, req, raw)
	}
	if r.Method != http.MethodGet {
		return Unknown("the " + r.Method + " of the non-resource path " + raw + " is answered by the apiserver's own handler: not modelled")
	}
	switch {
	case raw == "/" || raw == "/index.html":
		return Pass("the apiserver's index of the paths it serves (at / and /index.html)")
	case raw == "/metrics" || raw == "/metrics/slis":
		return Pass("the apiserver's metrics handler answers every GET of " + raw)
	case raw == "/openapi/v3" || strings.HasPrefix(raw, "/openapi/v3/"):
		return d.openAPIV3(ctx, req, raw)
	case raw == "/openapi/v2":
		if !openAPINegotiates(req.HTTP.Header.Get("Accept"), openAPIV2Subtypes) {
			return notAcceptable(req, "the OpenAPI v2 document", openAPIV2Subtypes)
		}
		switch h := conditionalHeader(req.HTTP.Header); {
		case req.HTTP.Header.Get("Range") != "" || req.HTTP.Header.Get("If-Range") != "":
			return Unknown("a partial request (Range) of the OpenAPI v2 document: the apiserver answers it from the document's size, ETag and modification time: not modelled")
		case h != "":
			// kubectl create and apply ask again with If-None-Match once
			// their HTTP cache holds the document.
			return d.conditionalDocument(ctx, req, h, openAPIV2)
		}
		return Pass("the apiserver serves its OpenAPI v2 document")
	case apfDebugPaths[raw]:
		// Unlisted in the index: installed with API Priority and Fairness.
		if d.m.opts != nil && !d.m.opts.EnablePriorityAndFairness {
			return Reject(muxNotFound(), "--enable-priority-and-fairness=false: the apiserver installs no API Priority and Fairness debug handler at "+raw+": its mux answers 404 page not found")
		}
		return Pass("the apiserver's API Priority and Fairness debug handler answers every GET of " + raw + " (installed with API Priority and Fairness, unlisted in its index)")
	case profilingPath(raw):
		// Unlisted in the index: installed with --profiling (its default).
		if d.m.opts != nil && !d.m.opts.EnableProfiling {
			return Reject(muxNotFound(), "--profiling=false: the apiserver installs no profiling or debug-flag handler at "+raw+": its mux answers 404 page not found")
		}
		return Unknown("the apiserver serves " + raw + " with its profiling handlers when --profiling is on (its default; kproxy was not told --profiling=false): not modelled")
	}
	doc, err := d.m.writer().Served().Get(ctx, "/", "application/json")
	if err != nil {
		return Unknown("which non-resource paths the apiserver serves: " + err.Error())
	}
	var index struct {
		Paths []string `json:"paths"`
	}
	if doc.Status != http.StatusOK || json.Unmarshal(doc.Body, &index) != nil {
		return Unknown(fmt.Sprintf("which non-resource paths the apiserver serves: its index / answered %d", doc.Status))
	}
	for _, served := range index.Paths {
		route := strings.TrimSuffix(served, "/")
		switch {
		case route == p && staticDocument(p):
			return Pass("the apiserver serves " + p + " (its index lists it): every GET is answered with the document")
		case route == "/api" && strings.Count(p, "/") == 2 && strings.HasPrefix(p, "/api/"):
			// /api/VERSION with a version the index does not list: the
			// legacy group's web service (rooted at /api) claims the path
			// in the apiserver's director, and go-restful, with no route
			// for it, answers through the service error handler.
			st := &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusNotFound, Reason: metav1.StatusReasonNotFound,
				Message: "the server could not find the requested resource", Details: &metav1.StatusDetails{}}
			return Reject(st, "the apiserver serves no version "+strings.TrimPrefix(p, "/api/")+" of the core group (its index lists "+
				strings.Join(coreVersions(index.Paths), ", ")+"): the web service rooted at /api claims the path and has no route for it: 404 NotFound")
		case served == raw, // the mux's exact path
			strings.HasSuffix(served, "/") && served != "/" && strings.HasPrefix(raw, served), // the mux's prefix
			goRestfulRoot(route) && (route == p || strings.HasPrefix(p, route+"/")):
			return Unknown("the apiserver serves " + raw + " with a handler of its own: not modelled")
		}
	}
	return Reject(muxNotFound(), fmt.Sprintf("the apiserver serves no handler at %s (its index lists %d paths, none of them this one or a prefix of it; its mux matches a path exactly, a trailing slash included): its mux answers 404 page not found", raw, len(index.Paths)))
}

// apfDebugPaths are API Priority and Fairness's debug handlers
// (apf_controller_debug.go), exact paths the index does not list.
var apfDebugPaths = map[string]bool{
	"/debug/api_priority_and_fairness/dump_priority_levels": true,
	"/debug/api_priority_and_fairness/dump_queues":          true,
	"/debug/api_priority_and_fairness/dump_requests":        true,
}

// profilingPath reports the paths routes.Profiling and routes.DebugFlags
// claim (exactly, or by their prefix) when --profiling is on.
func profilingPath(p string) bool {
	return p == "/debug/pprof" || strings.HasPrefix(p, "/debug/pprof/") || p == "/debug/flags" || strings.HasPrefix(p, "/debug/flags/")
}

// muxNotFound is the apiserver mux's answer for a path no handler serves
// (its NotFoundHandler, plain text).
func muxNotFound() *metav1.Status {
	return &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusNotFound, Message: "404 page not found"}
}

// coreVersions are the core group's versions among the index's paths.
func coreVersions(paths []string) []string {
	var vs []string
	for _, p := range paths {
		if v, ok := strings.CutPrefix(strings.TrimSuffix(p, "/"), "/api/"); ok && !strings.Contains(v, "/") {
			vs = append(vs, "/api/"+v)
		}
	}
	return vs
}

// staticDocument reports paths whose handler answers every GET with a
// document it holds: service-account issuer discovery.
func staticDocument(p string) bool {
	return p == "/.well-known/openid-configuration" || p == "/openid/v1/jwks"
}

// goRestfulRoot reports the listed paths go-restful routes (with
// or without a trailing slash) and whose trees it serves: the core
// group's web service, discovery, the log handler.
func goRestfulRoot(p string) bool {
	switch p {
	case "/api", "/apis", "/logs":
		return true
	}
	return false
}

// healthEndpoint returns /healthz, /livez or /readyz when p is one of them
// or one of their checks, else "".
func healthEndpoint(p string) string {
	for _, e := range []string{"/healthz", "/livez", "/readyz"} {
		if p == e || strings.HasPrefix(p, e+"/") {
			return e
		}
	}
	return ""
}

// HealthReadPath is what the replay reads to predict a request for a
// health endpoint (kproxy snapshot keeps it); ok is false for other paths.
func HealthReadPath(u *url.URL) (string, bool) {
	if healthEndpoint(u.Path) == "" {
		return "", false
	}
	return healthRead(u.Path, u), true
}

// healthRead is the endpoint with the request's exclusions, verbosely.
func healthRead(p string, u *url.URL) string {
	q := url.Values{}
	for k, v := range u.Query() {
		q[k] = v
	}
	if _, ok := q["verbose"]; !ok {
		q.Set("verbose", "1")
	}
	return p + "?" + q.Encode()
}

// health predicts a health endpoint from the apiserver's health now: kproxy
// reads the same endpoint, with the request's exclusions, verbosely, and
// reports every check.
func (d decode) health(ctx context.Context, req *Request, p string) Result {
	// Health is read live (it changes), and is small.
	doc, err := d.m.writer().Served().Read(ctx, healthRead(p, req.HTTP.URL), "")
	if err != nil {
		return Unknown("the apiserver's health: " + err.Error())
	}
	var failed, passed []string
	for _, line := range strings.Split(string(doc.Body), "\n") {
		switch {
		case strings.HasPrefix(line, "[-]"):
			failed = append(failed, strings.TrimPrefix(line, "[-]"))
		case strings.HasPrefix(line, "[+]"):
			passed = append(passed, strings.Fields(strings.TrimPrefix(line, "[+]"))[0])
		}
	}
	sort.Strings(passed)
	switch doc.Status {
	case http.StatusOK:
		what := "the check passes"
		if len(passed) > 0 {
			what = fmt.Sprintf("all %d checks pass", len(passed))
		}
		return Pass(fmt.Sprintf("the apiserver's %s: %s (read by kproxy as it replayed the request)", p, what))
	case http.StatusNotFound:
		return Reject(muxNotFound(), fmt.Sprintf("the apiserver has no health check at %s: its mux answers 404 page not found", p))
	case http.StatusInternalServerError:
		// The apiserver answers a failure with the verbose report, whether
		// or not the request asked for it.
		st := &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusInternalServerError, Message: strings.TrimSpace(string(doc.Body))}
		return Reject(st, fmt.Sprintf("the apiserver's %s fails (read by kproxy as it replayed the request): %s", p, strings.Join(failed, "; ")))
	}
	return Unknown(fmt.Sprintf("the apiserver's health: kproxy's read of %s answered %d", p, doc.Status))
}

// openAPIV3 predicts the OpenAPI v3 index and its documents from the
// apiserver's index: a document it lists is served, any other path under
// /openapi/v3/ is a 404 with no body.
func (d decode) openAPIV3(ctx context.Context, req *Request, p string) Result {
	h := conditionalHeader(req.HTTP.Header)
	byETag := h != "" && conditionalByETag(req.HTTP.Header)
	switch {
	case p == "/openapi/v3" && h != "":
		return d.conditionalDocument(ctx, req, h, openAPIV3Index)
	case h != "" && !byETag:
		return Unknown("a conditional or partial request (" + h + ") of an OpenAPI document: the apiserver answers it from the document's modification time, which kproxy does not know: not modelled")
	case p == "/openapi/v3":
		return Pass("the apiserver's OpenAPI v3 index")
	}
	doc, err := d.m.writer().Served().Get(ctx, "/openapi/v3", "application/json")
	if err != nil {
		return Unknown("the apiserver's OpenAPI v3 index: " + err.Error())
	}
	var index struct {
		Paths map[string]struct {
			ServerRelativeURL string `json:"serverRelativeURL"`
		} `json:"paths"`
	}
	if doc.Status != http.StatusOK || json.Unmarshal(doc.Body, &index) != nil {
		return Unknown(fmt.Sprintf("the apiserver's OpenAPI v3 index answered %d", doc.Status))
	}
	gv := strings.TrimPrefix(p, "/openapi/v3/")
	served := d.m.writer().Served()
	// A group's document and its place in the index change with its own
	// CRDs and APIServices only (the core group's, "", and the
	// apiserver's own paths, with none).
	group, _, _ := strings.Cut(strings.TrimPrefix(gv, "apis/"), "/")
	if !strings.HasPrefix(gv, "apis/") {
		group = ""
	}
	settled, lagging := served.GroupSettledBefore(group, req.Arrival), served.GroupChangedSince(group, req.Arrival.Add(-apiChangeLag))
	_, listed := index.Paths[gv]
	if lagging {
		// The index follows a group's changes a moment late: it lists a
		// new group a moment after its APIService is available (e2e
		// TestOpenAPIV3DocumentOfNewGroup: answered 404, the index read
		// at replay listed it, predicted 200), and links a document's
		// old hash a moment after its handler redirects it (openAPIV3Hash).
		return Unknown(fmt.Sprintf("the apiserver's OpenAPI v3 index %s the document %q now, and the CRDs or APIServices of its group changed around the request's arrival (less than %v before it, or since): "+
			"the index follows them a moment late (listing a group, linking a document's new hash), so what it answered then is not known", map[bool]string{true: "lists", false: "does not list"}[listed], gv, apiChangeLag))
	}
	if !listed {
		st := &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusNotFound}
		return Reject(st, fmt.Sprintf("the apiserver's OpenAPI v3 index lists no document %q (%d documents): 404", gv, len(index.Paths)))
	}
	if accept := req.HTTP.Header.Get("Accept"); namesNoMediaType(accept) {
		// pkg/handler3 returns before negotiating: net/http's 200.
		return Pass(fmt.Sprintf("Accept %q names no media type: the OpenAPI v3 handler returns before choosing one, and the answer is 200 with no body", accept))
	}
	if !openAPINegotiates(req.HTTP.Header.Get("Accept"), openAPIV3Subtypes) {
		return notAcceptable(req, "the OpenAPI v3 document of "+gv, openAPIV3Subtypes)
	}
	link := index.Paths[gv].ServerRelativeURL
	if hash := req.HTTP.URL.Query().Get("hash"); hash != "" && (!byETag || hash != linkHash(link)) {
		// A hash that is not the current one is redirected before any
		// condition is looked at.
		return openAPIV3Hash(settled, gv, hash, link)
	}
	if byETag {
		// An aggregated API's server serves its own documents, with its
		// own ETags: kube-openapi's rule is known for the apiserver's.
		if group, version, ok := strings.Cut(strings.TrimPrefix(gv, "apis/"), "/"); ok && strings.HasPrefix(gv, "apis/") {
			if s, found, why := aggregatedFor(d.m.writer(), group, version); why != "" || (found && s.Spec.Service != nil) {
				return Unknown(fmt.Sprintf("a request of the OpenAPI v3 document of %s conditional on its ETag: %s", gv,
					cmp.Or(why, "APIService "+s.Name+" sends it to an aggregated API's server, whose ETag is its own")))
			}
		}
		return openAPIV3ByETag(ctx, req, settled, gv, link)
	}
	return Pass("the apiserver serves the OpenAPI v3 document of " + gv)
}

// conditionalByETag reports a request whose conditions ServeContent
// decides by the ETag alone: If-None-Match or If-Match, with no time
// condition they do not override (If-Modified-Since is not looked at
// beside If-None-Match, If-Unmodified-Since beside If-Match) and no
// Range.
func conditionalByETag(h http.Header) bool {
	none, match := h.Get("If-None-Match") != "", h.Get("If-Match") != ""
	return (none || match) && (none || h.Get("If-Modified-Since") == "") && (match || h.Get("If-Unmodified-Since") == "") &&
		h.Get("Range") == "" && h.Get("If-Range") == ""
}

// linkHash is the hash an OpenAPI v3 index link names, or "".
func linkHash(link string) string {
	if u, err := url.Parse(link); err == nil {
		return u.Query().Get("hash")
	}
	return ""
}

// openAPIV3ByETag predicts a request of an OpenAPI v3 document conditional
// on its ETag (If-None-Match, as a client that cached it asks again): kube-
// openapi's handler sets the document's ETag, its hash, which the index
// links it by, and net/http's ServeContent answers 304 for a match, 412
// for an If-Match that fails, the document otherwise (a probe: If-None-Match
// had been "not modelled", said to hang on the modification time).
func openAPIV3ByETag(ctx context.Context, req *Request, settled bool, gv, link string) Result {
	current := linkHash(link)
	var named []string
	for _, k := range []string{"If-Match", "If-None-Match"} { // ServeContent's order
		if v := req.HTTP.Header.Get(k); v != "" {
			named = append(named, k+" "+v)
		}
	}
	conditions := strings.Join(named, ", ")
	switch {
	case current == "":
		return Unknown(fmt.Sprintf("the apiserver's OpenAPI v3 index links the document of %s without a hash (%q): its ETag is not known", gv, link))
	case !settled:
		return Unknown(fmt.Sprintf("a request of the OpenAPI v3 document of %s conditional on its ETag (%s), and the apiserver's documents changed around its arrival: which version it answered from is not known", gv, conditions))
	}
	w := serveDocument(ctx, req, strconv.Quote(current), time.Time{}, nil)
	what := fmt.Sprintf("the OpenAPI v3 document of %s has ETag %.12s… (its hash in the index); the request's %s", gv, current, conditions)
	return servedAnswer(w, what)
}

// apiChangeLag bounds how long after a group's CustomResourceDefinitions
// or APIServices change the apiserver may still answer by what they were
// (its discovery, its handlers, its OpenAPI v3 index: up to a second
// here, more on a loaded apiserver), and kproxy's informers show them
// only after they changed.
const apiChangeLag = 10 * time.Second

// openAPIV3Hash predicts a request of an OpenAPI v3 document that names
// its hash (?hash=, as the index links it, and as kubectl asks): kube-
// openapi's handler redirects a hash that is not the document's (301, to
// the current one) and serves the named one. link is the document's
// link in the index read now; settled: the document's group had settled
// by the arrival, so the index was the same then. The caller has made a
// request close to a change unknown: the apiserver's index links a
// document's old hash for a moment after its handler serves (and
// redirects to) the new one (a probe had the index's own link answered
// 301 for 0.3 s after a CRD joined its group, a request of it predicted
// 200; up to a second in TestOpenAPIV3LinkedHashRedirected).
func openAPIV3Hash(settled bool, gv, hash, link string) Result {
	current := linkHash(link)
	switch {
	case current == "":
		return Unknown(fmt.Sprintf("the apiserver's OpenAPI v3 index links the document of %s without a hash (%q): not modelled", gv, link))
	case hash != current && !settled:
		return Unknown(fmt.Sprintf("the request names the OpenAPI v3 document of %s by a hash that is not its current one, and the apiserver's documents changed around its arrival: whether that hash was current then is not known", gv))
	case hash != current:
		res := Pass(fmt.Sprintf("the request names the OpenAPI v3 document of %s by hash %.12s…, and the document's is %.12s…: the apiserver redirects to the current one, 301 Moved Permanently", gv, hash, current))
		res.Answer = http.StatusMovedPermanently
		return res
	}
	return Pass("the apiserver serves the OpenAPI v3 document of " + gv + " by its current hash (cacheable: immutable)")
}

// servedDocument is a document the apiserver serves with net/http's
// ServeContent, answering conditional requests from its version.
type servedDocument struct {
	path, name string
	short      string // "index": "the index changed ..."
	// whole: kproxy reads the document itself (a small one, whose size a
	// Range request is answered from), not only its version.
	whole bool
}

var (
	openAPIV3Index = servedDocument{path: "/openapi/v3", name: "the OpenAPI v3 index", short: "index", whole: true}
	// Range requests of the OpenAPI v2 document stay unknown: its version
	// is read without it (megabytes).
	openAPIV2 = servedDocument{path: "/openapi/v2", name: "the OpenAPI v2 document", short: "document"}
)

// conditionalDocument answers a conditional request of an OpenAPI document
// (the v3 index, the v2 document) as the apiserver does, with net/http's
// ServeContent over the document's ETag and modification time, read from
// the apiserver now (kubectl asks for the v3 index with If-Modified-Since,
// for the v2 document with If-None-Match).
//
// Read after the request, the document may have changed since the
// apiserver answered (its OpenAPI controllers update them as the
// cluster's APIs settle). The answer is known when the document did not
// change since the request arrived (the last read kproxy had before the
// arrival shows the same version, or by its Last-Modified it changed
// before), or when the version kproxy last saw before the arrival and the
// current one get the same answer: every version in between is newer than
// the first and older than the second, and ServeContent's answer moves one
// way with the version's age. Otherwise the record is unknown.
func (d decode) conditionalDocument(ctx context.Context, req *Request, header string, sd servedDocument) Result {
	served := d.m.writer().Served()
	read := served.Version
	if sd.whole {
		read = served.Read
	}
	readAt := d.m.clock.Now()
	doc, err := read(ctx, sd.path, req.HTTP.Header.Get("Accept"))
	if err != nil {
		return Unknown("the apiserver's " + strings.TrimPrefix(sd.name, "the ") + ": " + err.Error())
	}
	mod, err := http.ParseTime(doc.Header.Get("Last-Modified"))
	if (doc.Status != http.StatusOK && doc.Status != http.StatusPartialContent) || err != nil {
		return Unknown(fmt.Sprintf("the apiserver's %s answered %d without a Last-Modified time", strings.TrimPrefix(sd.name, "the "), doc.Status))
	}
	body := doc.Body
	if !sd.whole {
		body = nil // not read; no Range request gets here
	}
	if res, ok := stampedAtServing(ctx, req, sd, doc, body, mod, readAt, header); ok {
		return res
	}
	w := serveDocument(ctx, req, doc.Header.Get("Etag"), mod, body)
	what := fmt.Sprintf("%s last changed at %s (ETag %.12s…); the request's %s: %s", sd.name, mod.UTC().Format(time.RFC3339), strings.Trim(doc.Header.Get("Etag"), `"`), header, req.HTTP.Header.Get(header))
	seen, ok := served.SeenBefore(sd.path, req.Arrival)
	// The apiserver builds the documents at the first request after a
	// change: a recent Last-Modified long after the last change is the
	// same version as at the arrival.
	if why := sd.changedSinceArrival(ctx, req, doc, body, mod, w.Code, seen, ok); why != "" && !served.SettledBefore(req.Arrival) {
		return Unknown(what + ": " + why)
	}
	return servedAnswer(w, what)
}

// servedAnswer is the result of ServeContent's answer w to a conditional
// request of a document (what says which, and the request's condition).
func servedAnswer(w *httptest.ResponseRecorder, what string) Result {
	switch {
	case w.Code == http.StatusNotModified:
		res := Pass(what + ": the client's copy is current, 304 Not Modified")
		res.Answer = http.StatusNotModified
		return res
	case w.Code < 300:
		return Pass(what + ": the document is sent again")
	}
	st := &metav1.Status{Status: metav1.StatusFailure, Code: int32(w.Code), Message: strings.TrimSpace(w.Body.String())}
	return Reject(st, what+": "+http.StatusText(w.Code))
}

// stampedSlack is how far from the request's arrival, on the apiserver's
// clock as kproxy's read shows it, the apiserver may have stamped a
// document it stamps when serving it: the request's way to the apiserver,
// and the clocks' difference, which a Last-Modified (whole seconds) shows
// only to the second. A read whose Last-Modified is further than twice
// that from kproxy's clock is not of such a document.
const stampedSlack = 1500 * time.Millisecond

// stampedAtServing answers a conditional request of a document the
// apiserver stamps with the time it serves it: the aggregator serves the
// OpenAPI v3 index so (its handler passes time.Now() to ServeContent, and
// sets no ETag), so the index is "modified" at every request, and a
// client's copy is current only within the second it got it. kproxy
// tells such a document by its read: no ETag, and a Last-Modified within
// twice stampedSlack of the read. The request's answer is then ServeContent's
// for the time the apiserver served it: the arrival, moved by the clocks'
// difference the read shows, give or take stampedSlack. When both ends of
// that window get the same answer it is known; otherwise (a copy from
// within a second or two of the request) the second the apiserver served
// it decides, read from its answer (answeredStamp), and without one it is
// unknown. ok is false for a document served otherwise.
func stampedAtServing(ctx context.Context, req *Request, sd servedDocument, doc apiserver.ServedDoc, body []byte, mod, readAt time.Time, header string) (Result, bool) {
	// The apiserver's clock ahead of kproxy's: mod is whole seconds, the
	// apiserver's time at the read within the second after it. Clocks a
	// second apart or less are read as one (NTP keeps them closer).
	offset := mod.Add(500 * time.Millisecond).Sub(readAt)
	if doc.Header.Get("Etag") != "" || offset.Abs() > 2*stampedSlack || req.Arrival.IsZero() {
		return Result{}, false
	}
	if offset.Abs() <= time.Second {
		offset = 0
	}
	served := req.Arrival.Add(offset)
	early := serveDocument(ctx, req, "", served.Add(-stampedSlack), body)
	late := serveDocument(ctx, req, "", served.Add(stampedSlack), body)
	what := fmt.Sprintf("%s is stamped with the time the apiserver serves it (no ETag; kproxy's read at %s showed Last-Modified %s), so at this request about %s; the request's %s: %s",
		sd.name, readAt.UTC().Format(time.RFC3339), doc.Header.Get("Last-Modified"), served.UTC().Format(time.RFC3339), header, req.HTTP.Header.Get(header))
	w := late
	if early.Code != late.Code {
		// Within a second or two of the client's copy: the second the
		// apiserver served this request decides, and its answer carries it.
		stamp, ok := answeredStamp(ctx, req, served)
		if !ok {
			return Unknown(what + ": within seconds of that time, which the answer depends on to the second: not known"), true
		}
		w = serveDocument(ctx, req, "", stamp, body)
		what += fmt.Sprintf("; within seconds of that time, the answer depends on the second: the apiserver stamped its answer Last-Modified %s, its clock as it served this request",
			stamp.UTC().Format(http.TimeFormat))
	}
	switch {
	case w.Code == http.StatusNotModified:
		res := Pass(what + ": the client's copy is as new, 304 Not Modified")
		res.Answer = http.StatusNotModified
		return res, true
	case w.Code < 300:
		return Pass(what + ": older than that, the " + sd.short + " is sent again"), true
	}
	st := &metav1.Status{Status: metav1.StatusFailure, Code: int32(w.Code), Message: strings.TrimSpace(w.Body.String())}
	return Reject(st, what+": "+http.StatusText(w.Code)), true
}

// answeredStamp is the time the apiserver stamped its answer to req with
// (Last-Modified, kept on a 304 too, as ServeContent keeps it without an
// ETag): for a document stamped when served, the apiserver's clock as it
// served the request, which no read after it can know. ok is false
// without an answer that served the document (200 or 304), or with a
// stamp further from served, kproxy's estimate, than the clocks and the
// request's way allow.
func answeredStamp(ctx context.Context, req *Request, served time.Time) (time.Time, bool) {
	if req.Actual == nil {
		return time.Time{}, false
	}
	aw, ok := req.Actual(ctx)
	if !ok || (aw.Status != http.StatusOK && aw.Status != http.StatusNotModified) {
		return time.Time{}, false
	}
	stamp, err := http.ParseTime(aw.LastModified)
	if err != nil || stamp.Sub(served).Abs() > 2*stampedSlack {
		return time.Time{}, false
	}
	return stamp, true
}

// serveDocument is the apiserver's answer to req for a document of that
// version: body is the document, or nil where no Range request asks for
// its bytes (the answer to the other conditions is the same).
func serveDocument(ctx context.Context, req *Request, etag string, mod time.Time, body []byte) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	w.Header().Set("Etag", etag)
	http.ServeContent(w, req.HTTP.Clone(ctx), "/openapi/v3", mod, bytes.NewReader(body))
	return w
}

// changedSinceArrival says why the answer code, from doc (the
// document's version read now, last modified at mod; body as for
// serveDocument), may not be the one the apiserver gave on req's arrival,
// or "". seen is kproxy's last read of the document before the arrival,
// if ok.
func (sd servedDocument) changedSinceArrival(ctx context.Context, req *Request, doc apiserver.ServedDoc, body []byte, mod time.Time, code int, seen apiserver.Seen, ok bool) string {
	if req.Arrival.IsZero() || !modifiedSinceArrival(mod, req.Arrival) {
		return "" // kproxy explain asks about now; or it changed before
	}
	if ok && seen.ETag == doc.Header.Get("Etag") && seen.LastModified == doc.Header.Get("Last-Modified") {
		return "" // the version kproxy saw before the arrival is still current
	}
	if byTimeOnly(req.HTTP.Header) {
		if code == http.StatusNotModified {
			return "" // not modified since: nor was any older version
		}
		if before, err := http.ParseTime(seen.LastModified); ok && err == nil && serveDocument(ctx, req, seen.ETag, before, body).Code == code {
			return "" // the versions before and after get the same answer
		}
	}
	if !ok {
		return "the " + sd.short + " changed at or after this request's arrival (" + req.Arrival.UTC().Format(time.RFC3339) + "), and kproxy had not read it before: the apiserver may have answered from the one before"
	}
	return fmt.Sprintf("the %s changed between kproxy's last read before this request's arrival (at %s, when it had last changed at %s) and the replay's read, and the two versions get different answers: which one the apiserver answered from is not known",
		sd.short, seen.At.UTC().Format(time.RFC3339), seen.LastModified)
}

// byTimeOnly reports a request conditional on the document's time alone
// (If-Modified-Since, If-Unmodified-Since): its answer moves one way as
// the document gets newer. An ETag matches one version only.
func byTimeOnly(h http.Header) bool {
	for _, k := range []string{"If-None-Match", "If-Match", "Range", "If-Range"} {
		if h.Get(k) != "" {
			return false
		}
	}
	return true
}

// modifiedSinceArrival reports a document last modified at mod (an HTTP
// date: whole seconds, so it really changed within the second after) that
// may have changed after a request that arrived at arrival, allowing a
// second more for the clocks of kproxy and the apiserver.
func modifiedSinceArrival(mod, arrival time.Time) bool {
	return mod.After(arrival.Add(-2 * time.Second))
}

// The media subtypes kube-openapi's handlers serve their documents in
// (pkg/handler for v2, pkg/handler3 for v3): JSON, and protobuf under its
// current and its deprecated name.
var (
	openAPIV2Subtypes = []string{"json", "com.github.proto-openapi.spec.v2.v1.0+protobuf", "com.github.proto-openapi.spec.v2@v1.0+protobuf"}
	openAPIV3Subtypes = []string{"json", "com.github.proto-openapi.spec.v3.v1.0+protobuf", "com.github.proto-openapi.spec.v3@v1.0+protobuf"}
)

// namesNoMediaType reports an Accept header, given, from which goautoneg
// parses no clause at all ("garbage").
func namesNoMediaType(accept string) bool {
	return accept != "" && len(goautoneg.ParseAccept(accept)) == 0
}

// openAPINegotiates is kube-openapi's content negotiation, as its
// handlers run it: the Accept header ("*/*" when absent) parsed by
// goautoneg, and a clause matches one of the served application/
// subtypes when its type and subtype are equal or "*" (quality is not
// weighed: a clause with q=0 matches too). No clause matching: the
// handler answers 406 with no body.
func openAPINegotiates(accept string, subtypes []string) bool {
	if accept == "" {
		accept = "*/*"
	}
	for _, c := range goautoneg.ParseAccept(accept) {
		for _, st := range subtypes {
			if (c.Type == "application" || c.Type == "*") && (c.SubType == st || c.SubType == "*") {
				return true
			}
		}
	}
	return false
}

// notAcceptable is kube-openapi's refusal of an Accept header it serves
// nothing for: 406, no body.
func notAcceptable(req *Request, what string, subtypes []string) Result {
	st := &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusNotAcceptable}
	return Reject(st, fmt.Sprintf("%s is served as application/%s; Accept %q names none of them (nor */* or application/*): the handler answers 406 with no body",
		what, strings.Join(subtypes, ", application/"), req.HTTP.Header.Get("Accept")))
}

// conditionalHeader names a header that makes a request conditional or
// partial (http.ServeContent answers 304, 206, 412 or 416 by it), or "".
func conditionalHeader(h http.Header) string {
	for _, k := range []string{"If-None-Match", "If-Modified-Since", "If-Match", "If-Unmodified-Since", "Range", "If-Range"} {
		if h.Get(k) != "" {
			return k
		}
	}
	return ""
}
