package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/record"
)

// TestOpenAPIIndexStampedAtServing: the aggregator serves the OpenAPI v3
// index stamped with the time it serves it (time.Now() to ServeContent, no
// ETag): kubectl's conditional GET (If-Modified-Since its cached copy's
// time) is answered 304 only within the second its copy came, and 200
// after. Before, kproxy compared the index it read at replay with the last
// one it read before the arrival, found them "changed" every time and
// said unknown for nearly every kubectl create and apply (106 of 154
// unknowns in a probe's session). It now answers from the arrival: a copy
// older than a couple of seconds gets 200, one from the future 304, and
// one from within seconds of the arrival by the second the apiserver
// served it, which its answer's Last-Modified carries (it was unknown,
// 70 of the 76 unknowns in a later probe's kubectl traffic). A replay run seconds
// after its request (a held worker) answers for the arrival, not for the
// time it reads.
func TestOpenAPIIndexStampedAtServing(t *testing.T) {
	recs, r, c := oneReplayWorker(t)
	index := request{method: "GET", path: "/openapi/v3", user: "admin", accept: "application/json"}
	got := do(t, c, r.base, index)
	lastModified := got.header.Get("Last-Modified")
	if got.status != 200 || lastModified == "" || got.header.Get("Etag") != "" {
		t.Fatalf("GET /openapi/v3: %d, Last-Modified %q, ETag %q: want 200 with a Last-Modified and no ETag (the aggregator's index, stamped when served)",
			got.status, lastModified, got.header.Get("Etag"))
	}
	nextRecord(t, recs)
	since := func(when string) request {
		r := index
		r.header = http.Header{"If-Modified-Since": {when}}
		return r
	}
	check := func(what string, req request, unknownOK bool) {
		t.Helper()
		got := do(t, c, r.base, req)
		rec := nextRecord(t, recs)
		switch {
		case rec.Predicted.Stage == record.StageUnknown && unknownOK && strings.Contains(rec.Predicted.Message, "is stamped with the time the apiserver serves it") &&
			strings.Contains(rec.Predicted.Message, "not known"):
		case rec.Predicted.Stage != record.StageUnknown && rec.Predicted.Status == got.status:
		default:
			t.Errorf("%s: the apiserver answered %d; predicted %d at %q (%s)", what, got.status, rec.Predicted.Status, rec.Predicted.Stage, rec.Predicted.Message)
		}
	}
	// Within seconds of the copy, the second the apiserver served the
	// request decides; its answer's Last-Modified says which (these were
	// unknown, 70 of a probe's 76 unknowns over kubectl traffic).
	check("a copy from this very second", since(lastModified), false)
	check("a copy from this very second, again", since(lastModified), false)
	check("a copy from 2000", since("Sat, 01 Jan 2000 00:00:00 GMT"), false)
	check("a copy from 2100", since("Fri, 01 Jan 2100 00:00:00 GMT"), false)
	time.Sleep(3500 * time.Millisecond)
	check("kubectl's copy, seconds old", since(lastModified), false)

	// Replayed 3s after its request: answered for its arrival.
	hold := startReplayHold(t, r, c, recs)
	hold.hold(t)
	if got := do(t, c, r.base, since(time.Now().Add(-10*time.Second).UTC().Format(http.TimeFormat))); got.status != 200 {
		hold.release()
		t.Fatalf("GET /openapi/v3 If-Modified-Since 10s ago: %d, want 200", got.status)
	}
	future := time.Now().Add(5 * time.Second).UTC().Format(http.TimeFormat)
	if got := do(t, c, r.base, since(future)); got.status != 304 {
		hold.release()
		t.Fatalf("GET /openapi/v3 If-Modified-Since 5s ahead: %d, want 304", got.status)
	}
	time.Sleep(6 * time.Second) // the second copy is now older than the index the replay reads
	hold.releaseAndCheck(t, "3s", "", "")
}

