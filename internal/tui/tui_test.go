package tui

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"
	"github.com/google/go-cmp/cmp"
	"github.com/muesli/termenv"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/source"
)

var update = flag.Bool("update", false, "rewrite the golden screens under testdata/tui")

// The golden screens are the real demo's capture (testdata/tui/demo.jsonl,
// written by `kproxy demo` against a real apiserver), shown at 120x40 in
// the ASCII colour profile.
const goldenDir = "../../testdata/tui"

func demoRecords(t testing.TB) []*record.Record {
	t.Helper()
	f, err := os.Open(filepath.Join(goldenDir, "demo.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var recs []*record.Record
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r record.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, &r)
	}
	return recs
}

type replayerFunc func(id string) (*record.Record, error)

func newTestModel(t testing.TB, opts Options) *Model {
	t.Helper()
	opts.Renderer = lipgloss.NewRenderer(io.Discard, termenv.WithProfile(termenv.Ascii))
	opts.Location = time.UTC
	if opts.Clock == nil {
		opts.Clock = clocktesting.NewFakePassiveClock(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	}
	if opts.Source == nil {
		opts.Source = source.Named("demo.jsonl", nil)
	}
	m := New(opts, nil)
	m.Update(tea.WindowSizeMsg{Width: 120, Height: 40})
	return m
}

// send delivers msg and runs the commands it returns until none is left
// (a filter, an export), as the program would.
func send(m *Model, msg tea.Msg) {
	queue := []tea.Msg{msg}
	for len(queue) > 0 {
		msg, queue = queue[0], queue[1:]
		_, cmd := m.Update(msg)
		for cmd != nil {
			out := cmd()
			cmd = nil
			switch out := out.(type) {
			case nil:
			case tea.BatchMsg:
				for _, c := range out {
					if c != nil {
						queue = append(queue, c())
					}
				}
			case tea.QuitMsg:
			default:
				if _, blink := out.(interface{ Blink() }); !blink {
					queue = append(queue, out)
				}
			}
		}
	}
}

func keys(m *Model, ks ...string) {
	for _, k := range ks {
		var msg tea.KeyMsg
		switch k {
		case "enter":
			msg = tea.KeyMsg{Type: tea.KeyEnter}
		case "esc":
			msg = tea.KeyMsg{Type: tea.KeyEsc}
		case "tab":
			msg = tea.KeyMsg{Type: tea.KeyTab}
		default:
			msg = tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune(k)}
		}
		send(m, msg)
	}
}

func typeText(m *Model, s string) {
	for _, r := range s {
		send(m, tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune{r}})
	}
}

var ansiSeq = regexp.MustCompile("\x1b\\[[0-9;?]*[a-zA-Z]")

// screen is the view as text: the ASCII profile keeps bold and reverse,
// which the golden files show as they would print.
func screen(m *Model) string {
	return ansiSeq.ReplaceAllString(m.View(), "")
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join(goldenDir, name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/tui -update to write it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s differs (-want +got; go test ./internal/tui -update rewrites it):\n%s", path, diff)
	}
}

