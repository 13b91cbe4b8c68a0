package citest

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/testfile"
)

func TestCompare(t *testing.T) {
	forbidden := Verdict{Status: 403, Stage: "authorization", Reason: "Forbidden", Message: `pods is forbidden: User "alice" cannot list resource "pods"`}
	created := Verdict{Status: 201, Stage: testfile.StageNone}
	exists := Verdict{Status: 409, Stage: "storage", Reason: "AlreadyExists"}
	for _, tc := range []struct {
		name        string
		e           testfile.Expect
		v           Verdict
		o           CompareOptions
		fail, noted []string
	}{
		{"all match", testfile.Expect{Status: 403, Stage: "authorization", Reason: "Forbidden", Message: `cannot list resource "pods"`}, forbidden, CompareOptions{}, nil, nil},
		{"status", testfile.Expect{Status: 200}, forbidden, CompareOptions{}, []string{"status: want 200, got 403 Forbidden at authorization"}, nil},
		{"stage", testfile.Expect{Stage: "impersonation"}, forbidden, CompareOptions{}, []string{"stage: want impersonation, got authorization"}, nil},
		{"success is stage none", testfile.Expect{Stage: "none"}, created, CompareOptions{}, nil, nil},
		{"reason", testfile.Expect{Reason: "Invalid"}, forbidden, CompareOptions{}, []string{`reason: want Invalid, got "Forbidden"`}, nil},
		{"message", testfile.Expect{Message: "^nope"}, forbidden, CompareOptions{}, []string{`message: want a match for "^nope"`}, nil},
		{"unknown is never a pass", testfile.Expect{Status: 403}, Verdict{Stage: record.StageUnknown, Unknown: "a Secret"}, CompareOptions{}, []string{"no verdict to compare: a Secret"}, nil},
		{"storage not compared", testfile.Expect{Status: 201}, exists, CompareOptions{}, nil, []string{"storage: want 201, got 409 AlreadyExists at storage"}},
		{"storage expected, success got", testfile.Expect{Status: 404, Stage: "storage"}, created, CompareOptions{}, nil, []string{"not compared"}},
		{"storage compared when asked", testfile.Expect{Status: 201}, exists, CompareOptions{Storage: true}, []string{"status: want 201, got 409"}, nil},
		{"storage expected, refused earlier: compared", testfile.Expect{Status: 404, Stage: "storage"}, forbidden, CompareOptions{}, []string{"status: want 404", "stage: want storage, got authorization"}, nil},
		{"warnings match", testfile.Expect{Warnings: []string{"deprecated"}}, Verdict{Status: 200, Stage: "none", Warnings: []string{"v1 Foo is deprecated"}}, CompareOptions{}, nil, nil},
		{"warnings missing", testfile.Expect{Warnings: []string{"deprecated"}}, Verdict{Status: 200, Stage: "none"}, CompareOptions{}, []string{"warnings: want one matching"}, nil},
		{"warnings not predicted locally", testfile.Expect{Status: 200, Warnings: []string{"deprecated"}}, Verdict{Status: 200, Stage: "none", WarningsUnknown: true}, CompareOptions{}, nil, []string{"warnings: the local engine does not predict"}},
		// The cluster engine: the apiserver's answer is the verdict even
		// where kproxy cannot tell the stage; the reports print the
		// disagreement beside the failures, so a failure does not repeat it.
		{"cluster: kproxy could not predict", testfile.Expect{Status: 200, Stage: "none"},
			Verdict{Status: 403, Reason: "Forbidden", Stage: record.StageUnknown, Predicted: &record.Prediction{Stage: record.StageUnknown, Message: "cannot predict: authentication: ..."}, Disagreement: "kproxy could not predict it: cannot predict: authentication: ..."},
			CompareOptions{}, []string{"status: want 200, got 403 Forbidden, stage unknown", "stage: want none; the deciding stage is unknown (kproxy could not predict it)"}, nil},
		{"cluster: kproxy disagrees", testfile.Expect{Stage: "authorization"},
			Verdict{Status: 403, Reason: "Forbidden", Stage: record.StageUnknown, Predicted: &record.Prediction{Status: 201}, Disagreement: "kproxy predicted 201, the apiserver answered 403 Forbidden"},
			CompareOptions{}, []string{"stage: want authorization; the deciding stage is unknown (kproxy's prediction disagrees with the apiserver)"}, nil},
		{"stage unknown on disagreement", testfile.Expect{Status: 403, Stage: "authorization"}, Verdict{Status: 403, Stage: record.StageUnknown, Disagreement: "kproxy predicted 200"}, CompareOptions{}, []string{"the deciding stage is unknown (kproxy predicted 200)"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fail, noted := Compare(tc.e, tc.v, tc.o)
			check := func(what string, got, want []string) {
				t.Helper()
				if len(want) == 0 && len(got) > 0 {
					t.Errorf("%s: got %q, want none", what, got)
				}
				for _, w := range want {
					found := false
					for _, g := range got {
						found = found || strings.Contains(g, w)
					}
					if !found {
						t.Errorf("%s: %q has nothing like %q", what, got, w)
					}
				}
			}
			check("failures", fail, tc.fail)
			check("not compared", noted, tc.noted)
		})
	}
}

