package flowapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kproxy/kproxy/internal/record"
)

// guard bounds every wait in these tests: reaching it is a failure (a
// hang), never how a test decides what happened.
const guard = 20 * time.Second

func serveAPI(t *testing.T, b *Buffer, opts HandlerOptions) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(NewHandler(b, opts))
	t.Cleanup(srv.Close)
	return srv
}

func getJSON(t *testing.T, u string, out any) int {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q", u, ct)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("%s: %v", u, err)
	}
	return resp.StatusCode
}

func TestListEndpoint(t *testing.T) {
	b := NewBuffer(10)
	writeN(b, 1, 15)
	srv := serveAPI(t, b, HandlerOptions{})
	for _, tc := range []struct {
		name, query string
		code        int
		want        string // ids, or a substring of the error message
	}{
		{"default", "", 200, "r00006,r00007,r00008,r00009,r00010,r00011,r00012,r00013,r00014,r00015"},
		{"limit", "limit=2", 200, "r00014,r00015"},
		{"limit above capacity is capacity", "limit=99999", 200, "r00006,r00007,r00008,r00009,r00010,r00011,r00012,r00013,r00014,r00015"},
		{"filter by status", "filter=" + url.QueryEscape("~c 403"), 200, "r00007,r00009,r00011,r00013,r00015"},
		{"filter and limit", "filter=" + url.QueryEscape("~u alice") + "&limit=1", 200, "r00014"},
		{"bad limit", "limit=-1", 400, `limit="-1": want a positive number of flows (at most 10`},
		{"bad filter", "filter=" + url.QueryEscape("~c"), 400, "invalid filter: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var raw json.RawMessage
			code := getJSON(t, srv.URL+PathFlows+"?"+tc.query, &raw)
			if code != tc.code {
				t.Fatalf("status %d, want %d: %s", code, tc.code, raw)
			}
			if code != 200 {
				var st Status
				_ = json.Unmarshal(raw, &st)
				if st.Kind != "Status" || st.Code != code || !strings.Contains(st.Message, tc.want) {
					t.Fatalf("error %s, want a Status containing %q", raw, tc.want)
				}
				return
			}
			var l FlowList
			if err := json.Unmarshal(raw, &l); err != nil {
				t.Fatal(err)
			}
			if l.APIVersion != APIVersion || l.Kind != "FlowList" || l.Dropped != 5 || l.Capacity != 10 {
				t.Errorf("list header %+v", l)
			}
			if got := ids(l.Items); got != tc.want {
				t.Errorf("items %s, want %s", got, tc.want)
			}
		})
	}
}

