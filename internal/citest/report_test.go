package citest

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/testfile"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/citest")

// reportsDir holds the golden reports.
var reportsDir = filepath.Join("..", "..", "testdata", "citest")

const (
	rbacFile      = "tests/rbac.yaml"
	admissionFile = "tests/admission,extra.yaml" // a comma, escaped in GitHub's properties
)

// sampleReport is a run with every kind of outcome, in two files, and a
// what-if change; its times are fixed so the reports are stable.
func sampleReport() *Report {
	forbidden := Verdict{
		Status:      403,
		Stage:       record.StageAuthorization,
		Reason:      "Forbidden",
		Message:     `pods "web" is forbidden: User "bob" cannot delete resource "pods" in API group "" in the namespace "default"`,
		Explanation: "RBAC: no rule allows user bob to delete pods in namespace default\nchecked 3 roles, 2 cluster roles",
	}
	return &Report{
		Engine:   "local",
		Snapshot: "snapshots/prod",
		Started:  time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Duration: 1234567890 * time.Nanosecond,
		WhatIf:   []string{"overlay overlays/tighten-rbac", "--authorization-mode=Node,RBAC"},
		Results: []Result{
			{
				File: rbacFile, Line: 4, Name: "alice can list pods",
				Method: "GET", Path: "/api/v1/namespaces/default/pods",
				Got:      Verdict{Status: 200, Stage: testfile.StageNone, Explanation: "RBAC: allowed by ClusterRoleBinding view-all"},
				Duration: 12 * time.Millisecond,
			},
			{
				File: rbacFile, Line: 12, Name: "bob cannot delete pods",
				Method: "DELETE", Path: "/api/v1/namespaces/default/pods/web",
				Got: Verdict{Status: 200, Stage: testfile.StageNone, Stages: []record.StageResult{
					{Name: record.StageAuthentication, Outcome: record.Pass, Explanation: "token of user bob"},
					{Name: record.StageAuthorization, Outcome: record.Pass, Explanation: "RBAC: allowed by RoleBinding default/admins"},
				}},
				Failures: []string{
					"status: want 403, got 200",
					"stage: want authorization, got none",
				},
				Duration: 8 * time.Millisecond,
			},
			{
				File: rbacFile, Line: 20, Name: "get a configmap that is not there",
				Method: "GET", Path: "/api/v1/namespaces/team-with-a-very-long-name/configmaps/settings-for-the-frontend-service?resourceVersion=0",
				Got:         Verdict{Status: 404, Stage: record.StageStorage, Reason: "NotFound"},
				NotCompared: []string{"storage: want 200, got 404 NotFound at storage; the storage stage's outcome (404, 409) depends on the state when the snapshot was taken and is not compared (--compare-storage compares it)"},
				Duration:    3 * time.Millisecond,
			},
			{
				File: rbacFile, Line: 28, Name: "carol impersonates admin",
				Method: "GET", Path: "/api/v1/nodes",
				Error:    "read tokenFile tokens/carol: open tokens/carol: no such file or directory",
				Duration: time.Millisecond,
			},
			{
				File: admissionFile, Line: 5, Name: "privileged pods are denied",
				Method: "POST", Path: "/api/v1/namespaces/default/pods",
				Got: Verdict{
					Status:      403,
					Stage:       record.StageValidatingAdmission,
					Reason:      "Forbidden",
					Message:     "admission webhook \"deny.example.com\" denied the request:\n100% of containers are privileged",
					Warnings:    []string{"would violate PodSecurity \"restricted:latest\""},
					Explanation: "ValidatingAdmissionPolicy deny-privileged: 100% of containers privileged, limit 0%\nexpression: object.spec.containers.all(c, !c.securityContext.privileged)",
				},
				Failures: []string{
					`message: want a match for "must not be privileged", got "admission webhook \"deny.example.com\" denied the request:\n100% of containers are privileged"`,
				},
				Duration: 25 * time.Millisecond,
			},
			{
				File: admissionFile, Line: 17, Name: "create a deployment <with> | pipes & stars*",
				Method: "POST", Path: "/apis/apps/v1/namespaces/default/deployments",
				Got: Verdict{
					Status: 201, Stage: testfile.StageNone,
					Predicted:    &record.Prediction{Status: 403, Stage: record.StageValidatingAdmission, Reason: "Forbidden"},
					Disagreement: "kproxy predicted 403 Forbidden at validating-admission, the apiserver answered 201",
				},
				Duration: 40 * time.Millisecond,
			},
		},
		Changes: []Change{
			{
				File: rbacFile, Name: "alice can list pods",
				Before: Verdict{Status: 200, Stage: testfile.StageNone},
				After:  forbidden,
			},
		},
		Disagreements: 1,
	}
}

