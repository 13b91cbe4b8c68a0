package flowapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

func TestClientListGetReplay(t *testing.T) {
	b := NewBuffer(4)
	writeN(b, 1, 5)
	srv := serveAPI(t, b, HandlerOptions{Replay: fakeReplayer{}})
	c, err := NewClient(strings.TrimPrefix(srv.URL, "http://"), ClientOptions{}) // host:port means http
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	got, err := c.List(ctx, "~u bob", 1)
	if err != nil || ids(got) != "r00005" {
		t.Errorf("List = %s, %v", ids(got), err)
	}
	r, err := c.Get(ctx, "r00004")
	if err != nil || r.ID != "r00004" || r.Actual.Status != 200 {
		t.Errorf("Get = %+v, %v", r, err)
	}
	_, err = c.Get(ctx, "r00001")
	var apiErr *APIError
	if !errors.As(err, &apiErr) || !apiErr.NotFound() || !strings.Contains(err.Error(), "evicted") {
		t.Errorf("Get(evicted) error %v, want a NotFound naming eviction", err)
	}
	r, err = c.Replay(ctx, "r00002")
	if err != nil || r.RerunOf != "r00002" {
		t.Errorf("Replay = %+v, %v", r, err)
	}
}

func TestClientErrorsNameTheFix(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	for _, tc := range []struct {
		name, url string
		opts      ClientOptions
		want      string
	}{
		{"bad URL", "ftp://x", ClientOptions{}, "want http://HOST:PORT or https://HOST:PORT"},
		{"CA over http", "http://127.0.0.1:1", ClientOptions{CAFile: "ca.crt"}, "needs an https:// flow API address"},
		{"half a certificate", "https://127.0.0.1:1", ClientOptions{CertFile: "c.crt"}, "both its certificate file and its key file"},
		{"nothing listening", "http://" + addr, ClientOptions{}, "cannot reach the kproxy flow API at http://" + addr + ": "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewClient(tc.url, tc.opts)
			if err == nil {
				_, err = c.List(context.Background(), "", 0)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if tc.name == "nothing listening" && !strings.Contains(err.Error(), "--api-listen") {
				t.Errorf("error %v does not say how to start the API", err)
			}
		})
	}
	// The kproxy proxy port instead of the API port: not a Status.
	other := httptest.NewServer(http.NotFoundHandler())
	defer other.Close()
	c, _ := NewClient(other.URL, ClientOptions{})
	if _, err := c.List(context.Background(), "", 0); err == nil || !strings.Contains(err.Error(), "not its --listen") {
		t.Errorf("error %v, want a hint at the wrong port", err)
	}
}

// TestClientReconnects drops the client's connection mid-stream: the
// client reconnects with backoff, resumes after the last record it got
// (Last-Event-ID) and sees every record once.
func TestClientReconnects(t *testing.T) {
	b := NewBuffer(100)
	writeN(b, 1, 3)
	var mu sync.Mutex
	var lastEventIDs []string
	api := NewHandler(b, HandlerOptions{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		lastEventIDs = append(lastEventIDs, r.Header.Get("Last-Event-ID"))
		mu.Unlock()
		api.ServeHTTP(w, r)
	}))
	defer srv.Close()

	var slept []time.Duration
	bo := wait.Backoff{Duration: time.Second, Factor: 2, Steps: 1 << 30, Cap: 5 * time.Second}
	c, err := NewClient(srv.URL, ClientOptions{Backoff: &bo, Sleep: func(ctx context.Context, d time.Duration) error {
		slept = append(slept, d)
		if len(slept) == 2 {
			// While the client is away, more records arrive.
			writeN(b, 4, 5)
		}
		return ctx.Err()
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	var got, statuses []string
	err = c.Stream(ctx, StreamOptions{Backlog: -1}, func(ev StreamEvent) {
		switch {
		case ev.Record != nil:
			got = append(got, ev.Record.ID)
			if ev.Record.ID == "r00003" && len(slept) == 0 {
				// Drop the connection after the backlog: the client is
				// told, and reconnects.
				srv.CloseClientConnections()
			}
			if ev.Record.ID == "r00005" {
				cancel()
			}
		case ev.Missed != 0:
			got = append(got, fmt.Sprintf("missed:%d", ev.Missed))
		default:
			statuses = append(statuses, ev.Status)
			if len(statuses) == 3 && len(slept) == 1 {
				// The second connection: the server ends it at once.
				srv.CloseClientConnections()
			}
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Stream returned %v, want context.Canceled", err)
	}
	if want := []string{"r00001", "r00002", "r00003", "r00004", "r00005"}; !slices.Equal(got, want) {
		t.Errorf("records %v, want %v (each once)", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lastEventIDs) < 2 || lastEventIDs[0] != "" || lastEventIDs[len(lastEventIDs)-1] != "r00003" {
		t.Errorf("Last-Event-ID per connection %q, want none first, then r00003", lastEventIDs)
	}
	if len(statuses) < 3 || !strings.HasPrefix(statuses[0], "connected to "+srv.URL+PathStream) ||
		!strings.HasPrefix(statuses[1], "connection lost: ") || !strings.HasSuffix(statuses[1], "; reconnecting in 1s") {
		t.Errorf("statuses %q", statuses)
	}
	// The backoff grows while connections deliver nothing (the second
	// one), and starts over once one does.
	if want := []time.Duration{time.Second, 2 * time.Second}; !slices.Equal(slept, want) {
		t.Errorf("slept %v, want %v", slept, want)
	}
}

func TestClientBacksOffWhileDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var slept []time.Duration
	bo := wait.Backoff{Duration: time.Second, Factor: 2, Steps: 1 << 30, Cap: 5 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	c, _ := NewClient(addr, ClientOptions{Backoff: &bo, Sleep: func(ctx context.Context, d time.Duration) error {
		slept = append(slept, d)
		if len(slept) == 6 {
			cancel()
		}
		return ctx.Err()
	}})
	var statuses []string
	err = c.Stream(ctx, StreamOptions{}, func(ev StreamEvent) { statuses = append(statuses, ev.Status) })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Stream returned %v", err)
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second, 5 * time.Second}
	if !slices.Equal(slept, want) {
		t.Errorf("slept %v, want %v", slept, want)
	}
	if !strings.Contains(statuses[0], "cannot reach the kproxy flow API") || !strings.HasSuffix(statuses[0], "reconnecting in 1s") {
		t.Errorf("status %q", statuses[0])
	}
}

func TestReadSSE(t *testing.T) {
	in := ": comment\n\nid: a\nevent: flow\ndata: {\"x\":\ndata: 1}\n\nevent: missed\ndata: {\"missed\":2}\n\ndata: plain\n\nid: b\nevent: flow\ndata:{}\n\n"
	var got []string
	err := readSSE(strings.NewReader(in), func(id, event string, data []byte) error {
		got = append(got, id+"|"+event+"|"+string(data))
		return nil
	})
	want := []string{"a|flow|{\"x\":\n1}", "a|missed|{\"missed\":2}", "a|message|plain", "b|flow|{}"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("got %q, %v; want %q", got, err, want)
	}
}
