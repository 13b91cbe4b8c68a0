package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// TestClientAbortsWatch: a client that goes away mid-stream must neither
// crash kproxy nor turn into a 500; the record notes the abort.
func TestClientAbortsWatch(t *testing.T) {
	r, recs := recordedKproxy(t)
	ctx, cancel := context.WithCancel(context.Background())
	resp := openWatch(ctx, t, r, "")
	buf := make([]byte, 1)
	go func() { _, _ = resp.Body.Read(buf) }()
	time.Sleep(200 * time.Millisecond)
	cancel()
	resp.Body.Close()

	select {
	case rec := <-recs:
		if rec.Request.Verb != "watch" || rec.Actual.Status != 200 {
			t.Errorf("record: verb %q status %d, want the watch's 200", rec.Request.Verb, rec.Actual.Status)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no record for the aborted watch")
	}
	// kproxy still serves.
	got := do(t, r.client(nil), r.base, request{method: "GET", path: "/api/v1/namespaces/" + testNS, user: "admin"})
	if got.status != 200 {
		t.Fatalf("after the abort: status %d", got.status)
	}
}

// TestWatchOverHTTP1Detached: a watch over HTTP/1.1, which kproxy relays
// off net/http once the apiserver has answered (internal/proxy/stream.go),
// against the real apiserver: the stream the apiserver ends (its
// timeoutSeconds) reaches the client whole and ends cleanly, with the
// record counting every byte; a client that goes away mid-stream ends
// the apiserver's watch too (its apiserver_longrunning_requests gauge
// goes back down), and its record says so.
func TestWatchOverHTTP1Detached(t *testing.T) {
	r, recs := recordedKproxy(t)
	list, err := adminClient().CoreV1().ConfigMaps(testNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	watch := func(ctx context.Context, query string) *http.Response {
		t.Helper()
		resp := openWatch(ctx, t, r, "&resourceVersion="+list.ResourceVersion+"&"+query)
		if resp.ProtoMajor != 1 {
			t.Fatalf("watch over %s, want HTTP/1.1", resp.Proto)
		}
		return resp
	}
	nextRecord := func() *record.Record {
		t.Helper()
		for {
			select {
			case rec := <-recs:
				if rec.Request.Verb == "watch" {
					return rec
				}
			case <-time.After(30 * time.Second):
				t.Fatal("no record for the watch within 30s")
			}
		}
	}

	t.Run("the apiserver ends the stream", func(t *testing.T) {
		name := "t-detached-watch"
		cmState(name, false)(t)
		resp := watch(context.Background(), "timeoutSeconds=3&labelSelector=case%3D"+name)
		cmState(name, true)(t) // an event while the watch is open
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("reading the watch to its end: %v (want a clean end)", err)
		}
		if !strings.Contains(string(body), `"type":"ADDED"`) || !strings.Contains(string(body), name) {
			t.Fatalf("the watch sent %q; want the ADDED event of %s", body, name)
		}
		rec := nextRecord()
		if rec.Actual.Status != 200 || rec.Actual.Error != "" || rec.Actual.ResponseBytes != int64(len(body)) {
			t.Errorf("record: status %d, error %q, %d bytes; want 200, no error, the %d bytes the client read",
				rec.Actual.Status, rec.Actual.Error, rec.Actual.ResponseBytes, len(body))
		}
	})

	t.Run("the client goes away", func(t *testing.T) {
		before := watchesOpen(t)
		ctx, cancel := context.WithCancel(context.Background())
		resp := watch(ctx, "labelSelector=case%3Dt-detached-nothing")
		waitFor(t, "the apiserver's watch to open", func() bool { return watchesOpen(t) > before })
		cancel()
		resp.Body.Close()
		waitFor(t, "the apiserver's watch to end after its client went away", func() bool { return watchesOpen(t) <= before })
		if rec := nextRecord(); rec.Actual.Status != 200 || rec.Actual.Error != "response aborted: the client closed its connection" {
			t.Errorf("record: status %d, error %q", rec.Actual.Status, rec.Actual.Error)
		}
	})
}

// recordedKproxy starts a kproxy and subscribes to its records; it
// returns its reverse-mode route (HTTP/1.1).
func recordedKproxy(t *testing.T) (route, <-chan *record.Record) {
	stream := record.NewStream()
	recs, _, cancel := stream.Subscribe(16)
	t.Cleanup(cancel)
	return reverseRoute(startKproxy(t, kproxyOptions{stream: stream})), recs
}

// openWatch opens a watch of testNS's configmaps through r as admin,
// query appended to the URL, and checks the apiserver said 200.
func openWatch(ctx context.Context, t *testing.T, r route, query string) *http.Response {
	t.Helper()
	url := fmt.Sprintf("%s/api/v1/namespaces/%s/configmaps?watch=1%s", r.base, testNS, query)
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+tokenOf("admin"))
	resp, err := r.client(nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("watch status %d", resp.StatusCode)
	}
	return resp
}

// watchesOpen reads the apiserver's gauge of open configmap watches.
func watchesOpen(t *testing.T) float64 {
	t.Helper()
	raw, err := adminClient().CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "apiserver_longrunning_requests{") && strings.Contains(line, `resource="configmaps"`) &&
			strings.Contains(line, `verb="WATCH"`) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			n += v
		}
	}
	return n
}

// waitFor polls cond for up to 30s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 30s for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