func TestBadFilterNamesThePosition(t *testing.T) {
	srv := serveAPI(t, NewBuffer(4), HandlerOptions{})
	for _, path := range []string{PathFlows, PathStream} {
		var st Status
		expr := "~u alice & ~c 4zz"
		if code := getJSON(t, srv.URL+path+"?filter="+url.QueryEscape(expr), &st); code != 400 {
			t.Fatalf("%s: status %d, want 400", path, code)
		}
		if st.Details == nil || st.Details.Field != "filter" || st.Details.Position == nil {
			t.Fatalf("%s: details %+v, want the filter's position", path, st.Details)
		}
		pos := *st.Details.Position
		if !strings.Contains(st.Message, fmt.Sprintf("at position %d", pos+1)) || !strings.HasPrefix(expr[pos:], "4zz") {
			t.Errorf("%s: message %q, position %d: want the error at 4zz", path, st.Message, pos)
		}
		if !strings.Contains(st.Details.Caret, "^") {
			t.Errorf("%s: caret %q", path, st.Details.Caret)
		}
	}
	// The client hands the server's message on.
	c, err := NewClient(srv.URL, ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.List(context.Background(), "~c 4zz", 0)
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.Code != 400 || !strings.Contains(err.Error(), "at position 4") {
		t.Errorf("client error %v, want the 400 with the position", err)
	}
	err = c.Stream(context.Background(), StreamOptions{Filter: "~c 4zz"}, func(StreamEvent) {})
	if !errors.As(err, &apiErr) || apiErr.Code != 400 {
		t.Errorf("Stream with a bad filter: %v, want the 400 at once", err)
	}
}

type fakeReplayer struct{}

type notRetained string

func (e notRetained) Error() string  { return string(e) }
func (e notRetained) NotFound() bool { return true }

func (fakeReplayer) Replay(_ context.Context, id string) (*record.Record, error) {
	switch id {
	case "r00002":
		r := *rec(2)
		r.ID, r.RerunOf = "again", id
		return &r, nil
	case "boom":
		return nil, errors.New("the replay broke")
	}
	return nil, notRetained("flow " + id + " is older than the newest 1000 kproxy keeps for re-runs")
}

func TestGetAndReplay(t *testing.T) {
	b := NewBuffer(2)
	writeN(b, 1, 3)
	with := serveAPI(t, b, HandlerOptions{Replay: fakeReplayer{}})
	without := serveAPI(t, b, HandlerOptions{})
	for _, tc := range []struct {
		name, method, url string
		code              int
		want              string
	}{
		{"get", "GET", with.URL + PathFlows + "/r00003", 200, `"id":"r00003"`},
		{"get evicted", "GET", with.URL + PathFlows + "/r00001", 404, `flow \"r00001\" is not in kproxy's buffer: it keeps the newest 2 flows (--api-buffer)`},
		{"replay", "POST", with.URL + PathFlows + "/r00002/replay", 200, `"rerunOf":"r00002"`},
		{"replay too old", "POST", with.URL + PathFlows + "/r00001/replay", 404, "older than the newest 1000"},
		{"replay fails", "POST", with.URL + PathFlows + "/boom/replay", 500, `re-running flow \"boom\" failed: the replay broke`},
		{"no replayer", "POST", without.URL + PathFlows + "/r00002/replay", 501, "cannot re-run flows"},
		{"replay is a POST", "GET", with.URL + PathFlows + "/r00002/replay", 404, "no such endpoint"},
		{"unknown endpoint", "GET", with.URL + "/api/v2/x", 404, "GET /api/v1/flows/stream"},
	} {
		t.Run(tc.name, func(t *testing.T) { expectAnswer(t, tc.method, tc.url, "", tc.code, tc.want) })
	}
}

// expectAnswer sends a request and checks the status and a piece of the
// body of the answer.
func expectAnswer(t *testing.T, method, url, body string, code int, want string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != code || !strings.Contains(string(got), want) {
		t.Errorf("%d %s, want %d with %q", resp.StatusCode, got, code, want)
	}
}

func TestAuthentication(t *testing.T) {
	b := NewBuffer(2)
	writeN(b, 1, 1)
	srv := serveAPI(t, b, HandlerOptions{Token: "s3cret"})
	for _, tc := range []struct {
		name, auth string
		code       int
	}{
		{"no token", "", 401},
		{"wrong token", "Bearer s3cre", 401},
		{"not bearer", "Basic s3cret", 401},
		{"token", "Bearer s3cret", 200},
		{"scheme is case-insensitive", "bearer s3cret", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", srv.URL+PathFlows, nil)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.code {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.code)
			}
			if tc.code == 401 && !strings.Contains(string(body), "--api-token-file") {
				t.Errorf("401 body %s does not say which token", body)
			}
		})
	}
	c, _ := NewClient(srv.URL, ClientOptions{Token: "wrong"})
	if _, err := c.List(context.Background(), "", 0); err == nil || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "--api-token-file") {
		t.Errorf("client error %v, want a 401 naming the token file", err)
	}
	c, _ = NewClient(srv.URL, ClientOptions{Token: "s3cret"})
	if got, err := c.List(context.Background(), "", 0); err != nil || ids(got) != "r00001" {
		t.Errorf("List with the token: %v, %v", ids(got), err)
	}
}

// sse is one parsed event.
type sse struct{ id, event, data string }

// openStream reads a stream's events into a channel until the test ends.
func openStream(t *testing.T, u string, header http.Header) <-chan sse {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	ch := make(chan sse, 1024)
	go func() {
		defer resp.Body.Close()
		defer close(ch)
		_ = readSSE(resp.Body, func(id, event string, data []byte) error {
			if event == "missed" {
				id = "" // an SSE id sticks; a missed event has none of its own
			}
			ch <- sse{id, event, string(data)}
			return nil
		})
	}()
	return ch
}

