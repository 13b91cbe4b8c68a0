package source

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/flowapi"
	"github.com/kproxy/kproxy/internal/record"
)

// wait bounds every step of a test: a source that stops delivering fails
// the test instead of hanging it. No assertion depends on it.
const wait = 10 * time.Second

// line is a capture line for a record with that id.
func line(id string) string {
	return fmt.Sprintf(`{"id":%q,"start":"2026-12-01T08:10:54Z","request":{"method":"GET","path":"/api/v1/namespaces/default/pods/%s","verb":"get","resource":"pods","namespace":"default","name":%q},"predicted":{"status":200},"actual":{"status":200}}`+"\n", id, id, id)
}

func capture(ids ...string) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(line(id))
	}
	return b.String()
}

// harness runs a source and writes down what it delivers, one line per
// event, with the file's path written as F.
type harness struct {
	t      *testing.T
	path   string
	out    chan Event
	ticks  chan time.Time
	idle   chan struct{}
	errc   chan error
	cancel context.CancelFunc
	got    []string
}

func start(t *testing.T, src Source, path string) *harness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, path: path, out: make(chan Event), ticks: make(chan time.Time), idle: make(chan struct{}),
		errc: make(chan error, 1), cancel: cancel}
	if fs, ok := src.(*fileSource); ok {
		fs.ticks = h.ticks
		fs.idle = func() {
			select {
			case h.idle <- struct{}{}:
			case <-ctx.Done():
			}
		}
	}
	go func() { h.errc <- src.Run(ctx, h.out) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-h.errc:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(wait):
			t.Errorf("Run did not return after its context ended")
		}
	})
	return h
}

// describe renders an event as one transcript line.
func (h *harness) describe(ev Event) string {
	var parts []string
	if ev.Status != "" {
		st := ev.Status
		if h.path != "" {
			st = strings.ReplaceAll(st, h.path, "F")
		}
		parts = append(parts, "status: "+st)
	}
	if n := len(ev.Records); n > 10 {
		parts = append(parts, fmt.Sprintf("%d records %s..%s", n, ev.Records[0].ID, ev.Records[n-1].ID))
	} else if n > 0 {
		ids := make([]string, n)
		for i, r := range ev.Records {
			ids[i] = r.ID
		}
		parts = append(parts, "records "+strings.Join(ids, ","))
	}
	if ev.Skipped > 0 {
		parts = append(parts, fmt.Sprintf("skipped %d", ev.Skipped))
	}
	if ev.Missed > 0 {
		parts = append(parts, fmt.Sprintf("missed %d", ev.Missed))
	}
	if ev.Done {
		parts = append(parts, "done")
	}
	if len(parts) == 0 {
		return "(empty event)"
	}
	return strings.Join(parts, "; ")
}

// settle takes events until the source has said all it had to and waits
// for its next poll.
func (h *harness) settle() {
	h.t.Helper()
	for {
		select {
		case ev := <-h.out:
			h.got = append(h.got, h.describe(ev))
		case <-h.idle:
			return
		case err := <-h.errc:
			h.t.Fatalf("Run ended: %v", err)
		case <-time.After(wait):
			h.t.Fatalf("the source neither delivered nor polled; so far:\n%s", strings.Join(h.got, "\n"))
		}
	}
}

// poll makes the source look at its file once and takes what it says.
func (h *harness) poll() {
	h.t.Helper()
	select {
	case h.ticks <- time.Time{}:
	case <-time.After(wait):
		h.t.Fatal("the source does not poll")
	}
	h.settle()
}

