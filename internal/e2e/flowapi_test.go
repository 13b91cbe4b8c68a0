package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/flowapi"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
)

// syncBuffer is a log destination shared by kproxy's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestFlowAPI drives the flow API of a kproxy in front of the real
// apiserver: a request RBAC refuses and one it allows, then list with a
// filter, get, the event stream and its resumption, and a re-run.
func TestFlowAPI(t *testing.T) {
	var log syncBuffer
	k := startKproxy(t, kproxyOptions{flowAPI: true, log: &log})
	r := reverseRoute(k)
	if !strings.HasPrefix(k.apiURL, "http://127.0.0.1:") || strings.HasSuffix(k.apiURL, ":0") {
		t.Fatalf("APIURL %q: want the bound loopback address", k.apiURL)
	}
	if !strings.Contains(log.String(), `msg="flow API listening" url=`+k.apiURL) {
		t.Errorf("kproxy did not log the API's address:\n%s", log.String())
	}
	c, err := flowapi.NewClient(k.apiURL, flowapi.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseIdleConnections()

	// Follow the stream from the start: it delivers both flows.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	flows := make(chan *record.Record, 16)
	streamCtx, stopStream := context.WithCancel(ctx)
	streamDone := make(chan error, 1)
	go func() {
		streamDone <- c.Stream(streamCtx, flowapi.StreamOptions{Backlog: -1}, func(ev flowapi.StreamEvent) {
			if ev.Record != nil {
				flows <- ev.Record
			}
		})
	}()

	refusedPath := "/api/v1/namespaces/" + testNS + "/secrets"
	allowedPath := "/api/v1/namespaces/" + testNS + "/configmaps"
	if ex := do(t, r.client(nil), r.base, request{method: "GET", path: refusedPath, user: "alice"}); ex.status != 403 {
		t.Fatalf("alice listing secrets: %d, want RBAC's 403", ex.status)
	}
	if ex := do(t, r.client(nil), r.base, request{method: "GET", path: allowedPath, user: "admin"}); ex.status != 200 {
		t.Fatalf("admin listing configmaps: %d, want 200", ex.status)
	}
	byPath := map[string]*record.Record{}
	var order []string
	for len(order) < 2 {
		select {
		case rec := <-flows:
			if rec.ID == "" {
				t.Fatalf("a streamed flow without an id: %+v", rec)
			}
			byPath[rec.Request.Path] = rec
			order = append(order, rec.ID)
		case <-ctx.Done():
			t.Fatalf("the stream delivered %d of 2 flows", len(order))
		}
	}
	stopStream()
	<-streamDone
	refused, allowed := byPath[refusedPath], byPath[allowedPath]
	if refused == nil || allowed == nil {
		t.Fatalf("streamed flows %v, want %s and %s", byPath, refusedPath, allowedPath)
	}
	if refused.Actual.Status != 403 || refused.Predicted.Status != 403 || refused.Predicted.Stage != record.StageAuthorization {
		t.Errorf("refused flow: predicted %+v, actual %d", refused.Predicted, refused.Actual.Status)
	}

	// List with a filter: exactly the refused one.
	got, err := c.List(ctx, "~c 403", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != refused.ID {
		t.Errorf("List(~c 403) = %d flows %v, want only %s", len(got), got, refused.ID)
	}
	if all, err := c.List(ctx, "", 0); err != nil || len(all) != 2 {
		t.Errorf("List() = %d flows, %v; want 2", len(all), err)
	}
	// A bad filter: 400 naming the position.
	if _, err := c.List(ctx, "~c 4zz", 0); err == nil || !strings.Contains(err.Error(), "400") || !strings.Contains(err.Error(), "at position 4") {
		t.Errorf("bad filter: %v", err)
	}

	// Get by id.
	one, err := c.Get(ctx, allowed.ID)
	if err != nil || one.ID != allowed.ID || one.Request.User != "admin" || one.Actual.Status != 200 {
		t.Errorf("Get(%s) = %+v, %v", allowed.ID, one, err)
	}
	if _, err := c.Get(ctx, "no-such-flow"); err == nil || !strings.Contains(err.Error(), `"no-such-flow"`) {
		t.Errorf("Get(unknown): %v, want a 404 naming the id", err)
	}

	// The raw stream: ids on the wire, resumption by Last-Event-ID.
	ids := rawStreamIDs(t, k.apiURL+flowapi.PathStream, "", 2)
	if ids[0] != order[0] || ids[1] != order[1] {
		t.Errorf("stream ids %v, want %v", ids, order)
	}
	if resumed := rawStreamIDs(t, k.apiURL+flowapi.PathStream, order[0], 1); resumed[0] != order[1] {
		t.Errorf("resumed after %s: %v, want %s", order[0], resumed, order[1])
	}

	// Re-run the refused flow: the same verdict, now, with nothing sent
	// upstream; the original answer is copied.
	again, err := c.Replay(ctx, refused.ID)
	if err != nil {
		t.Fatal(err)
	}
	if again.ID == refused.ID || again.RerunOf != refused.ID {
		t.Errorf("re-run id %s rerunOf %s, want a new id re-running %s", again.ID, again.RerunOf, refused.ID)
	}
	if again.Predicted.Status != refused.Predicted.Status || again.Predicted.Stage != refused.Predicted.Stage ||
		again.Predicted.Reason != refused.Predicted.Reason || again.Predicted.Message != refused.Predicted.Message {
		t.Errorf("re-run predicted %+v, the flow %+v", again.Predicted, refused.Predicted)
	}
	if again.Actual.AuditID != refused.Actual.AuditID || again.Actual.Status != 403 {
		t.Errorf("re-run actual %+v: want the flow's, copied", again.Actual)
	}
	if again.Start.Before(refused.Start) {
		t.Errorf("re-run started %v, before the flow %v", again.Start, refused.Start)
	}
	// The re-run is not a proxied request: it is not in the buffer.
	if got, err := c.List(ctx, "~c 403", 0); err != nil || len(got) != 1 || got[0].ID != refused.ID {
		t.Errorf("after the re-run, List(~c 403) = %v, %v", got, err)
	}
	if again, err := c.Replay(ctx, allowed.ID); err != nil || again.Predicted.Status != 200 || again.Predicted.Stage != "" {
		t.Errorf("re-running the allowed flow: %+v, %v", again, err)
	}

	// --log-flows: one line per flow.
	if !strings.Contains(log.String(), `msg=flow id=`+refused.ID+` method=GET path=`+refusedPath+` user=alice predicted=403@authorization actual=403 agreement=agree`) {
		t.Errorf("no --log-flows line for %s in:\n%s", refused.ID, log.String())
	}
}

// rawStreamIDs reads the first n flow event ids of the stream, resuming
// after lastEventID when given.
func rawStreamIDs(t *testing.T, u, lastEventID string, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream Content-Type %q", resp.Header.Get("Content-Type"))
	}
	var ids []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 16<<20)
	var id, event string
	for len(ids) < n && sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "id: "):
			id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: ") && event == "flow":
			var rec record.Record
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &rec); err != nil || rec.ID != id {
				t.Fatalf("flow event id %q, data %.200s: %v", id, line, err)
			}
			ids = append(ids, id)
		}
	}
	if len(ids) < n {
		t.Fatalf("the stream ended after %v: %v", ids, sc.Err())
	}
	return ids
}

// TestFlowAPIRefusesOpenNonLoopback: records name users, paths and
// explanations, so kproxy will not serve them off loopback without TLS
// and client authentication, and says which flags to give.
func TestFlowAPIRefusesOpenNonLoopback(t *testing.T) {
	_, err := serve.New(context.Background(), &serve.Options{Listen: "127.0.0.1:0", Mode: "reverse",
		Upstream: cluster.URL, APIListen: "0.0.0.0:0"})
	for _, flag := range []string{"--api-listen=0.0.0.0:0", "--api-tls-cert-file", "--api-tls-private-key-file", "--api-client-ca-file", "--api-token-file"} {
		if err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("error %v, want it to name %s", err, flag)
		}
	}
}