// next returns the stream's next n events, as "id" for flows (checking
// that the data is that record) and "missed:N" for gaps.
func next(t *testing.T, ch <-chan sse, n int) []string {
	t.Helper()
	var out []string
	for len(out) < n {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("stream ended after %v", out)
			}
			switch ev.event {
			case "flow":
				var r record.Record
				if err := json.Unmarshal([]byte(ev.data), &r); err != nil || r.ID != ev.id {
					t.Fatalf("flow event id %q with data %s (%v)", ev.id, ev.data, err)
				}
				out = append(out, ev.id)
			case "missed":
				var m MissedEvent
				if err := json.Unmarshal([]byte(ev.data), &m); err != nil {
					t.Fatalf("missed event %q: %v", ev.data, err)
				}
				out = append(out, fmt.Sprintf("missed:%d", m.Missed))
			default:
				t.Fatalf("unexpected event %+v", ev)
			}
		case <-time.After(guard):
			t.Fatalf("no event within %s after %v", guard, out)
		}
	}
	return out
}

func TestStream(t *testing.T) {
	for _, tc := range []struct {
		name   string
		query  string
		header http.Header
		want   []string // the 6 records are already written; r00007 and r00008 come later
	}{
		{"backlog then live", "", nil, []string{"r00003", "r00004", "r00005", "r00006", "r00007", "r00008"}},
		{"limited backlog", "?backlog=1", nil, []string{"r00006", "r00007", "r00008"}},
		{"live only", "?backlog=0", nil, []string{"r00007", "r00008"}},
		{"filtered", "?filter=" + url.QueryEscape("~c 403"), nil, []string{"r00003", "r00005", "r00007"}},
		{"resume by Last-Event-ID", "", http.Header{"Last-Event-Id": {"r00005"}}, []string{"r00006", "r00007", "r00008"}},
		{"resume by query, for curl", "?lastEventID=r00004", nil, []string{"r00005", "r00006", "r00007", "r00008"}},
		{"resume after an evicted id", "", http.Header{"Last-Event-Id": {"r00001"}}, []string{"missed:1", "r00003", "r00004", "r00005", "r00006", "r00007", "r00008"}},
		{"resume after an id never seen", "", http.Header{"Last-Event-Id": {"x"}}, []string{"missed:2", "r00003", "r00004", "r00005", "r00006", "r00007", "r00008"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBuffer(4)
			writeN(b, 1, 6)
			srv := serveAPI(t, b, HandlerOptions{})
			ch := openStream(t, srv.URL+PathStream+tc.query, tc.header)
			// Read what was buffered before writing more: the ring holds 4,
			// so writing first could push out what the reader has yet to
			// read (and rightly count it missed).
			live := 0
			for _, w := range tc.want {
				if w == "r00007" || w == "r00008" {
					live++
				}
			}
			got := next(t, ch, len(tc.want)-live)
			// The response has started, so the subscription exists: what
			// is written now is live.
			writeN(b, 7, 8)
			got = append(got, next(t, ch, live)...)
			if !slices.Equal(got, tc.want) {
				t.Errorf("events %v, want %v", got, tc.want)
			}
		})
	}
}

func TestStreamHeartbeat(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	srv := serveAPI(t, NewBuffer(4), HandlerOptions{Clock: clk, Heartbeat: 15 * time.Second})
	resp, err := http.Get(srv.URL + PathStream)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, _ := br.ReadString('\n')
	if line != ": kproxy flow stream\n" {
		t.Fatalf("first line %q", line)
	}
	// Wait (a condition, not a duration) for the handler's ticker.
	deadline := time.Now().Add(guard)
	for !clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("the stream never started its heartbeat ticker")
		}
		runtime.Gosched()
	}
	clk.Step(15 * time.Second)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if line == ": keepalive\n" {
			return
		}
	}
}

