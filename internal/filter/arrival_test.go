package filter

import (
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/record"
)

func TestParseRequestOnly(t *testing.T) {
	for _, tc := range []struct {
		expr, err string // err: "" when it parses
	}{
		{"", ""},
		{"~n payments", ""},
		{`~u alice | ~g "system:serviceaccounts:*" & !~v watch`, ""},
		{"~r pods/log ~m GET ~p ^/api/ exec", ""},
		{"~c 403", "~c needs the apiserver's answer"},
		{"~n a & (~slow 1s | ~v get)", "~slow needs the request's latency"},
		{"!~x", "~x needs the replay's prediction"},
		{"~s authorization | ~unknown", "~s, ~unknown needs the replay's prediction"},
		{"~n (", "filter: "}, // a syntax error stays one
	} {
		_, err := ParseRequestOnly(tc.expr)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("ParseRequestOnly(%q): %v", tc.expr, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParseRequestOnly(%q) = %v, want an error containing %q", tc.expr, err, tc.err)
		case tc.err != "" && !strings.HasPrefix(tc.err, "filter") && !strings.Contains(err.Error(), "~u ~g ~v ~r ~n ~m ~p"):
			t.Errorf("ParseRequestOnly(%q) = %v: the error does not say which terms it may use", tc.expr, err)
		}
	}
}

func TestMatchRequest(t *testing.T) {
	get := &record.Record{Request: record.Request{
		Method: "GET", Path: "/api/v1/namespaces/payments/pods/web", Verb: "get",
		Resource: "pods", Namespace: "payments", User: "alice", Groups: []string{"dev"},
	}}
	for _, tc := range []struct {
		expr           string
		userKnown      bool
		match, decided bool
		whenKnown      bool // the answer once the user is known
	}{
		{"", false, true, true, true},
		{"~n payments", false, true, true, true},
		{"~n kube-system", false, false, true, false},
		{"~u alice", false, false, false, true},
		{"~u bob", false, false, false, false},
		{"~u bob | ~n payments", false, true, true, true},      // decided without the user
		{"~u bob & ~n kube-system", false, false, true, false}, // likewise
		{"~u bob & ~n payments", false, false, false, false},
		{"!~g dev", false, false, false, false},
		{"!(~g ops | ~v watch)", false, false, false, true},
		{"!~v get | ~u alice", false, false, false, true},
		{"~u alice", true, true, true, true},
		{"~r pods & ~p ^/api/v1/", false, true, true, true},
	} {
		e, err := ParseRequestOnly(tc.expr)
		if err != nil {
			t.Fatalf("ParseRequestOnly(%q): %v", tc.expr, err)
		}
		match, decided := e.MatchRequest(get, tc.userKnown)
		if decided != tc.decided || decided && match != tc.match {
			t.Errorf("%q (user known %v): match %v decided %v, want match %v decided %v", tc.expr, tc.userKnown, match, decided, tc.match, tc.decided)
		}
		// Once the user is known, it is decided, and as Match decides.
		if m, d := e.MatchRequest(get, true); !d || m != tc.whenKnown || m != e.Match(get) {
			t.Errorf("%q with the user known: match %v decided %v, want %v decided (Match: %v)", tc.expr, m, d, tc.whenKnown, e.Match(get))
		}
	}
}