func TestScreens(t *testing.T) {
	recs := demoRecords(t)
	for _, tc := range []struct {
		name  string
		steps func(m *Model)
	}{
		{"list", func(m *Model) {}},
		{"list-filtered", func(m *Model) { keys(m, "/"); typeText(m, "~c 403"); keys(m, "enter") }},
		{"list-bad-filter", func(m *Model) { keys(m, "/"); typeText(m, "~c 403 & (~u alice"); keys(m, "enter") }},
		{"list-moved-and-marked", func(m *Model) { keys(m, "g", "j", "m", "m") }},
		{"help", func(m *Model) { keys(m, "?") }},
		{"detail-verdict", func(m *Model) { openFlow(m, "/api/v1/namespaces/kube-system/secrets") }},
		{"detail-stages", func(m *Model) { openFlow(m, "/api/v1/namespaces/restricted/pods"); keys(m, "2") }},
		{"detail-request", func(m *Model) { openFlow(m, "/api/v1/namespaces/kube-system/secrets"); keys(m, "3") }},
		{"detail-request-body", func(m *Model) {
			openFlow(m, "POST /api/v1/namespaces/default/pods")
			keys(m, "3")
		}},
		{"detail-stages-server", func(m *Model) {
			openFlow(m, "POST /api/v1/namespaces/restricted/pods")
			keys(m, "2")
		}},
		{"detail-response", func(m *Model) { openFlow(m, "/api/v1/namespaces/kube-system/secrets"); keys(m, "4") }},
		{"detail-response-watch", func(m *Model) { openFlow(m, "/api/v1/namespaces/kube-system/secrets"); keys(m, "4") }},
		// A watch the client stopped: answered, then cut short (it had
		// said "No answer from the apiserver").
		{"detail-watch-stopped", func(m *Model) { openFlow(m, "/api/v1/namespaces/kube-system/secrets") }},
		{"detail-trace", func(m *Model) {
			m.opts.JaegerURL = "http://jaeger:16686"
			openFlow(m, "/api/v1/namespaces/kube-system/secrets")
			keys(m, "5")
		}},
		// The apiserver's spans in a trace of their own, linked.
		{"detail-trace-linked", func(m *Model) {
			m.opts.JaegerURL = "http://jaeger:16686"
			openFlow(m, "POST /api/v1/namespaces/restricted/pods")
			keys(m, "5")
		}},
		{"detail-unknown-rerun", func(m *Model) { openFlow(m, "/api/v1/namespaces/default/configmaps/nope"); keys(m, "e") }},
		{"copy", func(m *Model) { openFlow(m, "/api/v1/namespaces/kube-system/secrets"); keys(m, "c") }},
		{"too-small", func(m *Model) { send(m, tea.WindowSizeMsg{Width: 60, Height: 10}) }},
		// The smallest terminal it works in: no row wider than it,
		// RESOURCE readable, every key in the help.
		{"list-80", func(m *Model) { send(m, tea.WindowSizeMsg{Width: 80, Height: 15}) }},
		{"list-100", func(m *Model) { send(m, tea.WindowSizeMsg{Width: 100, Height: 15}) }},
		{"help-80", func(m *Model) { send(m, tea.WindowSizeMsg{Width: 80, Height: 16}); keys(m, "?") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newTestModel(t, Options{})
			if tc.name == "detail-stages-server" || tc.name == "detail-trace-linked" {
				recs = withServer(recs, "/api/v1/namespaces/restricted/pods")
			}
			if tc.name == "detail-request-body" {
				recs = withBody(recs, "/api/v1/namespaces/default/pods", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"bad"},"spec":{"containers":[{"name":"c","image":"busybox","resources":{"limits":{"cpu":"-1"}}}]}}`)
			}
			// Only this case's screen shows the watch.
			shown := recs
			switch tc.name {
			case "detail-response-watch":
				shown = asWatchEnded(recs, "/api/v1/namespaces/kube-system/secrets")
			case "detail-watch-stopped":
				shown = asWatchEnded(recs, "/api/v1/namespaces/kube-system/secrets")
				for i, r := range shown {
					if r.Request.Path == "/api/v1/namespaces/kube-system/secrets" {
						c := *r
						c.Actual.StreamError, c.Actual.Error = nil, "response aborted: the client closed its connection"
						shown[i] = &c
					}
				}
			}
			send(m, eventsMsg{{Records: shown, Status: "reading"}, {Done: true}})
			tc.steps(m)
			golden(t, tc.name, screen(m))
		})
	}
}

// openFlow moves the cursor to the first flow with path ("METHOD path"
// for a method too) and opens it.
func openFlow(m *Model, path string) {
	method, p, ok := strings.Cut(path, " ")
	if !ok {
		method, p = "", path
	}
	keys(m, "g")
	for i := 0; i < len(m.flows.shown); i++ {
		if r := m.focused(); r.Request.Path == p && (method == "" || r.Request.Method == method) {
			keys(m, "enter")
			return
		}
		keys(m, "j")
	}
	panic("no flow with path " + path)
}

func TestRerun(t *testing.T) {
	recs := demoRecords(t)
	var asked string
	m := newTestModel(t, Options{Replayer: replayerFunc(func(id string) (*record.Record, error) {
		asked = id
		r := *recs[5] // alice's refused list of secrets, allowed now
		r.Predicted = record.Prediction{Status: 200}
		r.Stages = append([]record.StageResult(nil), r.Stages...)
		r.Stages[3].Outcome, r.Stages[3].Explanation = record.Pass, "RBAC: allowed by RoleBinding kube-system/alice-secrets"
		return &r, nil
	})})
	send(m, eventsMsg{{Records: recs}})
	openFlow(m, "/api/v1/namespaces/kube-system/secrets")
	keys(m, "e")
	if asked != recs[5].ID {
		t.Fatalf("re-ran %q, want %q", asked, recs[5].ID)
	}
	golden(t, "rerun", screen(m))
}

func TestExport(t *testing.T) {
	recs := demoRecords(t)
	for _, r := range recs {
		r.Request.Protocol = "HTTP/2.0" // kubectl's; HAR's httpVersion is the client's
	}
	dir := t.TempDir()
	m := newTestModel(t, Options{Version: "test"})
	send(m, eventsMsg{{Records: recs}})
	keys(m, "/")
	typeText(m, "~c 403")
	keys(m, "enter", ":")
	typeText(m, "export har "+filepath.Join(dir, "flows.har"))
	keys(m, "enter")
	if !strings.Contains(m.message, "exported 4 filtered flows") {
		t.Fatalf("message %q", m.message)
	}
	var h har
	b, err := os.ReadFile(filepath.Join(dir, "flows.har"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatal(err)
	}
	if len(h.Log.Entries) != 4 || h.Log.Version != "1.2" {
		t.Fatalf("HAR has %d entries, version %q", len(h.Log.Entries), h.Log.Version)
	}
	for _, e := range h.Log.Entries {
		if e.Response.Status != 403 || e.Kproxy == nil || !strings.HasPrefix(e.Request.URL, harHost+"/") {
			t.Errorf("entry %+v", e.Request)
		}
		if e.Request.HTTPVersion != "HTTP/2.0" || e.Response.HTTPVersion != "HTTP/2.0" {
			t.Errorf("httpVersion %q and %q, want the client's HTTP/2.0", e.Request.HTTPVersion, e.Response.HTTPVersion)
		}
		if strings.Contains(string(b), "Bearer ") && !strings.Contains(string(b), "Bearer REDACTED") {
			t.Errorf("a bearer token reached the HAR")
		}
	}

	// Marked flows win over the filter; jsonl round-trips as a capture.
	keys(m, "esc") // clears the filter
	keys(m, "g", "m", "m")
	keys(m, ":")
	typeText(m, "export jsonl "+filepath.Join(dir, "marked.jsonl"))
	keys(m, "enter")
	if !strings.Contains(m.message, "exported 2 marked flows") {
		t.Fatalf("message %q", m.message)
	}
	b, err = os.ReadFile(filepath.Join(dir, "marked.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n != 2 {
		t.Fatalf("%d lines, want 2", n)
	}

	// A bad command or directory says what to do and writes nothing.
	keys(m, ":")
	typeText(m, "export har /nonexistent/dir/x.har")
	keys(m, "enter")
	if !m.messageErr || !strings.Contains(m.message, "check the directory exists") {
		t.Fatalf("message %q", m.message)
	}
	keys(m, ":")
	typeText(m, "export xml x")
	keys(m, "enter")
	if !m.messageErr || !strings.Contains(m.message, ":export xml: not a format; har (HAR 1.2) or jsonl") {
		t.Fatalf("message %q", m.message)
	}
}

func (f replayerFunc) Replay(_ context.Context, id string) (*record.Record, error) { return f(id) }

// Keys typed faster than the terminal is read arrive as one message; each
// is still its own command, and what follows ":" is the command's text.
func TestFastTyping(t *testing.T) {
	m := newTestModel(t, Options{})
	send(m, eventsMsg{{Records: demoRecords(t)}})
	send(m, tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune("gjj")})
	if m.list.cursor != 2 || m.list.follow {
		t.Fatalf("after gjj: cursor %d, follow %v; want 2, false", m.list.cursor, m.list.follow)
	}
	send(m, tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune(":unmark")})
	if m.input != inputCommand || m.ti.Value() != "unmark" {
		t.Fatalf("after :unmark typed at once: input %v, text %q", m.input, m.ti.Value())
	}
}

// withBody gives the write to path a recorded body, as kproxy serve
// --capture-bodies records it.
func withBody(recs []*record.Record, path, body string) []*record.Record {
	out := make([]*record.Record, len(recs))
	for i, r := range recs {
		out[i] = r
		if r.Request.Path == path && r.Request.Method == "POST" {
			c := *r
			c.Request.Body = json.RawMessage(body)
			out[i] = &c
		}
	}
	return out
}

// asWatchEnded makes the request to path a watch answered 200 whose
// stream the apiserver ended with an ERROR event, after 12 events.
func asWatchEnded(recs []*record.Record, path string) []*record.Record {
	out := make([]*record.Record, len(recs))
	for i, r := range recs {
		out[i] = r
		if r.Request.Path == path {
			c := *r
			c.Request.Verb, c.Request.Query = "watch", "watch=1&resourceVersion=300"
			c.Actual.Status, c.Actual.Reason, c.Actual.Message, c.Actual.ResponseBytes, c.Actual.Events = 200, "", "", 48213, new(int64(12))
			c.Actual.StreamError = &record.StreamStatus{Code: 410, Reason: "Expired", Message: "too old resource version: 300 (1709)"}
			out[i] = &c
		}
	}
	return out
}

// withServer gives the write to path the apiserver's own layers, shaped as
// the span join makes them.
func withServer(recs []*record.Record, path string) []*record.Record {
	ms := int64(time.Millisecond)
	out := make([]*record.Record, len(recs))
	for i, r := range recs {
		out[i] = r
		if r.Request.Path == path && r.Request.Method == "POST" {
			c := *r
			c.Server = &record.Server{Source: record.ServerFromTrace, TraceID: "0af7651916cd43dd8448eb211c80319c", TotalNs: 340 * ms,
				Summary: "340ms: 300ms in validating webhook slow.example.com, 12ms etcd, 9ms in APF",
				Layers: []record.ServerLayer{
					{Name: "authentication (before the traced chain)", Stage: record.StageAuthentication, DurationNs: 340 * ms, SelfNs: 4 * ms},
					{Name: "audit", Stage: record.LayerAudit, DurationNs: 336 * ms, SelfNs: 1 * ms, OffsetNs: 4 * ms, Depth: 1},
					{Name: "impersonation", Stage: record.StageImpersonation, DurationNs: 335 * ms, SelfNs: 0, OffsetNs: 5 * ms, Depth: 2},
					{Name: "APF (queue wait and dispatch)", Stage: record.StageFlowControl, DurationNs: 335 * ms, SelfNs: 9 * ms, OffsetNs: 5 * ms, Depth: 3},
					{Name: "authorization", Stage: record.StageAuthorization, DurationNs: 326 * ms, SelfNs: 1 * ms, OffsetNs: 14 * ms, Depth: 4},
					{Name: "handler Create", Stage: record.StageDecode, DurationNs: 325 * ms, SelfNs: 11 * ms, OffsetNs: 15 * ms, Depth: 5},
					{Name: "validating webhook slow.example.com", Stage: record.StageValidatingAdmission, DurationNs: 300 * ms, SelfNs: 300 * ms, OffsetNs: 20 * ms, Depth: 6},
					{Name: "etcd Create", Stage: record.StageStorage, DurationNs: 12 * ms, SelfNs: 12 * ms, OffsetNs: 321 * ms, Depth: 6},
					{Name: "SerializeObject", Stage: record.LayerSerialization, DurationNs: 2 * ms, SelfNs: 2 * ms, OffsetNs: 334 * ms, Depth: 6},
				}}
			c.Latency.ServerNs = c.Server.TotalNs
			out[i] = &c
		}
	}
	return out
}

// fakeFilterer is a live kproxy's replay filter.
type fakeFilterer struct{ expr string }

func (f *fakeFilterer) ReplayFilter(context.Context) (string, error) { return f.expr, nil }
func (f *fakeFilterer) SetReplayFilter(_ context.Context, expr string) (string, error) {
	if strings.Contains(expr, "~c") {
		return "", errors.New("~c needs the apiserver's answer")
	}
	f.expr = expr
	return expr, nil
}

// TestReplayFilterCommands: :replay-filter shows and sets the live
// kproxy's replay filter, :replay-all clears it, a refusal is shown as an
// error, and reading a file there is no kproxy to change.
func TestReplayFilterCommands(t *testing.T) {
	rf := &fakeFilterer{}
	m := newTestModel(t, Options{ReplayFilter: rf})
	send(m, eventsMsg{{Records: demoRecords(t)}})
	for _, tc := range []struct {
		command, want, inForce string
		isErr                  bool
	}{
		{"replay-filter", "kproxy replays every request", "", false},
		{"replay-filter ~n payments", "kproxy replays only: ~n payments (the others are recorded, not replayed; :replay-all undoes)", "~n payments", false},
		{"replay-filter ~c 403", "replay filter: ~c needs the apiserver's answer", "~n payments", true},
		{"replay-filter", "kproxy replays only: ~n payments", "~n payments", false},
		{"replay-all", "kproxy replays every request", "", false},
	} {
		keys(m, ":")
		typeText(m, tc.command)
		keys(m, "enter")
		if !strings.Contains(m.message, tc.want) || m.messageErr != tc.isErr || rf.expr != tc.inForce {
			t.Errorf(":%s: message %q (error %v), in force %q; want %q (error %v), %q", tc.command, m.message, m.messageErr, rf.expr, tc.want, tc.isErr, tc.inForce)
		}
	}
	file := newTestModel(t, Options{})
	keys(file, ":")
	typeText(file, "replay-filter ~n x")
	keys(file, "enter")
	if !strings.Contains(file.message, "kproxy tui --connect URL") {
		t.Errorf("reading a file: %q, want it to say the filter is a live kproxy's", file.message)
	}
}

// TestSlowestWalk: S goes to the slowest flow shown, S again to the next
// slowest, and after another key to the slowest again (a probe: finding
// the slowest request took a filter guessed at).
func TestSlowestWalk(t *testing.T) {
	m := newTestModel(t, Options{})
	recs := demoRecords(t)
	send(m, eventsMsg{{Records: recs}})
	byTotal := slices.Clone(m.flows.shown)
	slices.SortStableFunc(byTotal, func(a, b int) int {
		return int(m.flows.at(b).Latency.TotalNs - m.flows.at(a).Latency.TotalNs)
	})
	at := func() int64 { return m.focused().Latency.TotalNs }
	keys(m, "S")
	if got, want := at(), m.flows.at(byTotal[0]).Latency.TotalNs; got != want {
		t.Fatalf("S: total %d, want the slowest, %d", got, want)
	}
	for i := 1; i < 4; i++ {
		keys(m, "S")
		if got, want := at(), m.flows.at(byTotal[i]).Latency.TotalNs; got != want {
			t.Errorf("S pressed %d times: total %d, want the %d-th slowest, %d", i+1, got, i+1, want)
		}
	}
	keys(m, "k", "S")
	if got, want := at(), m.flows.at(byTotal[0]).Latency.TotalNs; got != want {
		t.Errorf("k then S: total %d, want the slowest again, %d", got, want)
	}
}

// TestMessageExpires: a message that is not an error goes after
// messageTTL (a filter's count went stale as flows arrived); an error
// stays until the next key.
func TestMessageExpires(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1e9, 0))
	m := newTestModel(t, Options{Clock: clk})
	m.setMessage("filter \"~c 403\": 9 of 72 flows", false)
	if got := strings.Join(m.bottomLines(), "\n"); !strings.Contains(got, "9 of 72 flows") {
		t.Fatalf("fresh message not shown: %q", got)
	}
	clk.Step(messageTTL + time.Second)
	if got := strings.Join(m.bottomLines(), "\n"); strings.Contains(got, "9 of 72 flows") {
		t.Errorf("message still shown after %v: %q", messageTTL, got)
	}
	m.setMessage(":export: no such directory", true)
	clk.Step(messageTTL + time.Second)
	if got := strings.Join(m.bottomLines(), "\n"); !strings.Contains(got, "no such directory") {
		t.Errorf("error gone after %v: %q", messageTTL, got)
	}
}