// TestOpenAPIV2Conditional: kubectl create and apply ask for the OpenAPI v2
// document again with If-None-Match (and If-Modified-Since) once their
// HTTP cache holds it, and the apiserver answers 304 from the document's
// ETag. These were unknown ("not modelled"), a dozen in a kubectl session
// of creates and applies. kproxy now reads the document's version (not
// the document: its first byte) and answers as the apiserver's
// ServeContent does: 304 for the current ETag, 200 for another one
// (If-None-Match wins over If-Modified-Since), 412 for an If-Match that
// fails. A Range request stays unknown. Replayed after the document
// changed (a CustomResourceDefinition), the 304 is unknown: the version
// read before and the one read after get different answers.
func TestOpenAPIV2Conditional(t *testing.T) {
	recs, r, c := oneReplayWorker(t)
	const proto = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
	doc := request{method: "GET", path: "/openapi/v2", user: "admin", accept: proto}
	got := do(t, c, r.base, doc)
	etag, lastModified := got.header.Get("Etag"), got.header.Get("Last-Modified")
	if got.status != 200 || etag == "" || lastModified == "" {
		t.Fatalf("GET /openapi/v2: %d, ETag %q, Last-Modified %q", got.status, etag, lastModified)
	}
	nextRecord(t, recs)
	// The apiserver builds the document when it is first asked for after a
	// change: this GET may have, and a replay right after a change, of a
	// version kproxy never read, is unknown (tested below). The document
	// is older than any request after this pause.
	time.Sleep(2100 * time.Millisecond)
	with := func(h http.Header) request {
		r := doc
		r.header = h
		return r
	}
	asKubectl := with(http.Header{"If-None-Match": {etag}, "If-Modified-Since": {lastModified}})
	for _, tc := range []struct {
		name   string
		req    request
		status int
		why    string // in the prediction's message
	}{
		{"kubectl's copy is current", asKubectl, 304, "the client's copy is current, 304 Not Modified"},
		{"an old copy, a recent time: the ETag decides", with(http.Header{"If-None-Match": {`"0123"`}, "If-Modified-Since": {"Fri, 01 Jan 2100 00:00:00 GMT"}}), 200, "the document is sent again"},
		{"a copy from the future, by time only", with(http.Header{"If-Modified-Since": {"Fri, 01 Jan 2100 00:00:00 GMT"}}), 304, "304 Not Modified"},
		{"If-Match another version", with(http.Header{"If-Match": {`"0123"`}}), 412, "Precondition Failed"},
		{"a Range of the document", with(http.Header{"Range": {"bytes=0-9"}}), 206, "partial request (Range) of the OpenAPI v2 document: the apiserver answers it from the document's size"},
	} {
		got := do(t, c, r.base, tc.req)
		if got.status != tc.status {
			t.Fatalf("%s: the apiserver answered %d, want %d", tc.name, got.status, tc.status)
		}
		rec := nextRecord(t, recs)
		wantStatus := tc.status
		if tc.status == 206 {
			wantStatus = 0 // unknown
		}
		if rec.Predicted.Status != wantStatus || !strings.Contains(rec.Predicted.Message+" "+stageNamed(rec, "decode").Explanation, tc.why) {
			t.Errorf("%s (answered %d): predicted %d at %q (%s; decode: %s), want %d saying %q", tc.name, got.status,
				rec.Predicted.Status, rec.Predicted.Stage, rec.Predicted.Message, stageNamed(rec, "decode").Explanation, wantStatus, tc.why)
		}
	}

	// Replayed after a CustomResourceDefinition changed the document.
	hold := startReplayHold(t, r, c, recs)
	hold.hold(t)
	if got := do(t, c, r.base, asKubectl); got.status != 304 {
		hold.release()
		t.Fatalf("kubectl's conditional GET: %d, want 304", got.status)
	}
	time.Sleep(1100 * time.Millisecond) // Last-Modified has whole seconds
	group := fmt.Sprintf("v2late%d.openapi.kproxy.test", time.Now().UnixNano())
	direct := directRoute()
	dc := direct.client(nil)
	if got := createWidgetCRD(t, group); got.status != 201 {
		hold.release()
		t.Fatalf("create the CRD: %d %s", got.status, got.body)
	}
	deadline := time.Now().Add(time.Minute)
	for do(t, dc, direct.base, request{method: "GET", path: "/openapi/v2", user: "admin", accept: proto, header: http.Header{"Range": {"bytes=0-0"}}}).header.Get("Etag") == etag {
		if time.Now().After(deadline) {
			hold.release()
			t.Fatalf("the OpenAPI v2 document did not change within a minute of creating %s", group)
		}
		time.Sleep(200 * time.Millisecond)
	}
	hold.releaseAndCheck(t, "the OpenAPI v2 document changed", "the document changed between kproxy's last read before this request's arrival")
}

