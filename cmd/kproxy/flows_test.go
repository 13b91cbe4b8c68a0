package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/flowapi"
	"github.com/kproxy/kproxy/internal/record"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files under testdata/flows")

// flowsDir holds the sample capture and the golden outputs.
var flowsDir = filepath.Join("..", "..", "testdata", "flows")

var sampleCapture = filepath.Join(flowsDir, "sample.jsonl")

// runFlowsCmd runs kproxy in process as run does, with times printed in
// UTC, under ctx, writing stdout to out (nil: a buffer whose text is
// returned).
func runFlowsCmd(t *testing.T, ctx context.Context, stdin string, out *syncWriter, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	root := newRootCommand()
	for _, c := range root.Commands() {
		if c.Name() == "flows" {
			root.RemoveCommand(c)
		}
	}
	root.AddCommand(newFlowsCommandIn(time.UTC))
	if out == nil {
		out = &syncWriter{}
	}
	var errOut bytes.Buffer
	root.SetArgs(args)
	root.SetOut(out)
	root.SetErr(&errOut)
	root.SetIn(strings.NewReader(stdin))
	err = root.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

// syncWriter is a stdout that can watch what is written to it.
type syncWriter struct {
	mu      sync.Mutex
	b       bytes.Buffer
	onWrite func(all string)
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	n, err := w.b.Write(p)
	all := w.b.String()
	w.mu.Unlock()
	if w.onWrite != nil {
		w.onWrite(all)
	}
	return n, err
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestFlowsGolden prints the sample capture as a table, a wide table and
// a summary (go test ./cmd/kproxy -run TestFlowsGolden -update rewrites
// the golden files).
func TestFlowsGolden(t *testing.T) {
	for _, tc := range []struct {
		golden string
		args   []string
	}{
		{"table.txt", nil},
		{"wide.txt", []string{"-o", "wide"}},
		{"stats.txt", []string{"--stats"}},
		{"stats.yaml", []string{"--stats", "-o", "yaml"}},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			out, stderr, err := runFlowsCmd(t, context.Background(), "", nil, append([]string{"flows", sampleCapture}, tc.args...)...)
			if err != nil {
				t.Fatalf("%v\n%s", err, stderr)
			}
			golden := filepath.Join(flowsDir, tc.golden)
			if *updateGolden {
				if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (go test ./cmd/kproxy -run TestFlowsGolden -update writes it)", err)
			}
			if out != string(want) {
				t.Errorf("kproxy flows %s differs from %s (go test ./cmd/kproxy -run TestFlowsGolden -update rewrites it):\n%s", strings.Join(tc.args, " "), golden, out)
			}
		})
	}
}

