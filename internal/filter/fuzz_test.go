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
		checkRequestOnly(t, s)
	})
}

// checkRequestOnly: a request-only filter decides as Match does once the
// user is known; decided without the user, it decides as Match does
// whoever the user turns out to be.
func checkRequestOnly(t *testing.T, s string) {
	e, err := ParseRequestOnly(s)
	if err != nil {
		return
	}
	for _, fx := range fixtures {
		want := e.Match(fx.rec)
		if m, d := e.MatchRequest(fx.rec, true); !d || m != want {
			t.Fatalf("%q on %s with the user known: MatchRequest %v (decided %v), Match %v", s, fx.name, m, d, want)
		}
		m, d := e.MatchRequest(fx.rec, false)
		if !d {
			continue
		}
		other := *fx.rec
		other.Request.User, other.Request.Groups, other.Request.ActingAs = "someone-else", []string{"other"}, ""
		if m != want || m != e.Match(&other) {
			t.Fatalf("%q on %s decided %v without the user, but Match says %v for its user and %v for another", s, fx.name, m, want, e.Match(&other))
		}
	}
}