// TestOpenAPIV2BuiltAtRequest: the apiserver builds its OpenAPI v2
// document at the first request after a change, so that request's answer
// (and kproxy's read at replay) shows a Last-Modified of that moment,
// though the change that made it is older. A conditional GET arriving
// there, more than 30s after the CustomResourceDefinitions last changed,
// is answered from the version read now, as it was at the arrival
// (before, "the document changed at or after this request's arrival"
// made it unknown).
func TestOpenAPIV2BuiltAtRequest(t *testing.T) {
	recs, r, c := oneReplayWorker(t)
	const proto = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
	doc := request{method: "GET", path: "/openapi/v2", user: "admin", accept: proto}
	etag := do(t, c, r.base, doc).header.Get("Etag")
	nextRecord(t, recs)
	group := fmt.Sprintf("v2built%d.openapi.kproxy.test", time.Now().UnixNano())
	if got := createWidgetCRD(t, group); got.status != 201 {
		t.Fatalf("create the CRD: %d %s", got.status, got.body)
	}
	// Nobody asks for the document meanwhile: the next request builds it.
	time.Sleep(32 * time.Second)
	asKubectl := doc
	asKubectl.header = http.Header{"If-None-Match": {etag}}
	got := do(t, c, r.base, asKubectl)
	if got.status != 200 {
		t.Fatalf("kubectl's conditional GET with the ETag before the CRD: %d, want 200", got.status)
	}
	lastModified, err := http.ParseTime(got.header.Get("Last-Modified"))
	if err != nil || time.Since(lastModified) > 3*time.Second {
		t.Fatalf("the document's Last-Modified %q: want the moment of this request (the apiserver builds it then): the path under test was not taken", got.header.Get("Last-Modified"))
	}
	rec := nextRecord(t, recs)
	if rec.Predicted.Stage == record.StageUnknown || rec.Predicted.Status != 200 {
		t.Errorf("the conditional GET that built the document: predicted %d at %q (%s), the apiserver answered 200", rec.Predicted.Status, rec.Predicted.Stage, rec.Predicted.Message)
	}
}

// TestOpenAPIV3DocumentOfNewGroup: a CustomResourceDefinition's OpenAPI v3
// document is listed in the aggregator's index a second or so after its
// APIService appears. A replay that read the index in that second cached
// it without the group, and every later request of the document was
// predicted 404 until the next CRD change (a probe: 404 predicted, 200
// answered, 7 minutes after the CRD was created). A read made before the
// documents settled is no longer kept.
func TestOpenAPIV3DocumentOfNewGroup(t *testing.T) {
	recs, r, c := oneReplayWorker(t)
	group := fmt.Sprintf("v3new%d.openapi.kproxy.test", time.Now().UnixNano())
	if got := createWidgetCRD(t, group); got.status != 201 {
		t.Fatalf("create the CRD: %d %s", got.status, got.body)
	}
	// The group's APIService is there and available: what the documents
	// list changes no more, and the index lists the group a moment later.
	direct := directRoute()
	dc := direct.client(nil)
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(string(do(t, dc, direct.base, request{method: "GET", path: "/apis/apiregistration.k8s.io/v1/apiservices/v1." + group, user: "admin"}).body),
		`"type":"Available","status":"True"`) {
		if time.Now().After(deadline) {
			t.Fatalf("APIService v1.%s not available within a minute", group)
		}
		time.Sleep(50 * time.Millisecond)
	}
	doc := request{method: "GET", path: "/openapi/v3/apis/" + group + "/v1", user: "admin", accept: "application/json"}
	first := do(t, c, r.base, doc)
	rec := nextRecord(t, recs)
	if rec.Predicted.Stage != record.StageUnknown && rec.Predicted.Status != first.status {
		t.Errorf("the document as its group was added: the apiserver answered %d; predicted %d at %q (%s)", first.status, rec.Predicted.Status, rec.Predicted.Stage, rec.Predicted.Message)
	}
	if first.status != 404 {
		t.Logf("the index listed the group at once (%d): the stale read this test is about was not made", first.status)
	}
	time.Sleep(32 * time.Second) // past discoverySettle: a kept read is used from now on
	got := do(t, c, r.base, doc)
	if got.status != 200 {
		t.Fatalf("GET %s half a minute after its CRD: %d, want 200", doc.path, got.status)
	}
	if rec := nextRecord(t, recs); rec.Predicted.Status != 200 {
		t.Errorf("GET %s half a minute after its CRD: the apiserver answered 200; predicted %d at %q (%s)", doc.path, rec.Predicted.Status, rec.Predicted.Stage, rec.Predicted.Message)
	}
}

