package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kproxy/kproxy/internal/record"
)

// TestConversionWebhook: a custom resource served in two versions, the
// stored v1 (replicas) and v2 (size, at most 40), converted by a webhook
// of the test's. The replay reads and writes the object through the
// apiextensions server, which calls the webhook for kproxy as it does for
// the apiserver. Writes and reads through v2 are predicted as answered,
// refusals by v2's schema included. A webhook that fails to convert to
// the stored version (a patch reads the object through v2, then stores
// it: the read converts, the write fails) fails the write in both alike
// (500, the same message); one that fails only kproxy's call (it starts
// failing once the apiserver answered, and the replay runs behind queued
// writes) makes the replay say unknown, where it had predicted the 500
// for a 200; one that fails only the apiserver's call (it recovers before
// the replay) makes the replay say unknown, where it had predicted 200 or
// 201 for the 500.
func TestConversionWebhook(t *testing.T) {
	var failing, failingV2 atomic.Bool
	hook := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var review map[string]any
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		req, _ := review["request"].(map[string]any)
		want, _ := req["desiredAPIVersion"].(string)
		resp := map[string]any{"uid": req["uid"]}
		if (failing.Load() && strings.HasSuffix(want, "/v1")) || (failingV2.Load() && strings.HasSuffix(want, "/v2")) {
			resp["result"] = map[string]any{"status": "Failure", "message": "the converter is down for maintenance"}
		} else {
			var out []any
			objects, _ := req["objects"].([]any)
			for _, o := range objects {
				obj, _ := o.(map[string]any)
				spec, _ := obj["spec"].(map[string]any)
				if strings.HasSuffix(want, "/v2") && spec["replicas"] != nil {
					spec["size"] = spec["replicas"]
					delete(spec, "replicas")
				} else if strings.HasSuffix(want, "/v1") && spec["size"] != nil {
					spec["replicas"] = spec["size"]
					delete(spec, "size")
				}
				obj["apiVersion"] = want
				out = append(out, obj)
			}
			resp["result"] = map[string]any{"status": "Success"}
			resp["convertedObjects"] = out
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview", "response": resp})
	}))
	defer hook.Close()
	caBundle := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: hook.Certificate().Raw}))
	crd := filepath.Join(t.TempDir(), "crd.yaml")
	if err := os.WriteFile(crd, []byte(fmt.Sprintf(`apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gizmos.conversion.kproxy.test}
spec:
  group: conversion.kproxy.test
  names: {kind: Gizmo, plural: gizmos}
  scope: Namespaced
  conversion:
    strategy: Webhook
    webhook:
      conversionReviewVersions: [v1]
      clientConfig: {url: %q, caBundle: %q}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {replicas: {type: integer, maximum: 50}}}
  - name: v2
    served: true
    storage: false
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {size: {type: integer, maximum: 40}}}
`, hook.URL+"/convert", caBundle)), 0o600); err != nil {
		t.Fatal(err)
	}
	applyManifest(t, "apply", "-f", crd)
	t.Cleanup(func() { applyManifest(t, "delete", "-f", crd, "--wait=false") })
	applyManifest(t, "wait", "--for=condition=Established", "--timeout=60s", "crd/gizmos.conversion.kproxy.test")

	recs, r, c := oneReplayWorker(t)
	v1 := "/apis/conversion.kproxy.test/v1/namespaces/" + testNS + "/gizmos"
	v2 := "/apis/conversion.kproxy.test/v2/namespaces/" + testNS + "/gizmos"
	gizmo := func(name string, size int) string {
		return fmt.Sprintf(`{"apiVersion":"conversion.kproxy.test/v2","kind":"Gizmo","metadata":{"name":%q},"spec":{"size":%d}}`, name, size)
	}
	size := func(n int) request {
		return request{method: "PATCH", path: v2 + "/a", user: "admin", contentType: "application/merge-patch+json", body: fmt.Sprintf(`{"spec":{"size":%d}}`, n)}
	}
	// The first request may meet the apiserver before its CRD is served
	// everywhere: wait for it to be predicted.
	waitPredicted(t, recs, r, c, request{method: "GET", path: v2, user: "admin"})
	for _, tc := range []struct {
		req    request
		status int
	}{
		{request{method: "POST", path: v2, user: "admin", body: gizmo("a", 3)}, 201},
		{request{method: "GET", path: v2 + "/a", user: "admin"}, 200},
		{request{method: "GET", path: v2, user: "admin"}, 200},
		{size(4), 200},
		{request{method: "GET", path: v1 + "/a", user: "admin"}, 200},
		{request{method: "POST", path: v2, user: "admin", body: gizmo("big", 60)}, 422}, // v2's schema
	} {
		got := do(t, c, r.base, tc.req)
		if got.status != tc.status {
			t.Fatalf("%s %s: %d %s, want %d", tc.req.method, tc.req.path, got.status, got.body, tc.status)
		}
		checkPredicted(t, nextRecord(t, recs))
	}

	// Every conversion to v1 fails: the apiserver's write fails, and the
	// replay's alike.
	failing.Store(true)
	if got := do(t, c, r.base, size(5)); got.status != http.StatusInternalServerError {
		t.Fatalf("a patch while the converter fails: %d %s, want 500", got.status, got.body)
	}
	checkPredicted(t, nextRecord(t, recs))
	failing.Store(false)

	// Only kproxy's call fails: the replay, behind queued writes, calls
	// the webhook once it fails to convert to v1.
	late := 0
	for i := range 3 {
		queueWrites(t, r, c, 40)
		if got := do(t, c, r.base, size(6+i)); got.status != http.StatusOK {
			t.Fatalf("a patch: %d %s, want 200", got.status, got.body)
		}
		failing.Store(true)
		var rec *record.Record
		for rec == nil || rec.Request.Path != v2+"/a" {
			rec = nextRecord(t, recs)
		}
		failing.Store(false)
		p := rec.Predicted
		switch {
		case p.Stage == record.StageUnknown && strings.Contains(p.Message, "the conversion webhook failed kproxy's call (500: ") &&
			strings.Contains(p.Message, "the converter is down for maintenance") && strings.Contains(p.Message, "and the apiserver answered 200"):
			late++
		case p.Stage != record.StageUnknown && p.Status == http.StatusOK:
			// The replay ran before the webhook began failing.
		default:
			t.Errorf("a patch whose replay met a failing converter: predicted %+v, answered %d", p, rec.Actual.Status)
		}
	}
	t.Logf("%d of 3 patches replayed after the converter began failing, each said unknown", late)
	if late == 0 {
		t.Error("no replay ran after the converter began failing: the test proved nothing")
	}

	// Only the apiserver's call fails: its write fails (500), and the
	// replay, behind queued writes, meets a converter that works again
	// and admits it (a patch's 200, a create's 201), or refuses it
	// otherwise: a create of an object that exists fails to convert
	// before the store looks for it (500), where the replay's is 409.
	// Unknown, not a confident 200, 201 or 409 (the 409 was predicted).
	late = 0
	for i, req := range []request{size(10), {method: "POST", path: v2, user: "admin", body: gizmo("e", 3)},
		{method: "POST", path: v2, user: "admin", body: gizmo("a", 3)}, size(11)} {
		queueWrites(t, r, c, 40)
		failing.Store(true)
		got := do(t, c, r.base, req)
		failing.Store(false)
		if got.status != http.StatusInternalServerError {
			t.Fatalf("%s %s while the converter fails: %d %s, want 500", req.method, req.path, got.status, got.body)
		}
		var rec *record.Record
		for rec == nil || rec.Request.Method != req.method || rec.Request.Path != req.path {
			rec = nextRecord(t, recs)
		}
		switch p := rec.Predicted; {
		case p.Stage == record.StageUnknown && strings.Contains(p.Message, "the apiserver's call to a conversion webhook failed the write (500: ") &&
			strings.Contains(p.Message, "and kproxy's replay "):
			late++
		case p.Stage != record.StageUnknown && p.Status == http.StatusInternalServerError:
			// The replay ran before the converter recovered.
		default:
			t.Errorf("write %d, whose replay met a working converter after the apiserver's failed: predicted %+v, answered %d %q", i, p, rec.Actual.Status, rec.Actual.Message)
		}
	}
	t.Logf("%d of 4 writes replayed after the converter recovered, each said unknown", late)
	if late == 0 {
		t.Error("no write's replay ran after the converter recovered: the test proved nothing")
	}

	// Every conversion to v2 fails: reading the stored object through v2
	// fails. A get of the latest reads etcd, in the apiserver and in the
	// replay alike: the etcd3 store's "corrupt object" 500, predicted. A
	// get at resourceVersion=0 and a list are answered from the
	// apiserver's watch cache, which holds the object as it was decoded
	// when stored: 200, and kproxy, whose read of etcd fails, says
	// unknown. The patch's and the delete's reads are the write
	// replay's, not yet modelled for this: unknown.
	failingV2.Store(true)
	for _, tc := range []struct {
		req       request
		status    int
		predicted bool // else unknown, saying why
		why       string
	}{
		{request{method: "GET", path: v2 + "/a", user: "admin"}, 500, true, ""},
		{request{method: "GET", path: v2 + "/a?resourceVersion=0", user: "admin"}, 200, false, "the apiserver answers a get at a resourceVersion from its watch cache"},
		{request{method: "GET", path: v2, user: "admin"}, 200, false, "the apiserver answers lists from its watch cache"},
		{request{method: "GET", path: v2 + "?limit=1", user: "admin"}, 200, false, "the apiserver answers lists from its watch cache"},
		{request{method: "GET", path: v1 + "/a", user: "admin"}, 200, true, ""},
		{request{method: "DELETE", path: v2 + "/a", user: "admin"}, 500, true, ""},
	} {
		got := do(t, c, r.base, tc.req)
		if got.status != tc.status {
			t.Fatalf("%s %s while conversions to v2 fail: %d %s, want %d", tc.req.method, tc.req.path, got.status, got.body, tc.status)
		}
		rec := nextRecord(t, recs)
		if tc.predicted {
			checkPredicted(t, rec)
		} else if p := rec.Predicted; p.Stage != record.StageUnknown || !strings.Contains(p.Message, tc.why) {
			t.Errorf("%s %s: predicted %d %s %q, want unknown saying %q", tc.req.method, tc.req.path, p.Status, p.Stage, p.Message, tc.why)
		}
	}
	if got := do(t, c, r.base, request{method: "GET", path: v2 + "/a", user: "admin"}); !strings.Contains(string(got.body), "StorageError: corrupt object") {
		t.Fatalf("a get while conversions to v2 fail: %d %s, want the etcd3 store's corrupt object", got.status, got.body)
	}
	checkPredicted(t, nextRecord(t, recs))

	// The apiserver's read failed, and kproxy's, behind queued writes,
	// meets a converter that works again: unknown, not a 200.
	late = 0
	for range 3 {
		failingV2.Store(true)
		queueWrites(t, r, c, 40)
		if got := do(t, c, r.base, request{method: "GET", path: v2 + "/a", user: "admin"}); got.status != http.StatusInternalServerError {
			t.Fatalf("a get while conversions to v2 fail: %d %s, want 500", got.status, got.body)
		}
		failingV2.Store(false)
		var rec *record.Record
		for rec == nil || rec.Request.Path != v2+"/a" {
			rec = nextRecord(t, recs)
		}
		switch p := rec.Predicted; {
		case p.Stage == record.StageUnknown && strings.Contains(p.Message, "the apiserver answered 500 (it could not decrypt, decode or convert the object") &&
			strings.Contains(p.Message, "and kproxy's read could"):
			late++
		case p.Stage != record.StageUnknown && p.Status == http.StatusInternalServerError && p.Message == rec.Actual.Message:
			// The replay read before the converter recovered.
		default:
			t.Errorf("a get whose replay met a working converter: predicted %+v, answered %d %q", p, rec.Actual.Status, rec.Actual.Message)
		}
	}
	t.Logf("%d of 3 gets replayed after the converter recovered, each said unknown", late)
	if late == 0 {
		t.Error("no get's replay ran after the converter recovered: the test proved nothing")
	}
	// Deleting what cannot be read: DELETE with
	// ignoreStoreReadErrorWithClusterBreakingPotential, which the corrupt
	// object deleter answers from the storage itself, past the dry-run
	// layer: refused for alice (no delete, let alone the unsafe verb), for
	// grace periods (422), dry run (200: the delete would go ahead), the
	// delete itself (200, replayed late: read as etcd's history shows the
	// key just before the delete), then 404; an object that decodes is
	// refused (409, "decodable from storage"), dry run or not.
	failingV2.Store(true)
	unsafe := v2 + "/a?ignoreStoreReadErrorWithClusterBreakingPotential=true"
	for _, tc := range []struct {
		req    request
		status int
		late   bool // replayed behind queued writes
	}{
		{request{method: "DELETE", path: unsafe, user: "alice"}, 403, false},
		{request{method: "DELETE", path: unsafe + "&gracePeriodSeconds=5", user: "admin"}, 422, false},
		{request{method: "DELETE", path: unsafe + "&dryRun=All", user: "admin"}, 200, false},
		{request{method: "DELETE", path: unsafe, user: "admin"}, 200, true},
		{request{method: "DELETE", path: unsafe, user: "admin"}, 404, false},
	} {
		if tc.late {
			queueWrites(t, r, c, 40)
		}
		got := do(t, c, r.base, tc.req)
		if got.status != tc.status {
			t.Fatalf("%s %s: %d %s, want %d", tc.req.method, tc.req.path, got.status, got.body, tc.status)
		}
		rec := nextRecord(t, recs)
		for rec.Request.Path != strings.Split(tc.req.path, "?")[0] {
			rec = nextRecord(t, recs)
		}
		checkPredicted(t, rec)
		if e := stageNamed(rec, record.StageStorage).Explanation; tc.late && (!strings.Contains(e, "cannot decrypt or decode it") || !strings.Contains(e, "before the request's own write")) {
			t.Errorf("the unsafe delete replayed behind queued writes does not read the object as it was just before its delete: %s", e)
		}
	}
	// A create is stored, and then its answer cannot be decoded: 500
	// "object not decodable revision=N" for an object that now exists.
	// The replay's dry run never reaches that decode: unknown, saying so.
	if got := do(t, c, r.base, request{method: "POST", path: v2, user: "admin", body: gizmo("b", 3)}); got.status != http.StatusInternalServerError {
		t.Fatalf("a create while conversions to v2 fail: %d %s, want 500", got.status, got.body)
	}
	if p := nextRecord(t, recs).Predicted; p.Stage != record.StageUnknown || !strings.Contains(p.Message, "the converter is down for maintenance") {
		t.Errorf("a create stored and answered 500: predicted %+v, want unknown", p)
	}
	// An unsafe delete whose replay, behind queued writes, finds the
	// object created again (readable): unknown, not the 409 a readable
	// object gets. The creates go to the apiserver directly.
	direct := func(body string) {
		t.Helper()
		if err := adminClient().CoreV1().RESTClient().Post().AbsPath(v2).SetHeader("Content-Type", "application/json").
			Body([]byte(body)).Do(context.Background()).Error(); err != nil {
			t.Fatalf("a create of %s: %v", body, err)
		}
	}
	failingV2.Store(false)
	direct(gizmo("d", 3))
	failingV2.Store(true)
	queueWrites(t, r, c, 40)
	if got := do(t, c, r.base, request{method: "DELETE", path: v2 + "/d?ignoreStoreReadErrorWithClusterBreakingPotential=true", user: "admin"}); got.status != http.StatusOK {
		t.Fatalf("an unsafe delete: %d %s", got.status, got.body)
	}
	failingV2.Store(false)
	direct(gizmo("d", 4))
	for rec := nextRecord(t, recs); ; rec = nextRecord(t, recs) {
		if rec.Request.Method != "DELETE" || rec.Request.Path != v2+"/d" {
			continue
		}
		if p := rec.Predicted; p.Stage != record.StageUnknown || !strings.Contains(p.Message, "reads it fine") {
			t.Errorf("an unsafe delete replayed after the object was created again: predicted %+v, answered %d", p, rec.Actual.Status)
		}
		break
	}
	decodable := v2 + "/c?ignoreStoreReadErrorWithClusterBreakingPotential=true"
	for _, tc := range []struct {
		req    request
		status int
	}{
		{request{method: "POST", path: v2, user: "admin", body: gizmo("c", 3)}, 201},
		{request{method: "DELETE", path: decodable, user: "admin"}, 409},
		{request{method: "DELETE", path: decodable + "&dryRun=All", user: "admin"}, 409},
		{request{method: "DELETE", path: v2 + "/nosuch?ignoreStoreReadErrorWithClusterBreakingPotential=true", user: "admin"}, 404},
	} {
		got := do(t, c, r.base, tc.req)
		if got.status != tc.status {
			t.Fatalf("%s %s: %d %s, want %d", tc.req.method, tc.req.path, got.status, got.body, tc.status)
		}
		checkPredicted(t, nextRecord(t, recs))
	}
}

// checkPredicted fails unless rec's prediction is the apiserver's answer:
// status, reason and message.
func checkPredicted(t *testing.T, rec *record.Record) {
	t.Helper()
	p, a := rec.Predicted, rec.Actual
	if p.Stage == record.StageUnknown || p.Status != a.Status || p.Reason != a.Reason || !record.SameMessage(p.Message, a.Message) {
		t.Errorf("%s %s: predicted %d %s %q at %s, answered %d %s %q%s", rec.Request.Method, rec.Request.Path,
			p.Status, p.Reason, p.Message, p.Stage, a.Status, a.Reason, a.Message, stageSummary(rec))
	}
}
