package testfile

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const good = `apiVersion: kproxy.dev/v1alpha1
kind: Test
metadata: {name: ok}
cases:
- name: alice lists pods
  user: alice
  groups: [devs]
  request: {path: /api/v1/namespaces/default/pods}
  expect: {status: 403, stage: authorization, reason: Forbidden, message: 'cannot list'}
- name: create
  user: alice
  request:
    method: post
    path: /api/v1/namespaces/default/configmaps
    body: {apiVersion: v1, kind: ConfigMap, metadata: {name: x}}
  expect: {status: 201, stage: none}
`

func TestParseGood(t *testing.T) {
	f, err := Parse("good.yaml", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Cases) != 2 || f.Cases[0].Line != 5 || f.Cases[1].Line != 10 {
		t.Fatalf("cases/lines: %+v", f.Cases)
	}
	c := f.Cases[1]
	if c.Request.Method != "POST" {
		t.Errorf("method %q, want POST (upper-cased)", c.Request.Method)
	}
	b, ct, err := c.BodyBytes()
	if err != nil || ct != "application/json" || !strings.Contains(string(b), `"kind":"ConfigMap"`) {
		t.Errorf("body %s %q %v", b, ct, err)
	}
	if f.Cases[0].Request.Method != "GET" {
		t.Errorf("default method %q", f.Cases[0].Request.Method)
	}
}

// TestParseErrors: every mistake names the file, the line and the field.
func TestParseErrors(t *testing.T) {
	head := "apiVersion: kproxy.dev/v1alpha1\nkind: Test\ncases:\n"
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"unknown field", head + "- name: a\n  user: x\n  request: {path: /api}\n  expect: {status: 200, stauts: 1}\n",
			[]string{"bad.yaml:7", `unknown field "stauts" in expect`, "known fields: message, reason, stage, status, warnings"}},
		{"unknown case field", head + "- name: a\n  usr: x\n  request: {path: /api}\n  expect: {status: 200}\n",
			[]string{"bad.yaml:5", `unknown field "usr" in a case`}},
		{"bad stage", head + "- name: a\n  user: x\n  request: {path: /api}\n  expect:\n    stage: authz\n",
			[]string{"bad.yaml:8", "cases[0].expect.stage", `"authz" is not a stage`}},
		{"wrong type", head + "- name: a\n  user: x\n  request: {path: /api}\n  expect: {status: forbidden}\n",
			[]string{"bad.yaml:7: cases[0].expect.status: want a number, got a string `forbidden`"}},
		{"wrong type, a list", head + "- name: a\n  user: x\n  groups: team-a\n  request: {path: /api}\n  expect: {status: 200}\n",
			[]string{"bad.yaml:6: cases[0].groups: want a list of strings, got a string `team-a`"}},
		{"wrong type, a mapping for a string", head + "- name: a\n  user: x\n  request:\n    path: {a: b}\n  expect: {status: 200}\n",
			[]string{"bad.yaml:7: cases[0].request.path: want a string, got a mapping"}},
		{"no expect", head + "- name: a\n  user: x\n  request: {path: /api}\n",
			[]string{"bad.yaml:4", "cases[0].expect", "nothing to compare"}},
		{"no path", head + "- name: a\n  user: x\n  request: {method: GET}\n  expect: {status: 200}\n",
			[]string{"bad.yaml:6", "cases[0].request.path", "missing"}},
		{"relative path", head + "- name: a\n  user: x\n  request: {path: api/v1}\n  expect: {status: 200}\n",
			[]string{"cases[0].request.path", "starting with /"}},
		{"bad method", head + "- name: a\n  user: x\n  request: {method: FETCH, path: /api}\n  expect: {status: 200}\n",
			[]string{"cases[0].request.method", `"FETCH"`}},
		{"two identities", head + "- name: a\n  user: x\n  token: t\n  request: {path: /api}\n  expect: {status: 200}\n",
			[]string{"bad.yaml:4", "user and token"}},
		{"groups without user", head + "- name: a\n  groups: [g]\n  request: {path: /api}\n  expect: {status: 200}\n",
			[]string{"bad.yaml:5", "cases[0].groups", "add user"}},
		{"bad regexp", head + "- name: a\n  user: x\n  request: {path: /api}\n  expect: {message: '('}\n",
			[]string{"bad.yaml:7", "cases[0].expect.message", "not a regular expression"}},
		{"duplicate names", head + "- name: a\n  user: x\n  request: {path: /api}\n  expect: {status: 200}\n- name: a\n  user: x\n  request: {path: /api}\n  expect: {status: 200}\n",
			[]string{"bad.yaml:8", "cases[1].name", "line 4"}},
		{"wrong version", "apiVersion: kproxy.dev/v2\nkind: Test\ncases:\n- name: a\n  user: x\n  request: {path: /api}\n  expect: {status: 200}\n",
			[]string{"bad.yaml:1", "apiVersion", "want kproxy.dev/v1alpha1"}},
		{"no cases", "apiVersion: kproxy.dev/v1alpha1\nkind: Test\n",
			[]string{"bad.yaml", "no cases"}},
		{"not yaml", "apiVersion: [\n", []string{"bad.yaml"}},
		{"body and bodyFile", head + "- name: a\n  user: x\n  request: {method: POST, path: /api/v1/namespaces, body: 'x', bodyFile: f.json}\n  expect: {status: 201}\n",
			[]string{"cases[0].request.bodyFile", "not both"}},
		{"impersonate without user", head + "- name: a\n  user: x\n  impersonate: {groups: [g]}\n  request: {path: /api}\n  expect: {status: 200}\n",
			[]string{"cases[0].impersonate.user", "Impersonate-User"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("bad.yaml", []byte(tc.in))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(good), 0o644))
	must(os.MkdirAll(filepath.Join(dir, "overlay"), 0o755))
	// Other YAML in the directory (overlays, bodies) is not a test file.
	must(os.WriteFile(filepath.Join(dir, "overlay", "role.yaml"), []byte("apiVersion: v1\nkind: ConfigMap\n"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "b.yml"), []byte(strings.Replace(good, "name: ok", "name: b", 1)), 0o644))
	files, err := Load(dir)
	must(err)
	if len(files) != 2 {
		t.Fatalf("loaded %d files, want 2", len(files))
	}
	if _, err := Load(filepath.Join(dir, "overlay")); err == nil || !strings.Contains(err.Error(), "has no test files") {
		t.Errorf("a directory without test files: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing path loaded")
	}
}

// TestMarshalRoundTrip: what generate writes, Parse reads back.
func TestMarshalRoundTrip(t *testing.T) {
	f, err := Parse("good.yaml", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	g, err := Parse("again.yaml", b)
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if len(g.Cases) != 2 || !reflect.DeepEqual(g.Cases[0].Expect, f.Cases[0].Expect) {
		t.Errorf("round trip changed the cases:\n%s", b)
	}
}