// TestReports compares every report of the sample run with its golden
// file (go test ./internal/citest -run TestReports -update rewrites them).
func TestReports(t *testing.T) {
	for _, tc := range []struct {
		golden string
		write  func(r *Report) (string, error)
	}{
		{"report.txt", func(r *Report) (string, error) {
			var b bytes.Buffer
			err := WriteTable(&b, r, false)
			return b.String(), err
		}},
		{"report-wide.txt", func(r *Report) (string, error) {
			var b bytes.Buffer
			err := WriteTable(&b, r, true)
			return b.String(), err
		}},
		{"junit.xml", func(r *Report) (string, error) {
			var b bytes.Buffer
			err := WriteJUnit(&b, r, "kproxy test")
			return b.String(), err
		}},
		{"github.txt", func(r *Report) (string, error) {
			var b bytes.Buffer
			err := WriteGitHub(&b, nil, r)
			return b.String(), err
		}},
		{"github-summary.md", func(r *Report) (string, error) {
			var b bytes.Buffer
			err := WriteGitHub(&bytes.Buffer{}, &b, r)
			return b.String(), err
		}},
		{"report.json", func(r *Report) (string, error) {
			var b bytes.Buffer
			err := WriteJSON(&b, r)
			return b.String(), err
		}},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			got, err := tc.write(sampleReport())
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join(reportsDir, tc.golden)
			if *update {
				if err := os.MkdirAll(reportsDir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (go test ./internal/citest -run TestReports -update writes it)", err)
			}
			if got != string(want) {
				t.Errorf("%s differs (go test ./internal/citest -run TestReports -update rewrites it): %s\ngot:\n%s",
					golden, firstDifference(string(want), got), got)
			}
		})
	}
}

// firstDifference says where two texts first differ.
func firstDifference(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl || i >= len(w) || i >= len(g) {
			return "line " + strconv.Itoa(i+1) + ":\n  want: " + wl + "\n  got:  " + gl
		}
	}
	return "no difference by line"
}

// TestWhatIfUnknown: a what-if change whose before or after is unknown
// says why in the table, so a baseline that could not predict does not
// read as the overlay's doing.
func TestWhatIfUnknown(t *testing.T) {
	r := sampleReport()
	r.Changes = []Change{
		{File: "tests/rbac.yaml", Name: "alice can list pods",
			Before: Verdict{Stage: record.StageUnknown, Unknown: "the replay's cluster state has not synced"},
			After:  Verdict{Status: 200, Stage: testfile.StageNone}},
		{File: "tests/rbac.yaml", Name: "bob can list pods",
			Before: Verdict{Status: 200, Stage: testfile.StageNone},
			After:  Verdict{Stage: record.StageUnknown, Unknown: "a webhook cannot be called in dry run"}},
	}
	var b bytes.Buffer
	if err := WriteTable(&b, r, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"    before, unknown: the replay's cluster state has not synced\n",
		"    after, unknown: a webhook cannot be called in dry run\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the what-if table lacks %q:\n%s", want, b.String())
		}
	}
}

