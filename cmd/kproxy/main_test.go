package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
)

// run executes kproxy in process, as the binary would with args.
func run(t *testing.T, stdin string, args ...string) (stdout string, err error) {
	t.Helper()
	cmd := newRootCommand()
	var out, errOut bytes.Buffer
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetIn(strings.NewReader(stdin))
	err = cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestFlags(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		wantErr string // "" : no flag error (the command may fail later)
	}{
		{"a mistyped flag names the one meant", []string{"explain", "GET", "/api", "--tokn", "x"}, "unknown flag: --tokn (did you mean --token?)"},
		{"serve too", []string{"serve", "--captur", "x"}, "unknown flag: --captur (did you mean --capture?)"},
		{"nothing near", []string{"explain", "GET", "/api", "--zzzzzzzzzz"}, "neither a kproxy flag nor a kube-apiserver flag"},
		{"etcd subcommands too", []string{"etcd", "get", "/registry/x", "--etcd-server", "http://127.0.0.1:1"}, "did you mean --etcd-servers?"},
		{"a kube-apiserver flag kproxy does not use is accepted", []string{"explain", "GET", "/api", "--secure-port", "6443", "--profiling=false", "--upstream", "https://127.0.0.1:1", "--upstream-kubeconfig", "/nonexistent"}, ""},
		{"capture rotation: a size", []string{"serve", "--capture-maxsize", "-1"}, "want a number of MiB, e.g. 64 (0: off)"},
		{"capture rotation: 0 is off", []string{"serve", "--capture-maxsize", "0", "--capture-maxbackup", "2", "--capture", "c.jsonl"}, "give --capture-maxsize MiB too"},
		{"capture rotation: days", []string{"serve", "--capture-maxage", "1.5"}, "want a whole number of days, e.g. 7 (0: keep)"},
		{"explain takes METHOD PATH", []string{"explain", "GET"}, "want METHOD PATH"},
		{"explain -o", []string{"explain", "GET", "/api", "-o", "csv"}, `-o "csv": use table, json, yaml, jsonpath=..., go-template=...`},
		{"explain -o jsonpath is kubectl's", []string{"explain", "GET", "/api", "-o", "jsonpath={.predicted.status}", "--upstream-kubeconfig", "/nonexistent"}, "no upstream apiserver: give --upstream-kubeconfig"}, // past -o
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := run(t, "", tc.args...)
			switch {
			case tc.wantErr == "" && err != nil && strings.Contains(err.Error(), "unknown flag"):
				t.Errorf("%v: %v", tc.args, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("%v: error %v, want %q", tc.args, err, tc.wantErr)
			}
		})
	}
}

func TestDecodeInProcess(t *testing.T) {
	cm := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"default"},"data":{"a":"b"}}`
	watch := `{"type":"ADDED","object":` + cm + "}\n" + `{"type":"DELETED","object":` + cm + "}\n"
	for _, tc := range []struct {
		name, input string
		args        []string
		want        []string
		wantErr     string
	}{
		{"yaml", cm, []string{"-o", "yaml"}, []string{"kind: ConfigMap", "a: b"}, ""},
		{"json", cm, []string{"-o", "json"}, []string{`"kind": "ConfigMap"`}, ""},
		{"jsonpath", cm, []string{"-o", "jsonpath={.metadata.name}/{.data.a}"}, []string{"x/b"}, ""},
		{"a watch stream, as kubectl get -w --output-watch-events", watch, []string{"-o", "json"},
			[]string{`{"type":"ADDED","object":{"apiVersion":"v1"`, `{"type":"DELETED"`}, ""},
		{"a watch stream in yaml", watch, nil, []string{"type: ADDED", "---\nobject:", "type: DELETED"}, ""},
		{"a table of something that is not a Table", cm, []string{"-o", "wide"}, nil, "-o wide renders a meta.k8s.io Table"},
		{"an unknown format", cm, []string{"-o", "xml"}, nil, `-o "xml": use table, wide, name, json, yaml`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(t, tc.input, append(append([]string{"decode"}, tc.args...), "-")...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

// TestTestRunBadInput: kproxy test run's bad input ends with exit status 2,
// as its help says (cobra's own errors end with 1).
func TestTestRunBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"no tests", []string{"test", "run"}},
		{"a mistyped flag", []string{"test", "run", "--engin", "cluster", "tests/"}},
		{"a missing file", []string{"test", "run", "/nonexistent/tests.yaml"}},
		{"a JUnit report where no directory is", []string{"test", "run", "--junit", "/nonexistent/dir/junit.xml", "tests/"}},
		{"an output format it does not write", []string{"test", "run", "-o", "xml", "tests/"}},
		{"-o name (a report has no name)", []string{"test", "run", "-o", "name", "tests/"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := run(t, "", tc.args...)
			var code exitCode
			if !errors.As(err, &code) || code != 2 {
				t.Errorf("%v: %v, want exit status 2", tc.args, err)
			}
		})
	}
}

// TestVersion: kproxy version prints a line, or a document with -o as
// kubectl version -o json does.
func TestVersion(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    string
		wantErr string
	}{
		{[]string{"version"}, "replays Kubernetes " + kubeVersion, ""},
		{[]string{"version", "-o", "json"}, `"kubernetesVersion": "` + kubeVersion + `"`, ""},
		{[]string{"version", "-o", "jsonpath={.kind}"}, "Version", ""},
		{[]string{"version", "-o", "xml"}, "", `-o "xml": use text, json, yaml`},
	} {
		out, err := run(t, "", tc.args...)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v: error %v, want %q", tc.args, err, tc.wantErr)
			}
		case err != nil || !strings.Contains(out, tc.want):
			t.Errorf("%v: %v\n%s", tc.args, err, out)
		}
	}
}

// TestExportFailed: an export error names what was being exported, and
// what to check.
func TestExportFailed(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{errors.New(`failed to send logs to http://127.0.0.1:4318/v1/logs: 404 Not Found`), "record (OTLP logs) export failed"},
		{errors.New(`traces export: Post "http://127.0.0.1:4318/v1/traces": dial tcp: connection refused`), "trace export failed"},
	} {
		if got := exportFailed(tc.err); !strings.HasPrefix(got, tc.want) || !strings.Contains(got, "check --otlp-") {
			t.Errorf("exportFailed(%v) = %q, want it to begin %q and name the flag to check", tc.err, got, tc.want)
		}
	}
}