func TestDiff(t *testing.T) {
	before := &Report{Results: []Result{
		{File: "f", Name: "a", Got: Verdict{Status: 200, Stage: "none"}},
		{File: "f", Name: "b", Got: Verdict{Status: 201, Stage: "none"}},
		{File: "f", Name: "c", Got: Verdict{Status: 403, Stage: "authorization", Reason: "Forbidden"}},
		{File: "f", Name: "d", Got: Verdict{Status: 422, Stage: "validation", Reason: "Invalid", Message: `W "w" is invalid: [spec.a: Invalid value: 1, spec.b: Required value]`}},
		{File: "f", Name: "e", Got: Verdict{Status: 422, Stage: "validation", Reason: "Invalid", Message: `W "w" is invalid: [spec.a: Invalid value: 1, spec.b: Required value]`}},
		{File: "f", Name: "g", Got: Verdict{Status: 422, Stage: "validation", Reason: "Invalid", Message: `ConfigMap "g-82qrt" is invalid: data[bad key]: Invalid value: "bad key"`}},
		{File: "f", Name: "h", Got: Verdict{Status: 201, Stage: "none", Warnings: []string{"w1 says", "w2 says"}}},
		{File: "f", Name: "i", Got: Verdict{Status: 201, Stage: "none", Warnings: []string{"w1 says", "w2 says"}}},
	}}
	after := &Report{Results: []Result{
		{File: "f", Name: "a", Got: Verdict{Status: 200, Stage: "none", Explanation: "changed wording only"}},
		{File: "f", Name: "b", Got: Verdict{Status: 422, Stage: "validating-admission", Reason: "Invalid"}},
		{File: "f", Name: "c", Got: Verdict{Status: 403, Stage: "authorization", Reason: "Forbidden"}},
		// A custom resource's schema errors, listed in another order (the
		// apiserver's own order varies): no change.
		{File: "f", Name: "d", Got: Verdict{Status: 422, Stage: "validation", Reason: "Invalid", Message: `W "w" is invalid: [spec.b: Required value, spec.a: Invalid value: 1]`}},
		{File: "f", Name: "e", Got: Verdict{Status: 422, Stage: "validation", Reason: "Invalid", Message: `W "w" is invalid: [spec.a: Invalid value: 2, spec.b: Required value]`}},
		// A name generateName drew again for the same case: no change.
		{File: "f", Name: "g", Got: Verdict{Status: 422, Stage: "validation", Reason: "Invalid", Message: `ConfigMap "g-zmkst" is invalid: data[bad key]: Invalid value: "bad key"`}},
		// Two validating webhooks' warnings, in the order their answers
		// came back: no change; a warning gone is one.
		{File: "f", Name: "h", Got: Verdict{Status: 201, Stage: "none", Warnings: []string{"w2 says", "w1 says"}}},
		{File: "f", Name: "i", Got: Verdict{Status: 201, Stage: "none", Warnings: []string{"w2 says"}}},
	}}
	ch := Diff(before, after)
	if len(ch) != 3 || ch[0].Name != "b" || ch[0].String() != "b: 201 → 422 Invalid at validating-admission" || ch[1].Name != "e" || ch[2].Name != "i" {
		t.Errorf("changes: %v", ch)
	}
}

