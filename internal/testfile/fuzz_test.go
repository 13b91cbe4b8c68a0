package testfile

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParse: a test file is untrusted input (it comes from a pull
// request). Parse never panics; it returns a file or errors that name
// the file; a file it accepts has cases that all have a name, a method,
// a path starting with / and something to compare, and survives Marshal
// and Parse again.
func FuzzParse(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte("apiVersion: kproxy.dev/v1alpha1\nkind: Test\ncases:\n- name: a\n  user: x\n  request: {path: /api}\n  expect: {stage: authz}\n"))
	f.Add([]byte("apiVersion: kproxy.dev/v1alpha1\nkind: Test\ncases:\n- name: a\n  token: t\n  impersonate: {user: u, extra: {k: [v]}}\n  request: {method: PATCH, path: /apis/apps/v1/namespaces/a/deployments/d, body: '{}', contentType: application/merge-patch+json, headers: {Accept: a}}\n  expect: {status: 422, message: '(?i)invalid', warnings: ['x.*']}\n"))
	f.Add([]byte("cases: [{name: &a x, user: *a}]\n"))
	f.Add([]byte("apiVersion: kproxy.dev/v1alpha1\nkind: Test\ncases:\n- name: a\n  request: {path: /api, body: [1, {a: b}]}\n  expect: {status: 200}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		file, err := Parse("fuzz.yaml", b)
		if err != nil {
			var fe *Error
			if !errors.As(err, &fe) && !strings.Contains(err.Error(), "fuzz.yaml") {
				t.Fatalf("an error that does not name the file: %v", err)
			}
			return
		}
		for _, c := range file.Cases {
			if c.Name == "" || c.Request.Method == "" || !strings.HasPrefix(c.Request.Path, "/") {
				t.Fatalf("accepted a case without name, method or path: %+v", c)
			}
			e := c.Expect
			if e.Status == 0 && e.Stage == "" && e.Reason == "" && e.Message == "" && len(e.Warnings) == 0 {
				t.Fatalf("accepted a case with nothing to compare: %+v", c)
			}
			if _, _, err := c.BodyBytes(); err != nil && c.Request.BodyFile == "" {
				t.Fatalf("an inline body that does not encode: %v", err)
			}
		}
		out, err := Marshal(file)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		again, err := Parse("again.yaml", out)
		if err != nil {
			t.Fatalf("what Marshal wrote does not parse: %v\n%s", err, out)
		}
		if len(again.Cases) != len(file.Cases) {
			t.Fatalf("%d cases, then %d", len(file.Cases), len(again.Cases))
		}
	})
}