// createWidgetCRD creates, directly, a namespaced CustomResourceDefinition
// of widgets in group, served at v1 with any fields, deleted after the
// test; it returns the apiserver's answer.
func createWidgetCRD(t *testing.T, group string) exchange {
	t.Helper()
	direct := directRoute()
	dc := direct.client(nil)
	crd := `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"widgets.` + group + `"},
"spec":{"group":"` + group + `","scope":"Namespaced","names":{"plural":"widgets","singular":"widget","kind":"Widget","listKind":"WidgetList"},
"versions":[{"name":"v1","served":true,"storage":true,"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}`
	got := do(t, dc, direct.base, request{method: "POST", path: "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", user: "admin", body: crd})
	if got.status == 201 {
		t.Cleanup(func() {
			do(t, dc, direct.base, request{method: "DELETE", path: "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets." + group, user: "admin"})
		})
	}
	return got
}

// TestOpenAPIV3DocumentByETag: a client that cached an OpenAPI v3
// document asks for it again with its ETag (If-None-Match), which kube-
// openapi's handler sets to the document's hash, the one the index links
// it by; net/http's ServeContent answers 304 for a match, 412 for a
// failed If-Match, the document otherwise. These were unknown, "not
// modelled" (a probe: five such requests). Right after a CRD or
// APIService changed they stay unknown, saying so.
func TestOpenAPIV3DocumentByETag(t *testing.T) {
	recs, r, c := oneReplayWorker(t)
	var index struct {
		Paths map[string]struct {
			ServerRelativeURL string `json:"serverRelativeURL"`
		} `json:"paths"`
	}
	direct := directRoute()
	got := do(t, direct.client(nil), direct.base, request{method: "GET", path: "/openapi/v3", user: "admin", accept: "application/json"})
	if err := json.Unmarshal(got.body, &index); err != nil || got.status != 200 {
		t.Fatalf("the OpenAPI v3 index: %d %v", got.status, err)
	}
	link := index.Paths["apis/apps/v1"].ServerRelativeURL
	u, err := url.Parse(link)
	if err != nil || u.Query().Get("hash") == "" {
		t.Fatalf("the index links apps/v1 as %q: no hash", link)
	}
	etag := `"` + u.Query().Get("hash") + `"`
	doc := func(path string, h http.Header) request {
		return request{method: "GET", path: path, user: "admin", accept: "application/json", header: h}
	}
	cases := []struct {
		name string
		req  request
		want int
	}{
		{"by hash, If-None-Match its ETag", doc(link, http.Header{"If-None-Match": {etag}}), 304},
		{"by hash, If-None-Match another", doc(link, http.Header{"If-None-Match": {`"nomatch"`}}), 200},
		{"without a hash, If-None-Match its ETag", doc(u.Path, http.Header{"If-None-Match": {etag}}), 304},
		{"without a hash, If-Match another", doc(u.Path, http.Header{"If-Match": {`"nomatch"`}}), 412},
		{"another hash, If-None-Match its ETag: redirected first", doc(u.Path+"?hash=0123", http.Header{"If-None-Match": {etag}}), 301},
	}
	for try := 1; try <= 2; try++ {
		changing := 0
		for _, tc := range cases {
			got := do(t, c, r.base, tc.req)
			if got.status != tc.want {
				t.Fatalf("%s: the apiserver answered %d, want %d", tc.name, got.status, tc.want)
			}
			rec := nextRecord(t, recs)
			p := rec.Predicted
			switch {
			case p.Stage == record.StageUnknown && strings.Contains(p.Message, "changed around its arrival"):
				changing++
			case p.Stage == record.StageUnknown || p.Status != tc.want:
				t.Errorf("%s (answered %d): predicted %d at %q (%s)", tc.name, tc.want, p.Status, p.Stage, p.Message)
			}
		}
		if changing == 0 {
			return
		}
		// A test before this one changed the CRDs: past the 30s the
		// documents settle in, they are predicted.
		time.Sleep(31 * time.Second)
	}
	t.Errorf("the documents were said to be changing for 31s: the path under test was not taken")
}

