package filter

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParse checks that Parse never panics; that an error is a
// *SyntaxError pointing into the expression; and that on success String
// parses back to the same normal form, selecting the same fixtures, and
// Match never panics.
func FuzzParse(f *testing.F) {
	for _, c := range matchCases {
		f.Add(c.expr)
	}
	for _, c := range badCases {
		f.Add(c.expr)
	}
	for _, s := range benchExprs {
		f.Add(s)
	}
	f.Add(`~u "a\\\"b c" | !(~r deployments.apps/scale ~c 4xx,503) ~slow 1m30s`)
	f.Add("~x\n~c abc\n~x")
	f.Add("\"\xff\" ~p \xff")
	f.Fuzz(func(t *testing.T, s string) {
		e, err := Parse(s)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("Parse(%q): %T is not a *SyntaxError", s, err)
			}
			if se.Expr != s || se.Pos < 0 || se.Pos > len(s) || se.Msg == "" {
				t.Fatalf("Parse(%q): bad error %#v", s, se)
			}
			_ = se.Error()
			if c := se.Caret(); strings.Count(c, "\n") != 1 || !strings.HasSuffix(c, "^") {
				t.Fatalf("Parse(%q): Caret() = %q", s, c)
			}
			return
		}
		norm := e.String()
		e2, err := Parse(norm)
		if err != nil {
			t.Fatalf("Parse(%q) succeeds but its String %q does not parse: %v", s, norm, err)
		}
		if n2 := e2.String(); n2 != norm {
			t.Fatalf("String is not stable: %q -> %q -> %q", s, norm, n2)
		}
		for _, fx := range fixtures {
			if e.Match(fx.rec) != e2.Match(fx.rec) {
				t.Fatalf("%q and its String %q disagree on fixture %s", s, norm, fx.name)
			}
		}
		_ = e.Match(nil)
	})
}
