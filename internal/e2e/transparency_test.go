package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// cmState puts ConfigMap name into a known state before each route sends
// the same request, so direct and proxied answers can be compared.
func cmState(name string, exists bool) func(t *testing.T) {
	return func(t *testing.T) {
		t.Helper()
		ctx := context.Background()
		cs := adminClient()
		zero := int64(0)
		if err := ignoreNotFound(cs.CoreV1().ConfigMaps(testNS).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})); err != nil {
			t.Fatal(err)
		}
		if exists {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"case": name}}, Data: map[string]string{"a": "1"}}
			if _, err := cs.CoreV1().ConfigMaps(testNS).Create(ctx, cm, createOpts); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func cmJSON(name string) string {
	return fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":%q,"labels":{"case":%q}},"data":{"a":"1"}}`, name, name)
}

// comparedHeaders must be equal directly and through kproxy.
var comparedHeaders = []string{
	"Content-Type", "Content-Encoding", "Warning", "Cache-Control", "X-Content-Type-Options",
	"X-Kubernetes-Pf-Flowschema-Uid", "X-Kubernetes-Pf-Prioritylevel-Uid",
}

func TestTransparency(t *testing.T) {
	k := startKproxy(t, kproxyOptions{})
	kf := startKproxy(t, kproxyOptions{mode: "forward"})
	routes := []route{directRoute(), reverseRoute(k), reverseH2Route(k), forwardRoute(kf)}
	ns := "/api/v1/namespaces/" + testNS
	cases := []struct {
		name   string
		setup  func(*testing.T)
		req    request
		status int
	}{
		{"get", nil, request{method: "GET", path: ns, user: "admin"}, 200},
		{"get protobuf", nil, request{method: "GET", path: ns, user: "admin", accept: "application/vnd.kubernetes.protobuf"}, 200},
		{"get yaml", nil, request{method: "GET", path: ns, user: "admin", accept: "application/yaml"}, 200},
		{"list", cmState("t-list", true), request{method: "GET", path: ns + "/configmaps?labelSelector=case%3Dt-list", user: "admin"}, 200},
		{"list as table", cmState("t-table", true), request{method: "GET", path: ns + "/configmaps?labelSelector=case%3Dt-table", user: "admin",
			accept: "application/json;as=Table;v=v1;g=meta.k8s.io"}, 200},
		{"discovery", nil, request{method: "GET", path: "/apis", user: "admin"}, 200},
		{"healthz", nil, request{method: "GET", path: "/healthz"}, 200},
		{"create", cmState("t-create", false), request{method: "POST", path: ns + "/configmaps", body: cmJSON("t-create"), user: "admin"}, 201},
		{"create as devs member", cmState("t-create-alice", false), request{method: "POST", path: ns + "/configmaps", body: cmJSON("t-create-alice"), user: "alice"}, 201},
		{"update", cmState("t-update", true), request{method: "PUT", path: ns + "/configmaps/t-update",
			body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"t-update"},"data":{"a":"2"}}`, user: "admin"}, 200},
		{"json patch", cmState("t-jsonpatch", true), request{method: "PATCH", path: ns + "/configmaps/t-jsonpatch",
			body: `[{"op":"add","path":"/data/b","value":"2"}]`, contentType: "application/json-patch+json", user: "admin"}, 200},
		{"merge patch", cmState("t-mergepatch", true), request{method: "PATCH", path: ns + "/configmaps/t-mergepatch",
			body: `{"data":{"b":"2"}}`, contentType: "application/merge-patch+json", user: "admin"}, 200},
		{"strategic merge patch", cmState("t-smpatch", true), request{method: "PATCH", path: ns + "/configmaps/t-smpatch",
			body: `{"data":{"b":"2"}}`, contentType: "application/strategic-merge-patch+json", user: "admin"}, 200},
		{"apply patch", cmState("t-apply", false), request{method: "PATCH", path: ns + "/configmaps/t-apply?fieldManager=e2e",
			body: "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: t-apply\ndata:\n  a: \"1\"\n", contentType: "application/apply-patch+yaml", user: "admin"}, 201},
		{"delete", cmState("t-delete", true), request{method: "DELETE", path: ns + "/configmaps/t-delete", user: "admin"}, 200},
		{"dry-run create", cmState("t-dryrun", false), request{method: "POST", path: ns + "/configmaps?dryRun=All", body: cmJSON("t-dryrun"), user: "admin"}, 201},
		{"forbidden", nil, request{method: "GET", path: ns + "/secrets", user: "alice"}, 403},
		{"forbidden anonymous", nil, request{method: "GET", path: ns + "/configmaps"}, 403},
		{"unauthorized token", nil, request{method: "GET", path: ns + "/configmaps", user: "bad"}, 401},
		{"not found", nil, request{method: "GET", path: ns + "/configmaps/does-not-exist", user: "admin"}, 404},
		{"already exists", cmState("t-exists", true), request{method: "POST", path: ns + "/configmaps", body: cmJSON("t-exists"), user: "admin"}, 409},
		{"conflict", cmState("t-conflict", true), request{method: "PUT", path: ns + "/configmaps/t-conflict",
			body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"t-conflict","resourceVersion":"1"},"data":{"a":"2"}}`, user: "admin"}, 409},
		{"invalid", nil, request{method: "POST", path: ns + "/pods",
			body: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"bad"},"spec":{"containers":[]}}`, user: "admin"}, 422},
		{"bad json", nil, request{method: "POST", path: ns + "/configmaps", body: `{"apiVersion":`, user: "admin"}, 400},
		{"unsupported media type", nil, request{method: "POST", path: ns + "/configmaps", body: `x`, contentType: "text/plain", user: "admin"}, 415},
		{"warning header", cmState("t-warn", false), request{method: "POST", path: ns + "/configmaps?fieldValidation=Warn",
			body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"t-warn"},"data":{"a":"1"},"bogus":"x"}`, user: "admin"}, 201},
		// A body over the apiserver's 3 MiB limit reaches it whole (the
		// replay keeps only 3 MiB of it) and gets the apiserver's 413.
		{"body over 3 MiB", nil, request{method: "POST", path: ns + "/configmaps", user: "admin",
			body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"t-big"},"data":{"a":"` + strings.Repeat("x", 4<<20) + `"}}`}, 413},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var want exchange
			for i, r := range routes {
				if tc.setup != nil {
					tc.setup(t)
				}
				got := do(t, r.client(nil), r.base, tc.req)
				if got.status != tc.status {
					t.Fatalf("%s: status %d, want %d; body: %s", r.name, got.status, tc.status, got.body)
				}
				if got.header.Get("Audit-Id") == "" {
					t.Errorf("%s: no Audit-Id header", r.name)
				}
				if tc.name == "warning header" && !strings.Contains(got.header.Get("Warning"), "bogus") {
					t.Errorf("%s: Warning header %q, want the unknown-field warning", r.name, got.header.Get("Warning"))
				}
				if i == 0 {
					want = got
					continue
				}
				if got.norm != want.norm {
					t.Errorf("%s: body differs from direct\n direct: %s\n %s: %s", r.name, want.norm, r.name, got.norm)
				}
				for _, h := range comparedHeaders {
					if g, w := got.header.Values(h), want.header.Values(h); fmt.Sprint(g) != fmt.Sprint(w) {
						t.Errorf("%s: header %s = %q, direct %q", r.name, h, g, w)
					}
				}
			}
		})
	}
}

// TestWatch checks that a watch through kproxy delivers an event for a
// write made after it opened, in both modes.
func TestWatch(t *testing.T) {
	k := startKproxy(t, kproxyOptions{})
	kf := startKproxy(t, kproxyOptions{mode: "forward"})
	for _, r := range []route{reverseRoute(k), reverseH2Route(k), forwardRoute(kf)} {
		t.Run(r.name, func(t *testing.T) {
			name := "t-watch-" + r.name
			cmState(name, false)(t)
			list, err := adminClient().CoreV1().ConfigMaps(testNS).List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			url := fmt.Sprintf("%s/api/v1/namespaces/%s/configmaps?watch=1&resourceVersion=%s&labelSelector=case%%3D%s",
				r.base, testNS, list.ResourceVersion, name)
			req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
			req.Header.Set("Authorization", "Bearer "+tokenOf("admin"))
			resp, err := r.client(nil).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("watch status %d", resp.StatusCode)
			}
			events := make(chan map[string]any)
			go func() {
				defer close(events)
				sc := bufio.NewScanner(resp.Body)
				sc.Buffer(make([]byte, 1<<20), 1<<20)
				for sc.Scan() {
					var ev map[string]any
					if json.Unmarshal(sc.Bytes(), &ev) == nil {
						select {
						case events <- ev:
						case <-ctx.Done():
							return
						}
					}
				}
			}()
			// The watch is open (headers arrived); now write.
			cmState(name, true)(t)
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatal("watch ended before any event")
				}
				obj, _ := ev["object"].(map[string]any)
				meta, _ := obj["metadata"].(map[string]any)
				if ev["type"] != "ADDED" || meta["name"] != name {
					t.Fatalf("got event %v %v, want ADDED %s", ev["type"], meta["name"], name)
				}
			case <-ctx.Done():
				t.Fatal("no watch event through kproxy within a minute")
			}
		})
	}
}

// TestWatchEvents: a watch's record counts the events its client got,
// over HTTP/1.1 (relayed off net/http) and HTTP/2, in JSON and protobuf:
// three ConfigMaps listed as ADDED from resourceVersion 0, then the
// stream ends at its timeout. (An ERROR event ending a stream, which the
// record names too, is TestDetachedWatch's and TestWatchTally's: this
// cluster's watch cache does not refuse an old resourceVersion on cue.)
func TestWatchEvents(t *testing.T) {
	ctx := context.Background()
	for i := range 3 {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("t-events-%d", i), Labels: map[string]string{"case": "t-events"}}}
		if _, err := adminClient().CoreV1().ConfigMaps(testNS).Create(ctx, cm, createOpts); err != nil && ignoreAlreadyExists(err) != nil {
			t.Fatal(err)
		}
	}
	stream := record.NewStream()
	recs, _, cancel := stream.Subscribe(16)
	defer cancel()
	k := startKproxy(t, kproxyOptions{stream: stream})
	for _, r := range []route{reverseRoute(k), reverseH2Route(k)} {
		for _, accept := range []string{"application/json", "application/vnd.kubernetes.protobuf;stream=watch"} {
			t.Run(r.name+" "+accept, func(t *testing.T) {
				ex := do(t, r.client(nil), r.base, request{method: "GET", user: "admin", header: http.Header{"Accept": {accept}},
					path: "/api/v1/namespaces/" + testNS + "/configmaps?watch=1&resourceVersion=0&labelSelector=case%3Dt-events&timeoutSeconds=1"})
				rec := nextRecord(t, recs)
				if ex.status != 200 || rec.Actual.Events == nil || *rec.Actual.Events != 3 || rec.Actual.StreamError != nil {
					t.Errorf("watch answered %d: recorded %d events, stream error %+v; want 3 ADDED events and none (the stream: %q)",
						ex.status, deref(rec.Actual.Events), rec.Actual.StreamError, ex.body)
				}
			})
			// A watch list (the initial events, then a bookmark), asked
			// with gzip as client-go asks: the apiserver compresses it,
			// and its events are not counted (probe AH: 0 recorded for 6,
			// and 3 for 7, the compressed bytes read as frames).
			t.Run(r.name+" "+accept+" gzip", func(t *testing.T) {
				ex := do(t, r.client(nil), r.base, request{method: "GET", user: "admin", header: http.Header{"Accept": {accept}, "Accept-Encoding": {"gzip"}},
					path: "/api/v1/namespaces/" + testNS + "/configmaps?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&labelSelector=case%3Dt-events&timeoutSeconds=1"})
				rec := nextRecord(t, recs)
				gzipped := ex.header.Get("Content-Encoding") == "gzip"
				t.Logf("Content-Encoding %q, %d events recorded", ex.header.Get("Content-Encoding"), deref(rec.Actual.Events))
				if ex.status != 200 || gzipped && rec.Actual.Events != nil || !gzipped && deref(rec.Actual.Events) != 4 {
					t.Errorf("watch list answered %d (Content-Encoding %q): recorded %v events; want none counted when compressed, else 3 ADDED and a bookmark",
						ex.status, ex.header.Get("Content-Encoding"), deref(rec.Actual.Events))
				}
			})
		}
	}
}

// deref is *p, or 0 for nil.
func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