// TestOpenAPIV3LinkedHashRedirected: for a moment after a CRD joins a
// group that holds another, the apiserver's OpenAPI v3 index still links
// the group's document by its old hash, which the document's handler
// already redirects (301) to the new one (helm asks for it so, right
// after installing a chart's CRDs: a probe had 50 of 51 such 301s
// predicted 200). Asked for by the hash the index links while the
// documents change, the answer is unknown; it is never predicted 200 for
// a 301.
func TestOpenAPIV3LinkedHashRedirected(t *testing.T) {
	stream := record.NewStream()
	recs, _, cancel := stream.Subscribe(1024)
	defer cancel()
	k := startKproxy(t, kproxyOptions{stream: stream})
	r := reverseH2Route(k)
	c := r.client(nil)
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	group := fmt.Sprintf("v3hash%d.openapi.kproxy.test", time.Now().UnixNano())
	if got := createWidgetCRD(t, group); got.status != 201 {
		t.Fatalf("create the CRD: %d %s", got.status, got.body)
	}
	gv := "apis/" + group + "/v1"
	link := func() string {
		var index struct {
			Paths map[string]struct {
				ServerRelativeURL string `json:"serverRelativeURL"`
			} `json:"paths"`
		}
		got := do(t, c, r.base, request{method: "GET", path: "/openapi/v3", user: "admin", accept: "application/json"})
		if err := json.Unmarshal(got.body, &index); err != nil {
			t.Fatalf("the index: %v", err)
		}
		return index.Paths[gv].ServerRelativeURL
	}
	deadline := time.Now().Add(time.Minute)
	for link() == "" {
		if time.Now().After(deadline) {
			t.Fatalf("%s not in the OpenAPI v3 index within a minute", gv)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A second CRD in the group changes its document.
	direct := directRoute()
	crd := `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"gadgets.` + group + `"},
"spec":{"group":"` + group + `","scope":"Namespaced","names":{"plural":"gadgets","singular":"gadget","kind":"Gadget","listKind":"GadgetList"},
"versions":[{"name":"v1","served":true,"storage":true,"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}`
	if got := do(t, direct.client(nil), direct.base, request{method: "POST", path: "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", user: "admin", body: crd}); got.status != 201 {
		t.Fatalf("create the second CRD: %d %s", got.status, got.body)
	}
	t.Cleanup(func() {
		do(t, direct.client(nil), direct.base, request{method: "DELETE", path: "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gadgets." + group, user: "admin"})
	})
	statuses := map[int]int{}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		if l := link(); l != "" {
			statuses[do(t, c, r.base, request{method: "GET", path: l, user: "admin", accept: "application/json"}).status]++
		}
	}
	t.Logf("the linked document answered: %v", statuses)
	for {
		select {
		case rec := <-recs:
			if !strings.HasPrefix(rec.Request.Path, "/openapi/v3/"+gv) {
				continue
			}
			if p := rec.Predicted; p.Stage != record.StageUnknown && p.Status != rec.Actual.Status {
				t.Errorf("GET %s?%s: the apiserver answered %d; predicted %d (%s)", rec.Request.Path, rec.Request.Query, rec.Actual.Status, p.Status, p.Message)
			}
		case <-time.After(5 * time.Second):
			return
		}
	}
}