func TestFlows(t *testing.T) {
	capture, err := os.ReadFile(sampleCapture)
	if err != nil {
		t.Fatal(err)
	}
	withBadLines := filepath.Join(t.TempDir(), "bad.jsonl")
	if err := os.WriteFile(withBadLines, append([]byte("not json\n{\"no\":\"id\"}\n"), capture...), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		stdin      string
		args       []string
		want       []string // in stdout
		wantNot    []string // not in stdout
		wantStderr []string
		wantExit   int // 0: success; else the exitCode, or 1 for an error
	}{
		{name: "a filter", args: []string{sampleCapture, "--filter", "~x"},
			want:    []string{"TIME", "admin    create   configmaps -n default   201         409      !=      4.1ms"},
			wantNot: []string{"403"}},
		{name: "unknown and disagreeing flows, wide", args: []string{sampleCapture, "--filter", "~x | ~unknown", "-o", "wide"},
			want: []string{"AlreadyExists", "storage: the apiserver would now connect to 10.0.0.7:10250", "7e4f1a9c-3b2d-4e8f-a6c5-1d0b9e8f7a64"}},
		{name: "a non-resource request is its path", args: []string{sampleCapture, "--filter", "/healthz"},
			want: []string{"system:anonymous   get    /healthz   200"}},
		{name: "stdin", stdin: string(capture), args: []string{"-", "--filter", "~s authentication"},
			want: []string{"token    list   namespaces   401 @authentication"}},
		{name: "-o name", args: []string{sampleCapture, "--filter", "~unknown", "-o", "name"},
			want: []string{"flow.kproxy.dev/7e4f1a9c-3b2d-4e8f-a6c5-1d0b9e8f7a64\n"}},
		{name: "-o jsonpath sees the FlowList", args: []string{sampleCapture, "--filter", "~s authorization", "-o", "jsonpath={.items[*].request.user}"},
			want: []string{"alice dave"}},
		{name: "-o yaml", args: []string{sampleCapture, "--filter", "~v watch", "-o", "yaml"},
			want: []string{"apiVersion: kproxy.dev/v1alpha1\nitems:\n- actual:", "kind: FlowList", "verb: watch"}},
		{name: "nothing matches", args: []string{sampleCapture, "--filter", "~u nobody"},
			wantStderr: []string{"No flows matching --filter ~u nobody in " + sampleCapture}},
		{name: "lines that are not records are counted", args: []string{withBadLines, "--filter", "~v watch"},
			want: []string{"alice    watch"}, wantStderr: []string{"skipped 2 lines of " + withBadLines + " that are not capture records"}},
		{name: "a bad filter shows where, and exits 2", args: []string{sampleCapture, "--filter", "~u alice ~c 4x"},
			wantStderr: []string{"--filter: ", "at position 13:\n  ~u alice ~c 4x\n              ^\n"}, wantExit: exitBadInput},
		{name: "FILE and --connect", args: []string{sampleCapture, "--connect", "http://127.0.0.1:1"},
			wantStderr: []string{"give a capture FILE or --connect URL, not both"}, wantExit: exitBadInput},
		{name: "API flags with a FILE", args: []string{sampleCapture, "--token", "x"},
			wantStderr: []string{"are for the flow API (--connect)"}, wantExit: exitBadInput},
		{name: "--stats --follow", args: []string{sampleCapture, "--stats", "--follow"},
			wantStderr: []string{"does not go with --follow"}, wantExit: exitBadInput},
		{name: "an unknown -o", args: []string{sampleCapture, "-o", "csv"},
			wantStderr: []string{`-o "csv": use table, wide, name, json, yaml`}, wantExit: exitBadInput},
		{name: "a missing file", args: []string{filepath.Join(t.TempDir(), "nope.jsonl")}, wantExit: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, stderr, err := runFlowsCmd(t, context.Background(), tc.stdin, nil, append([]string{"flows"}, tc.args...)...)
			var code exitCode
			switch {
			case tc.wantExit == 0 && err != nil:
				t.Fatalf("%v\nstderr: %s", err, stderr)
			case tc.wantExit == 1 && (err == nil || errors.As(err, &code)):
				t.Fatalf("error %v, want one kproxy prints (exit status 1)", err)
			case tc.wantExit > 1 && (!errors.As(err, &code) || int(code) != tc.wantExit):
				t.Fatalf("error %v, want exit status %d\nstderr: %s", err, tc.wantExit, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("stdout lacks %q:\n%s", w, out)
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(out, w) {
					t.Errorf("stdout has %q:\n%s", w, out)
				}
			}
			for _, w := range tc.wantStderr {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr)
				}
			}
		})
	}
}

