package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/record"
)

// TestClientAbortsWatch: a client that goes away mid-stream must neither
// crash kproxy nor turn into a 500; the record notes the abort.
func TestClientAbortsWatch(t *testing.T) {
	stream := record.NewStream()
	recs, _, cancelSub := stream.Subscribe(16)
	defer cancelSub()
	k := startKproxy(t, kproxyOptions{stream: stream})
	r := reverseRoute(k)
	ctx, cancel := context.WithCancel(context.Background())
	url := fmt.Sprintf("%s/api/v1/namespaces/%s/configmaps?watch=1", r.base, testNS)
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+tokenOf("admin"))
	resp, err := r.client(nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("watch status %d", resp.StatusCode)
	}
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