func TestGenerate(t *testing.T) {
	recs := []*record.Record{
		{ID: "1", Request: record.Request{Method: "GET", Path: "/api/v1/namespaces/a/pods", User: "alice", Groups: []string{"devs", "system:authenticated"}, Verb: "list", Resource: "pods", Namespace: "a",
			Headers: map[string][]string{"Authorization": {"Bearer REDACTED"}, "Accept": {"application/json"}, "User-Agent": {"kubectl"}}},
			Predicted: record.Prediction{Status: 403, Stage: "authorization"}, Actual: record.Actual{Status: 403, Reason: "Forbidden", Warnings: []string{"a (warning)", `299 - "v1 Endpoints is deprecated in v1.33+"`}}},
		{ID: "2", Request: record.Request{Method: "POST", Path: "/api/v1/namespaces/a/configmaps", User: "admin", Verb: "create", Resource: "configmaps", Namespace: "a", BodyBytes: 40,
			ContentType: "application/yaml", Body: json.RawMessage(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}`)},
			Predicted: record.Prediction{Status: 201}, Actual: record.Actual{Status: 201}},
		{ID: "3", Request: record.Request{Method: "POST", Path: "/api/v1/namespaces/a/configmaps", User: "admin", BodyBytes: 40}, Actual: record.Actual{Status: 201}},
		{ID: "4", Request: record.Request{Method: "GET", Path: "/api"}, Identity: "rejected", Actual: record.Actual{Status: 401}},
		{ID: "5", Request: record.Request{Method: "GET", Path: "/version", User: "system:anonymous"}, Predicted: record.Prediction{Status: 500, Stage: "decode"}, Actual: record.Actual{Status: 200}},
		{ID: "6", Request: record.Request{Method: "GET", Path: "/api/v1/namespaces/a/pods", User: "alice", Verb: "list", Resource: "pods", Namespace: "a"}, Predicted: record.Prediction{Status: 403, Stage: "authorization"}, Actual: record.Actual{Status: 403, Reason: "Forbidden"}},
		{ID: "7", Request: record.Request{Method: "TRACE", Path: "/api/v1/namespaces/a/pods", User: "admin", Resource: "pods", Namespace: "a"}, Predicted: record.Prediction{Status: 405, Stage: "decode"}, Actual: record.Actual{Status: 405, Reason: "MethodNotAllowed"}},
	}
	f, notes := Generate(recs, "rec")
	if len(f.Cases) != 4 || len(notes) != 3 {
		t.Fatalf("%d cases, notes %q", len(f.Cases), notes)
	}
	if !strings.Contains(notes[0], "--capture-bodies") || !strings.Contains(notes[1], "credentials are never captured") || !strings.Contains(notes[2], "not TRACE") {
		t.Errorf("notes: %q", notes)
	}
	c := f.Cases[0]
	if c.User != "alice" || len(c.Groups) != 1 || c.Expect.Status != 403 || c.Expect.Stage != "authorization" || c.Expect.Reason != "Forbidden" ||
		c.Request.Headers["Accept"] != "application/json" || len(c.Request.Headers) != 1 || c.Expect.Warnings[0] != `^a \(warning\)$` ||
		c.Expect.Warnings[1] != `^v1 Endpoints is deprecated in v1\.33\+$` {
		t.Errorf("case 0: %+v", c)
	}
	if w := f.Cases[1]; w.Request.ContentType != "application/json" || w.Request.Body == nil || w.Expect.Stage != "none" {
		t.Errorf("the write: %+v", w)
	}
	if v := f.Cases[2]; !v.Anonymous || v.Expect.Stage != "" || !strings.Contains(v.Note, "the deciding stage is not asserted") {
		t.Errorf("a disagreement: %+v", v)
	}
	if f.Cases[3].Name != f.Cases[0].Name+" #2" {
		t.Errorf("duplicate names: %q", f.Cases[3].Name)
	}
	b, err := testfile.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testfile.Parse("generated.yaml", b); err != nil {
		t.Errorf("the generated file does not parse: %v\n%s", err, b)
	}
}