func TestFlowsJSON(t *testing.T) {
	out, _, err := runFlowsCmd(t, context.Background(), "", nil, "flows", sampleCapture, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		APIVersion string          `json:"apiVersion"`
		Kind       string          `json:"kind"`
		Items      []record.Record `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if list.APIVersion != "kproxy.dev/v1alpha1" || list.Kind != "FlowList" || len(list.Items) != 13 || list.Items[12].Request.Path != "/healthz" {
		t.Errorf("%s %s with %d items", list.APIVersion, list.Kind, len(list.Items))
	}

	out, _, err = runFlowsCmd(t, context.Background(), "", nil, "flows", sampleCapture, "--stats", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var stats flowStats
	if err := json.Unmarshal([]byte(out), &stats); err != nil {
		t.Fatal(err)
	}
	if stats.Flows != 13 || len(stats.Agreement) != 3 || stats.Agreement[1] != (statCount{Name: "mismatch", Flows: 1, Percent: 7.7}) {
		t.Errorf("stats: %+v", stats)
	}
}

// TestFlowsFollowFile follows a capture file: what is there, then what is
// appended, until the command's context ends (Ctrl-C).
func TestFlowsFollowFile(t *testing.T) {
	capture, err := os.ReadFile(sampleCapture)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "capture.jsonl")
	if err := os.WriteFile(path, capture, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	appended := false
	out := &syncWriter{onWrite: func(all string) {
		switch {
		case !appended && strings.Contains(all, "/healthz"):
			// The file is read; a new flow is recorded.
			appended = true
			f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			fmt.Fprintf(f, `{"id":"live-1","start":"2026-12-01T08:11:00Z","request":{"method":"GET","path":"/livez","verb":"get","user":"system:anonymous"},"predicted":{"status":200},"actual":{"status":200},"latency":{"totalNs":900000}}`+"\n")
		case strings.Contains(all, "/livez"):
			cancel()
		}
	}}
	stdout, stderr, err := runFlowsCmd(t, ctx, "", out, "flows", path, "--follow", "--filter", "~u system:anonymous")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("the appended flow never showed:\n%s\nstderr:\n%s", stdout, stderr)
	}
	want := "TIME           CALLER             VERB   RESOURCE   PREDICTED   ACTUAL   AGREE   TOTAL\n" +
		"08:10:58.250   system:anonymous   get    /healthz   200         200      =       1.2ms\n" +
		"08:11:00.000   system:anonymous   get    /livez     200         200      =       900µs\n"
	if stdout != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", stdout, want)
	}
	if !strings.Contains(stderr, "# following "+path) {
		t.Errorf("stderr lacks the status:\n%s", stderr)
	}
}

// TestFlowsConnect reads kproxy serve's flow API: a list, and the live
// stream as JSON Lines.
func TestFlowsConnect(t *testing.T) {
	f, err := os.Open(sampleCapture)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := flowapi.NewBuffer(100)
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		r := &record.Record{}
		if err := json.Unmarshal(sc.Bytes(), r); err != nil {
			t.Fatal(err)
		}
		buf.Write(r)
	}
	srv := httptest.NewServer(flowapi.NewHandler(buf, flowapi.HandlerOptions{Token: "s3cret"}))
	t.Cleanup(srv.Close)

	out, stderr, err := runFlowsCmd(t, context.Background(), "", nil, "flows", "--connect", srv.URL, "--token", "s3cret", "--filter", "~s authorization", "-o", "name")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if want := "flow.kproxy.dev/b3eb59d3-68e6-4535-bc66-c2182f4f0ed7\nflow.kproxy.dev/74f1d55f-3a98-4c51-9518-a1c54f582c36\n"; out != want {
		t.Errorf("list:\n%s\nwant:\n%s", out, want)
	}

	_, _, err = runFlowsCmd(t, context.Background(), "", nil, "flows", "--connect", srv.URL)
	if err == nil || !strings.Contains(err.Error(), "--api-token-file") {
		t.Errorf("without the token: %v, want the API's 401 naming the fix", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	live := false
	w := &syncWriter{onWrite: func(all string) {
		switch n := strings.Count(all, "\n"); {
		case n == 1 && !live:
			// The backlog is in; now a live flow.
			live = true
			buf.Write(&record.Record{ID: "live-2", Request: record.Request{User: "alice", Verb: "delete"}, Predicted: record.Prediction{Status: 403, Stage: "authorization"}})
		case n == 2:
			cancel()
		}
	}}
	out, stderr, err = runFlowsCmd(t, ctx, "", w, "flows", "--connect", srv.URL, "--token", "s3cret", "--follow", "--filter", "~u alice ~s authorization", "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	var ids []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var r record.Record
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("not JSON Lines: %v\n%s", err, out)
		}
		ids = append(ids, r.ID)
	}
	if strings.Join(ids, ",") != "b3eb59d3-68e6-4535-bc66-c2182f4f0ed7,live-2" {
		t.Errorf("followed %v; want alice's refusal from the backlog, then the live one\n%s", ids, stderr)
	}
	if !strings.Contains(stderr, "# connected to "+srv.URL) {
		t.Errorf("stderr lacks the connection status:\n%s", stderr)
	}
}

func TestComputeFlowStats(t *testing.T) {
	rec := func(user string, p record.Prediction, actual int, total int64) *record.Record {
		return &record.Record{Request: record.Request{User: user}, Predicted: p, Actual: record.Actual{Status: actual},
			Latency: record.Latency{TotalNs: total, UpstreamNs: total / 2, ReplayNs: total / 4}}
	}
	ok := record.Prediction{Status: 200}
	rbac := record.Prediction{Status: 403, Stage: record.StageAuthorization, Reason: "Forbidden"}
	kubelet := record.Prediction{Stage: record.StageUnknown, Message: "cannot predict: storage: the apiserver would now connect to 10.0.0.7:10250 (a kubelet)"}
	apf := record.Prediction{Stage: record.StageUnknown, Message: "cannot predict: flowcontrol: the FlowSchemas and PriorityLevelConfigurations have not synced yet"}
	for _, tc := range []struct {
		name string
		recs []*record.Record
		want flowStats
	}{
		{"nothing", nil, flowStats{ByStage: []statCount{}, DenialsByUser: []statCount{}, UnknownByReason: []statCount{},
			Agreement: []statCount{{Name: "match"}, {Name: "mismatch"}, {Name: "unknown"}},
			Latency:   []latencyStat{{Name: "total"}, {Name: "upstream"}, {Name: "replay"}}}},
		{"a mix", []*record.Record{
			rec("alice", ok, 200, 1000),
			rec("alice", rbac, 403, 2000),
			rec("bob", rbac, 403, 3000),
			rec("bob", ok, 409, 4000), // a wrong prediction
			rec("alice", kubelet, 200, 5000),
			rec("carol", kubelet, 500, 6000),
			rec("carol", apf, 0, 7000), // no answer
			rec("bob", rbac, 403, 100000),
		}, flowStats{
			Flows: 8,
			ByStage: []statCount{{Name: "none", Flows: 2, Percent: 25}, {Name: "authorization", Flows: 3, Percent: 37.5},
				{Name: "unknown", Flows: 3, Percent: 37.5}},
			DenialsByUser: []statCount{{Name: "bob", Flows: 3, Percent: 37.5}, {Name: "alice", Flows: 1, Percent: 12.5},
				{Name: "carol", Flows: 1, Percent: 12.5}},
			Agreement: []statCount{{Name: "match", Flows: 4, Percent: 50}, {Name: "mismatch", Flows: 1, Percent: 12.5},
				{Name: "unknown", Flows: 3, Percent: 37.5}},
			UnknownByReason: []statCount{{Name: "storage: the apiserver would now connect to 10.0.0.7:10250", Flows: 2, Percent: 25},
				{Name: "flowcontrol: the FlowSchemas and PriorityLevelConfigurations have not synced yet", Flows: 1, Percent: 12.5}},
			Latency: []latencyStat{{Name: "total", P50Ns: 4000, P99Ns: 100000}, {Name: "upstream", P50Ns: 2000, P99Ns: 50000},
				{Name: "replay", P50Ns: 1000, P99Ns: 25000}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := json.Marshal(computeFlowStats(tc.recs))
			want, _ := json.Marshal(tc.want)
			if string(got) != string(want) {
				t.Errorf("got  %s\nwant %s", got, want)
			}
		})
	}
}