func TestWriteTable(t *testing.T) {
	r := sampleReport()
	var b bytes.Buffer
	if err := WriteTable(&b, r, false); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for i := 0; i < len(out); i++ {
		if out[i] >= 0x80 || (out[i] < 0x20 && out[i] != '\n') {
			t.Fatalf("the table has a byte %#x at %d, want plain ASCII:\n%s", out[i], i, out)
		}
	}
	for _, want := range []string{
		"RESULT   CASE",
		"FAIL     bob cannot delete pods",
		"    status: want 403, got 200\n",
		"    explanation: RBAC: allowed by RoleBinding default/admins\n", // from the stages
		"ERROR    carol impersonates admin",
		"    error: read tokenFile tokens/carol",
		"    note: storage: want 200, got 404",
		"    kproxy's prediction disagrees: kproxy predicted 403",
		"What-if (overlay overlays/tighten-rbac, --authorization-mode=Node,RBAC): 1 case changes\n",
		"    explanation: RBAC: no rule allows user bob to delete pods in namespace default\n",
		"\n3 passed, 2 failed, 1 error (engine local, snapshot snapshots/prod, 1.235s)\n",
		"kproxy's prediction disagreed with the apiserver on 1 case\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "tests/rbac.yaml:12") {
		t.Errorf("the table without wide shows files:\n%s", out)
	}
	if strings.Contains(out, "checked 3 roles") {
		t.Errorf("the table shows more than the explanation's first line:\n%s", out)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasSuffix(l, " ") {
			t.Errorf("line %q ends in blanks", l)
		}
		if strings.Contains(l, "/configmaps/") && len(l) > 140 {
			t.Errorf("long request not shortened: %q", l)
		}
	}

	b.Reset()
	if err := WriteTable(&b, r, true); err != nil {
		t.Fatal(err)
	}
	wide := b.String()
	for _, want := range []string{"FILE", "tests/rbac.yaml:12", "tests/admission,extra.yaml:5", "?resourceVersion=0"} {
		if !strings.Contains(wide, want) {
			t.Errorf("the wide table lacks %q:\n%s", want, wide)
		}
	}

	b.Reset()
	if err := WriteTable(&b, &Report{Engine: "local"}, false); err != nil {
		t.Fatal(err)
	}
	if want := "No cases.\n\n0 passed, 0 failed, 0 errors (engine local, 0s)\n"; b.String() != want {
		t.Errorf("empty report:\n%s\nwant:\n%s", b.String(), want)
	}
}

// JUnit XML as a reader sees it.
type readSuites struct {
	XMLName  xml.Name    `xml:"testsuites"`
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Errors   int         `xml:"errors,attr"`
	Suites   []readSuite `xml:"testsuite"`
}

type readSuite struct {
	Name       string `xml:"name,attr"`
	Tests      int    `xml:"tests,attr"`
	Failures   int    `xml:"failures,attr"`
	Errors     int    `xml:"errors,attr"`
	Skipped    int    `xml:"skipped,attr"`
	Time       string `xml:"time,attr"`
	Timestamp  string `xml:"timestamp,attr"`
	Properties []struct {
		Name  string `xml:"name,attr"`
		Value string `xml:"value,attr"`
	} `xml:"properties>property"`
	Cases []readCase `xml:"testcase"`
}

type readCase struct {
	Name      string       `xml:"name,attr"`
	Classname string       `xml:"classname,attr"`
	File      string       `xml:"file,attr"`
	Line      int          `xml:"line,attr"`
	Time      string       `xml:"time,attr"`
	Failure   *readProblem `xml:"failure"`
	Error     *readProblem `xml:"error"`
	SystemOut string       `xml:"system-out"`
}

type readProblem struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Text    string `xml:",chardata"`
}

