package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestOpenAPIIndexChangedReplayedLate: kubectl's conditional GET of the
// OpenAPI v3 index (If-Modified-Since its cached copy's time), answered
// 304 and replayed after the index changed (a CustomResourceDefinition of
// a new group). Before, the replay read the new index and predicted 200, a
// confident miss (seen in TestKubectlSession in CI). The version kproxy
// read before the request and the one it reads after get different
// answers, so the record is unknown; a copy older than both gets 200
// from either, so that request stays predicted.
func TestOpenAPIIndexChangedReplayedLate(t *testing.T) {
	recs, r, c := oneReplayWorker(t)
	hold := startReplayHold(t, r, c, recs)
	index := request{method: "GET", path: "/openapi/v3", user: "admin", accept: "application/json"}
	got := do(t, c, r.base, index)
	lastModified := got.header.Get("Last-Modified")
	if got.status != 200 || lastModified == "" {
		t.Fatalf("GET /openapi/v3: %d, Last-Modified %q", got.status, lastModified)
	}
	nextRecord(t, recs)
	since := func(when string) request {
		r := index
		r.header = http.Header{"If-Modified-Since": {when}}
		return r
	}
	// Replayed at once: kproxy reads the index (the version before).
	if got := do(t, c, r.base, since(lastModified)); got.status != 304 {
		t.Fatalf("GET /openapi/v3 If-Modified-Since its Last-Modified: %d, want 304", got.status)
	}
	if rec := nextRecord(t, recs); rec.Predicted.Status != 304 {
		t.Fatalf("the conditional GET replayed at once: predicted %d at %s (%s), want 304", rec.Predicted.Status, rec.Predicted.Stage, rec.Predicted.Message)
	}

	hold.hold(t)
	sent := []struct {
		req  request
		want int
		why  string // the unknown prediction says; "" for a prediction
	}{
		{since(lastModified), 304, ": the index changed between kproxy's last read before this request's arrival"},
		{since("Sat, 01 Jan 2000 00:00:00 GMT"), 200, ""},
	}
	for _, s := range sent {
		if got := do(t, c, r.base, s.req); got.status != s.want {
			hold.release()
			t.Fatalf("GET /openapi/v3 If-Modified-Since %s: %d, want %d", s.req.header.Get("If-Modified-Since"), got.status, s.want)
		}
	}
	// A new group changes the index; its Last-Modified is the time the
	// apiserver next builds it, at a read (a second later at least).
	time.Sleep(1100 * time.Millisecond)
	group := fmt.Sprintf("late%d.openapi.kproxy.test", time.Now().UnixNano())
	crd := `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"widgets.` + group + `"},
"spec":{"group":"` + group + `","scope":"Namespaced","names":{"plural":"widgets","singular":"widget","kind":"Widget","listKind":"WidgetList"},
"versions":[{"name":"v1","served":true,"storage":true,"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}`
	direct := directRoute()
	dc := direct.client(nil)
	if got := do(t, dc, direct.base, request{method: "POST", path: "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", user: "admin", body: crd}); got.status != 201 {
		hold.release()
		t.Fatalf("create the CRD: %d %s", got.status, got.body)
	}
	t.Cleanup(func() {
		do(t, dc, direct.base, request{method: "DELETE", path: "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets." + group, user: "admin"})
	})
	deadline := time.Now().Add(time.Minute)
	for {
		got := do(t, dc, direct.base, index)
		if got.header.Get("Last-Modified") != lastModified && strings.Contains(string(got.body), "apis/"+group+"/v1") {
			break
		}
		if time.Now().After(deadline) {
			hold.release()
			t.Fatalf("the OpenAPI v3 index did not list %s within a minute", group)
		}
		time.Sleep(200 * time.Millisecond)
	}
	hold.releaseAndCheck(t, "the index changed", sent[0].why, sent[1].why)
}