// TestStuckReaderDoesNotBlockWrite connects a stream client that never
// reads: the server's writes to it block once the socket buffers fill,
// yet 100,000 records are written without waiting and without growing
// memory, and when the client reads again it is told what it missed.
func TestStuckReaderDoesNotBlockWrite(t *testing.T) {
	const capacity, total = 64, 100_000
	b := NewBuffer(capacity)
	srv := serveAPI(t, b, HandlerOptions{})
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET %s?backlog=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", PathStream)
	br := bufio.NewReader(conn)
	for { // the headers and the first comment: subscribed
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, "kproxy flow stream") {
			break
		}
	}

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		for i := 1; i <= total; i++ {
			r := rec(i)
			r.Stages = []record.StageResult{{Name: record.StageAuthorization, Explanation: strings.Repeat("x", 512)}}
			b.Write(r)
		}
	}()
	select {
	case <-wrote:
	case <-time.After(guard):
		t.Fatal("Write blocked behind a reader that does not read")
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	// 100,000 records of ~1 KiB are ~100 MiB; the buffer keeps 64.
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 16<<20 {
		t.Errorf("heap grew by %d MiB writing %d records into a buffer of %d", grown>>20, total, capacity)
	}
	if b.Len() != capacity {
		t.Errorf("buffer holds %d records, want %d", b.Len(), capacity)
	}

	// Now read: what the socket held, then the gap, then the newest.
	missed := false
	for !missed {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended before a missed event: %v", err)
		}
		missed = strings.HasPrefix(line, "event: missed")
	}
	line, _ := br.ReadString('\n')
	var m MissedEvent
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &m); err != nil || m.Missed == 0 || m.Missed > total-capacity {
		t.Errorf("missed event data %q (%v)", line, err)
	}
}

// TestServerDropsAStuckClient: a client that reads nothing is
// dropped once a write takes longer than WriteTimeout.
func TestServerDropsAStuckClient(t *testing.T) {
	b := NewBuffer(8)
	handlerDone := make(chan struct{})
	h := NewHandler(b, HandlerOptions{WriteTimeout: 50 * time.Millisecond})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(handlerDone)
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", PathStream)
	big := strings.Repeat("x", 64<<10)
	go func() {
		for i := 1; ; i++ {
			select {
			case <-handlerDone:
				return
			default:
			}
			r := rec(i)
			r.Predicted.Message = big
			b.Write(r)
		}
	}()
	select {
	case <-handlerDone:
	case <-time.After(guard):
		t.Fatal("the handler kept a client that reads nothing")
	}
}

// TestLoopbackHostOnly: without client authentication the API answers
// requests for a loopback address or localhost only; a web page reaching
// it by DNS rebinding sends its own name (a probe read every flow and
// changed the replay filter so). With a token, any Host will do.
func TestLoopbackHostOnly(t *testing.T) {
	b := NewBuffer(8)
	b.Write(rec(1))
	open := NewHandler(b, HandlerOptions{})
	withToken := NewHandler(b, HandlerOptions{Token: "t"})
	for _, tc := range []struct {
		host  string
		token bool
		want  int
	}{
		{"127.0.0.1:8001", false, http.StatusOK},
		{"127.0.0.2", false, http.StatusOK},
		{"[::1]:8001", false, http.StatusOK},
		{"localhost:8001", false, http.StatusOK},
		{"LOCALHOST", false, http.StatusOK},
		{"attacker.example:8001", false, http.StatusForbidden},
		{"localhost.attacker.example", false, http.StatusForbidden},
		{"10.0.0.5:8001", false, http.StatusForbidden},
		{"localhost:8001.attacker.example", false, http.StatusForbidden},
		{"[::1]:evil", false, http.StatusForbidden},
		{"attacker.example:8001", true, http.StatusOK},
	} {
		req := httptest.NewRequest(http.MethodGet, PathFlows, nil)
		req.Host = tc.host
		h := open
		if tc.token {
			h = withToken
			req.Header.Set("Authorization", "Bearer t")
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != tc.want {
			t.Errorf("Host %q (token %v): %d, want %d: %s", tc.host, tc.token, w.Code, tc.want, w.Body)
		}
		if tc.want == http.StatusForbidden && !strings.Contains(w.Body.String(), "--api-token-file") {
			t.Errorf("Host %q: the refusal does not name the fix: %s", tc.host, w.Body)
		}
	}
}