func TestWriteJUnit(t *testing.T) {
	var b bytes.Buffer
	if err := WriteJUnit(&b, sampleReport(), "kproxy test"); err != nil {
		t.Fatal(err)
	}
	var doc readSuites
	if err := xml.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatalf("%v:\n%s", err, b.String())
	}
	if doc.Name != "kproxy test" || doc.Tests != 6 || doc.Failures != 2 || doc.Errors != 1 {
		t.Errorf("testsuites %q: %d tests, %d failures, %d errors; want kproxy test: 6, 2, 1", doc.Name, doc.Tests, doc.Failures, doc.Errors)
	}
	if len(doc.Suites) != 2 {
		t.Fatalf("%d testsuites, want 2 (one per file)", len(doc.Suites))
	}
	for i, want := range []struct {
		name                    string
		tests, failures, errors int
		time                    string
	}{
		{rbacFile, 4, 1, 1, "0.024"},
		{admissionFile, 2, 1, 0, "0.065"},
	} {
		s := doc.Suites[i]
		if s.Name != want.name || s.Tests != want.tests || s.Failures != want.failures || s.Errors != want.errors || s.Skipped != 0 || s.Time != want.time {
			t.Errorf("testsuite %d: %q %d tests, %d failures, %d errors, %d skipped, time %s; want %q %d, %d, %d, 0, %s",
				i, s.Name, s.Tests, s.Failures, s.Errors, s.Skipped, s.Time, want.name, want.tests, want.failures, want.errors, want.time)
		}
		if s.Timestamp != "2026-01-02T03:04:05" {
			t.Errorf("testsuite %d: timestamp %q", i, s.Timestamp)
		}
		props := map[string]string{}
		for _, p := range s.Properties {
			props[p.Name] = p.Value
		}
		if props["engine"] != "local" || props["snapshot"] != "snapshots/prod" {
			t.Errorf("testsuite %d: properties %v", i, props)
		}
	}

	cases := map[string]readCase{}
	for _, s := range doc.Suites {
		for _, c := range s.Cases {
			cases[c.Name] = c
		}
	}
	bob := cases["bob cannot delete pods"]
	if bob.Classname != "tests/rbac" || bob.File != rbacFile || bob.Line != 12 || bob.Time != "0.008" {
		t.Errorf("bob's testcase: classname %q file %q line %d time %s", bob.Classname, bob.File, bob.Line, bob.Time)
	}
	if bob.Failure == nil || bob.Failure.Message != "status: want 403, got 200" || bob.Failure.Type != "expectation" {
		t.Fatalf("bob's failure: %+v", bob.Failure)
	}
	for _, want := range []string{
		"status: want 403, got 200\nstage: want authorization, got none\n",
		"got: 200\n",
		"explanation (none): RBAC: allowed by RoleBinding default/admins\n",
		"request: DELETE /api/v1/namespaces/default/pods/web\n",
	} {
		if !strings.Contains(bob.Failure.Text, want) {
			t.Errorf("bob's failure text lacks %q:\n%s", want, bob.Failure.Text)
		}
	}
	if alice := cases["alice can list pods"]; alice.Failure != nil || alice.Error != nil ||
		!strings.Contains(alice.SystemOut, "200 -> 403 Forbidden at authorization") {
		t.Errorf("alice's testcase: %+v", alice)
	}
	priv := cases["privileged pods are denied"]
	if priv.Classname != "tests/admission,extra" || priv.Failure == nil ||
		!strings.Contains(priv.Failure.Text, "message: admission webhook \"deny.example.com\" denied the request:\n100% of containers are privileged\n") {
		t.Errorf("the privileged pod's testcase: %+v", priv)
	}
	carol := cases["carol impersonates admin"]
	if carol.Error == nil || carol.Error.Type != "engine" || !strings.HasPrefix(carol.Error.Message, "read tokenFile") || carol.Failure != nil {
		t.Errorf("carol's testcase: %+v", carol)
	}
	if cm := cases["get a configmap that is not there"]; !strings.HasPrefix(cm.SystemOut, "note: storage: want 200") || cm.Failure != nil {
		t.Errorf("the configmap's testcase: %+v", cm)
	}
	if d := cases["create a deployment <with> | pipes & stars*"]; !strings.Contains(d.SystemOut, "kproxy's prediction disagrees") ||
		!strings.Contains(d.SystemOut, "kproxy predicted: 403 Forbidden at validating-admission") {
		t.Errorf("the deployment's testcase: %+v", d)
	}

	// Characters XML cannot hold do not break the document.
	r := &Report{Engine: "local", Results: []Result{{File: "a.yaml", Name: "nul\x00 and ]]> end", Failures: []string{"bad\x01 <thing>"}, Got: Verdict{Message: "x]]>y\x02"}}}}
	b.Reset()
	if err := WriteJUnit(&b, r, "s"); err != nil {
		t.Fatal(err)
	}
	doc = readSuites{}
	if err := xml.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatalf("%v:\n%s", err, b.String())
	}
	c := doc.Suites[0].Cases[0]
	if c.Name != "nul\uFFFD and ]]> end" || c.Failure.Message != "bad\uFFFD <thing>" || !strings.Contains(c.Failure.Text, "message: x]]>y\uFFFD") {
		t.Errorf("testcase %q, failure %+v", c.Name, c.Failure)
	}
}