// untilDone takes events until a Done event (a source that does not
// follow).
func (h *harness) untilDone() {
	h.t.Helper()
	for {
		select {
		case ev := <-h.out:
			h.got = append(h.got, h.describe(ev))
			if ev.Done {
				return
			}
		case err := <-h.errc:
			h.t.Fatalf("Run ended before Done: %v", err)
		case <-time.After(wait):
			h.t.Fatalf("no Done; so far:\n%s", strings.Join(h.got, "\n"))
		}
	}
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

func appendTo(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

func TestFile(t *testing.T) {
	many := make([]string, 2500)
	for i := range many {
		many[i] = fmt.Sprintf("r%04d", i)
	}
	cases := []struct {
		name    string
		initial *string // nil: no file at first
		follow  bool
		steps   func(t *testing.T, h *harness, path string)
		want    []string
	}{
		{
			name:    "a file read once arrives in batches",
			initial: ptr(capture(many...)),
			want: []string{
				"status: reading F",
				"1000 records r0000..r0999",
				"1000 records r1000..r1999",
				"500 records r2000..r2499; done",
			},
		},
		{
			name:    "unreadable lines are skipped and counted, blank lines ignored",
			initial: ptr(line("a") + "not json\n" + `{"kind":"NotARecord"}` + "\n\n" + `{"id":"b"` + "\n" + line("c")),
			want:    []string{"status: reading F", "records a,c; skipped 3; done"},
		},
		{
			name:    "a file read once keeps its last line even without a newline",
			initial: ptr(line("a") + strings.TrimSuffix(line("b"), "\n")),
			want:    []string{"status: reading F", "records a,b; done"},
		},
		{
			name:    "an empty file",
			initial: ptr(""),
			want:    []string{"status: reading F", "done"},
		},
		{
			name:    "following: appended lines, a partial line held back until its newline",
			initial: ptr(line("a")),
			follow:  true,
			steps: func(t *testing.T, h *harness, path string) {
				h.settle()
				appendTo(t, path, capture("b", "c"))
				h.poll()
				b := line("d")
				appendTo(t, path, b[:20])
				h.poll() // nothing: d is not finished
				appendTo(t, path, b[20:])
				h.poll()
				h.poll() // nothing new
			},
			want: []string{"status: reading F", "records a", "status: following F", "records b,c", "records d"},
		},
		{
			name:    "following: a truncated file is read from the start",
			initial: ptr(capture("a", "b", "c")),
			follow:  true,
			steps: func(t *testing.T, h *harness, path string) {
				h.settle()
				write(t, path, line("d"))
				h.poll()
				appendTo(t, path, line("e"))
				h.poll()
			},
			want: []string{"status: reading F", "records a,b,c", "status: following F",
				"status: F was truncated; reading it from the start", "records d", "records e"},
		},
		{
			name:    "following: a rotated file is finished, then the new one read from the start",
			initial: ptr(line("a")),
			follow:  true,
			steps: func(t *testing.T, h *harness, path string) {
				h.settle()
				// The writer renames the file, writes its last record to
				// it, then starts a new one (logrotate's create mode).
				if err := os.Rename(path, path+".1"); err != nil {
					t.Fatal(err)
				}
				appendTo(t, path+".1", line("b"))
				write(t, path, capture("c", "d"))
				h.poll()
				appendTo(t, path, line("e"))
				h.poll()
			},
			want: []string{"status: reading F", "records a", "status: following F",
				"records b", "status: F was replaced (rotated); reading the new file", "records c,d", "records e"},
		},
		{
			name:    "following: a removed file that comes back is read from the start",
			initial: ptr(line("a")),
			follow:  true,
			steps: func(t *testing.T, h *harness, path string) {
				h.settle()
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
				h.poll()
				h.poll() // said once
				write(t, path, line("b"))
				h.poll()
			},
			want: []string{"status: reading F", "records a", "status: following F",
				"status: F was removed; waiting for it to be created again",
				"status: F was replaced (rotated); reading the new file", "records b"},
		},
		{
			name:   "following: a file that does not exist yet is waited for",
			follow: true,
			steps: func(t *testing.T, h *harness, path string) {
				h.settle()
				h.poll()
				write(t, path, capture("a", "b"))
				h.poll()
				appendTo(t, path, line("c"))
				h.poll()
			},
			want: []string{"status: waiting for F to be created", "status: reading F", "records a,b", "status: following F", "records c"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "capture.jsonl")
			if tc.initial != nil {
				write(t, path, *tc.initial)
			}
			src := File(path, tc.follow)
			if src.Name() != path {
				t.Errorf("Name() = %q, want %q", src.Name(), path)
			}
			h := start(t, src, path)
			if tc.follow {
				tc.steps(t, h, path)
			} else {
				h.untilDone()
			}
			if got, want := strings.Join(h.got, "\n"), strings.Join(tc.want, "\n"); got != want {
				t.Errorf("events:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

func ptr(s string) *string { return &s }

func TestFileErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, path, want string
	}{
		{"a missing file says how to get one", filepath.Join(dir, "nope.jsonl"), "does not exist: check the path (kproxy serve --capture FILE writes it), or follow it"},
		{"a directory", dir, "is a directory: give a capture file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := File(tc.path, false).Run(context.Background(), make(chan Event, 10))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestStdin(t *testing.T) {
	if got := File("-", false).Name(); got != "stdin" {
		t.Errorf(`File("-").Name() = %q, want "stdin"`, got)
	}
	for _, tc := range []struct {
		name, input string
		want        []string
	}{
		{"records, a bad line, and a last line without its newline", line("a") + "{oops\n" + strings.TrimSuffix(line("b"), "\n"),
			[]string{"status: reading stdin", "records a,b; skipped 1; done"}},
		{"nothing", "", []string{"status: reading stdin", "done"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, Reader("stdin", strings.NewReader(tc.input)), "")
			h.untilDone()
			// Where a reader's batches end depends on how fast it reads
			// (it delivers whenever it has caught up): merge them.
			h.got = mergeBatches(h.got)
			if got, want := strings.Join(h.got, "\n"), strings.Join(tc.want, "\n"); got != want {
				t.Errorf("events:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// mergeBatches joins consecutive record deliveries of a transcript,
// "records a; skipped 1" and "records b; done" into "records a,b;
// skipped 1; done".
func mergeBatches(got []string) []string {
	var out []string
	var ids []string
	skipped, done := 0, false
	flush := func() {
		if len(ids) == 0 && skipped == 0 && !done {
			return
		}
		var parts []string
		if len(ids) > 0 {
			parts = append(parts, "records "+strings.Join(ids, ","))
		}
		if skipped > 0 {
			parts = append(parts, fmt.Sprintf("skipped %d", skipped))
		}
		if done {
			parts = append(parts, "done")
		}
		out = append(out, strings.Join(parts, "; "))
		ids, skipped, done = nil, 0, false
	}
	for _, g := range got {
		if strings.HasPrefix(g, "status: ") {
			flush()
			out = append(out, g)
			continue
		}
		for _, part := range strings.Split(g, "; ") {
			switch {
			case strings.HasPrefix(part, "records "):
				ids = append(ids, strings.Split(strings.TrimPrefix(part, "records "), ",")...)
			case strings.HasPrefix(part, "skipped "):
				var n int
				fmt.Sscan(strings.TrimPrefix(part, "skipped "), &n)
				skipped += n
			case part == "done":
				done = true
			}
		}
	}
	flush()
	return out
}

// TestReaderDeliversWhenCaughtUp: a pipe's records arrive as they are
// written, not when a batch is full.
func TestReaderDeliversWhenCaughtUp(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	h := start(t, Reader("stdin", pr), "")
	next := func() string {
		t.Helper()
		select {
		case ev := <-h.out:
			return h.describe(ev)
		case <-time.After(wait):
			t.Fatal("no event")
		}
		return ""
	}
	if got := next(); got != "status: reading stdin" {
		t.Fatalf("first event %q", got)
	}
	for _, id := range []string{"a", "b"} {
		if _, err := pw.WriteString(line(id)); err != nil {
			t.Fatal(err)
		}
		if got := next(); got != "records "+id {
			t.Fatalf("got %q, want records %s", got, id)
		}
	}
	pw.Close()
	if got := next(); got != "done" {
		t.Fatalf("got %q, want done", got)
	}
}

func TestLinesDropsOverlongLines(t *testing.T) {
	l := lines{max: 8}
	var got []string
	collect := func(b []byte) error { got = append(got, string(b)); return nil }
	over := 0
	for _, chunk := range []string{"short\nthis one is ", "far too long\nok", "\n", "0123456789", "01234\nlast"} {
		n, err := l.feed([]byte(chunk), collect)
		if err != nil {
			t.Fatal(err)
		}
		over += n
	}
	rest, overlong := l.rest()
	if strings.Join(got, "|") != "short|ok" || over != 2 || string(rest) != "last" || overlong {
		t.Errorf("lines %q, %d overlong, rest %q (%v)", got, over, rest, overlong)
	}
}

func TestAPI(t *testing.T) {
	buf := flowapi.NewBuffer(100)
	for _, id := range []string{"a", "b"} {
		buf.Write(&record.Record{ID: id, Request: record.Request{User: "alice"}})
	}
	buf.Write(&record.Record{ID: "c", Request: record.Request{User: "bob"}})
	srv := httptest.NewServer(flowapi.NewHandler(buf, flowapi.HandlerOptions{}))
	t.Cleanup(srv.Close)
	c, err := flowapi.NewClient(srv.URL, flowapi.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	src := Named(srv.URL, API(c, "~u alice"))
	if src.Name() != srv.URL {
		t.Errorf("Name() = %q", src.Name())
	}
	h := start(t, src, "")
	var ids []string
	connected := false
	for len(ids) < 4 {
		select {
		case ev := <-h.out:
			if strings.HasPrefix(ev.Status, "connected to "+srv.URL) {
				connected = true
			}
			for _, r := range ev.Records {
				ids = append(ids, r.ID)
			}
			if len(ids) == 2 {
				// The backlog is in; now a live one.
				buf.Write(&record.Record{ID: "d", Request: record.Request{User: "alice"}})
				buf.Write(&record.Record{ID: "e", Request: record.Request{User: "alice"}})
			}
		case err := <-h.errc:
			t.Fatalf("Run ended: %v", err)
		case <-time.After(wait):
			t.Fatalf("records so far: %v", ids)
		}
	}
	if !connected || strings.Join(ids, ",") != "a,b,d,e" {
		t.Errorf("connected %v, records %v; want the backlog a,b then d,e (c is bob's)", connected, ids)
	}
}

func TestAPIRefusedFilter(t *testing.T) {
	srv := httptest.NewServer(flowapi.NewHandler(flowapi.NewBuffer(10), flowapi.HandlerOptions{}))
	t.Cleanup(srv.Close)
	c, err := flowapi.NewClient(srv.URL, flowapi.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	err = API(c, "~c").Run(ctx, make(chan Event, 10))
	var apiErr *flowapi.APIError
	if !errors.As(err, &apiErr) || apiErr.Code != 400 {
		t.Errorf("Run: %v, want the API's 400", err)
	}
}

// TestFileGzip: a capture file rotated with --capture-compress is read as
// it is, with or without follow (whole, it no longer grows); one cut short
// says so and how to recover what is there.
func TestFileGzip(t *testing.T) {
	dir := t.TempDir()
	var plain bytes.Buffer
	for i := range 3 {
		plain.WriteString(recordJSON(t, &record.Record{ID: fmt.Sprint("gz-", i)}) + "\n")
	}
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	zw.Write(plain.Bytes())
	zw.Close()
	path := filepath.Join(dir, "capture-2026-12-02T09-00-00.000.jsonl.gz")
	if err := os.WriteFile(path, zipped.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	want := expected(t, plain.Bytes())
	for _, follow := range []bool{false, true} {
		if got := collect(t, File(path, follow)); !reflect.DeepEqual(got, want) {
			t.Errorf("follow=%v: delivered %+v, want %+v", follow, got, want)
		}
	}
	short := filepath.Join(dir, "short.jsonl.gz")
	if err := os.WriteFile(short, zipped.Bytes()[:5], 0o600); err != nil {
		t.Fatal(err)
	}
	err := File(short, false).Run(context.Background(), make(chan Event, 16))
	if err == nil || !strings.Contains(err.Error(), "gunzip -c") {
		t.Errorf("a gzip file cut short: %v, want an error saying how to read what is there", err)
	}
}