func TestWriteGitHub(t *testing.T) {
	var out, summary bytes.Buffer
	if err := WriteGitHub(&out, &summary, sampleReport()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	// Last, one plain line of totals for the log (a probe: without a
	// step summary, the log had only the annotations).
	if last := lines[len(lines)-1]; last != "kproxy test: 3 passed, 2 failed, 1 error of 6 cases (engine local, snapshot snapshots/prod, 1.235s)" {
		t.Errorf("the last line %q, want the totals", last)
	}
	lines = lines[:len(lines)-1]
	if len(lines) != 5 { // 2 failures, 1 error, 1 disagreement, 1 what-if change
		t.Errorf("%d workflow commands, want 5:\n%s", len(lines), out.String())
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "::error ") && !strings.HasPrefix(l, "::warning ") {
			t.Errorf("not a workflow command: %q", l)
		}
	}
	var priv string
	for _, l := range lines {
		if strings.Contains(l, "privileged pods are denied") {
			priv = l
		}
	}
	wantPrefix := "::error file=tests/admission%2Cextra.yaml,line=5,title=kproxy test%3A privileged pods are denied::message: want a match for "
	if !strings.HasPrefix(priv, wantPrefix) {
		t.Errorf("the privileged pod's annotation:\n%s\nwant it to start with\n%s", priv, wantPrefix)
	}
	for _, want := range []string{
		`denied the request:\n100%25 of containers are privileged"%0Agot: 403 Forbidden at validating-admission%0A`,
		"explanation (validating-admission): ValidatingAdmissionPolicy deny-privileged: 100%25 of containers privileged, limit 0%25%0Aexpression: ",
	} {
		if !strings.Contains(priv, want) {
			t.Errorf("the privileged pod's annotation lacks %q:\n%s", want, priv)
		}
	}
	if !strings.Contains(out.String(), "::warning file=tests/rbac.yaml,line=4,title=kproxy what-if%3A alice can list pods::200 -> 403 Forbidden at authorization") {
		t.Errorf("no what-if warning:\n%s", out.String())
	}

	for _, tc := range []struct{ in, data, property string }{
		{"plain", "plain", "plain"},
		{"100%", "100%25", "100%25"},
		{"a\nb\r\nc", "a%0Ab%0D%0Ac", "a%0Ab%0D%0Ac"},
		{"f,g:h", "f,g:h", "f%2Cg%3Ah"},
		{"%0A", "%250A", "%250A"},
	} {
		if got := ghData(tc.in); got != tc.data {
			t.Errorf("ghData(%q) = %q, want %q", tc.in, got, tc.data)
		}
		if got := ghProperty(tc.in); got != tc.property {
			t.Errorf("ghProperty(%q) = %q, want %q", tc.in, got, tc.property)
		}
	}

	md := summary.String()
	for _, want := range []string{
		"## kproxy test failed: 3 passed, 2 failed, 1 error\n",
		"| Case | Request | Failures | Got | Deciding stage |\n",
		"| bob cannot delete pods<br>`tests/rbac.yaml:12` | `DELETE /api/v1/namespaces/default/pods/web` | status: want 403, got 200<br>stage: want authorization, got none | 200 | none: RBAC: allowed by RoleBinding default/admins |\n",
		"### What-if (overlay overlays/tighten-rbac, --authorization-mode=Node,RBAC): 1 case changes\n",
		"create a deployment \\<with\\> \\| pipes \\& stars\\*",
		"<details><summary>3 passed</summary>",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the step summary lacks %q:\n%s", want, md)
		}
	}

	// No failures: no failed table, and a nil summary is fine.
	out.Reset()
	pass := &Report{Engine: "local", Results: []Result{{File: "a.yaml", Line: 3, Name: "ok", Got: Verdict{Status: 200, Stage: testfile.StageNone}}}}
	if err := WriteGitHub(&out, nil, pass); err != nil || out.String() != "kproxy test: 1 passed, 0 failed, 0 errors of 1 case (engine local, 0s)\n" {
		t.Errorf("a passing run wrote %q, %v; want its totals alone", out.String(), err)
	}
	summary.Reset()
	if err := WriteGitHub(&out, &summary, pass); err != nil {
		t.Fatal(err)
	}
	if md := summary.String(); !strings.HasPrefix(md, "## kproxy test passed: 1 passed, 0 failed, 0 errors\n") || strings.Contains(md, "Failed cases") {
		t.Errorf("a passing run's summary:\n%s", md)
	}
}

func TestWriteJSON(t *testing.T) {
	var b bytes.Buffer
	want := sampleReport()
	if err := WriteJSON(&b, want); err != nil {
		t.Fatal(err)
	}
	var got Report
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Results) != len(want.Results) || got.Results[1].Failures[1] != want.Results[1].Failures[1] ||
		!got.Started.Equal(want.Started) || got.Duration != want.Duration || len(got.Changes) != 1 || got.Disagreements != 1 {
		t.Errorf("the JSON does not read back as the report:\n%s", b.String())
	}
	if !strings.Contains(b.String(), "\n  \"engine\": \"local\",\n") || strings.Contains(b.String(), `\u003c`) {
		t.Errorf("want indented JSON without HTML escapes:\n%s", b.String())
	}
}

func TestTruncateMiddle(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"GET /api/v1/namespaces/x/pods", 13, "GET /.../pods"},
		{"ééééééééééé", 8, "éé...ééé"},
	} {
		if got := truncateMiddle(tc.in, tc.n); got != tc.want {
			t.Errorf("truncateMiddle(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}
