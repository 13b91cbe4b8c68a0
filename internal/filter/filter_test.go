package filter

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/record"
)

// fixtures are the records the tables match against, by name.
var fixtures = []struct {
	name string
	rec  *record.Record
}{
	{"get", &record.Record{
		Request: record.Request{
			Method: "GET", Path: "/api/v1/namespaces/default/pods/web",
			User: "alice", Groups: []string{"dev", "system:authenticated"},
			Verb: "get", APIVersion: "v1", Resource: "pods", Namespace: "default", Name: "web",
		},
		Predicted: record.Prediction{Status: 200},
		Actual:    record.Actual{Status: 200},
		Latency:   record.Latency{TotalNs: int64(10 * time.Millisecond)},
	}},
	{"log", &record.Record{
		Request: record.Request{
			Method: "GET", Path: "/api/v1/namespaces/default/pods/web/log", Query: "follow=true",
			User: "alice", Groups: []string{"dev", "system:authenticated"},
			Verb: "get", APIVersion: "v1", Resource: "pods", Subresource: "log", Namespace: "default", Name: "web",
		},
		Predicted: record.Prediction{Status: 403, Stage: record.StageAuthorization},
		Actual:    record.Actual{Status: 403},
		Latency:   record.Latency{TotalNs: int64(2 * time.Second)},
	}},
	{"deploy", &record.Record{
		Request: record.Request{
			Method: "POST", Path: "/apis/apps/v1/namespaces/kube-system/deployments",
			User: "bob", Groups: []string{"ops", "system:authenticated"},
			Verb: "create", APIGroup: "apps", APIVersion: "v1", Resource: "deployments", Namespace: "kube-system",
		},
		Predicted: record.Prediction{Status: 201},
		Actual:    record.Actual{Status: 422},
		Latency:   record.Latency{TotalNs: int64(600 * time.Millisecond)},
	}},
	{"sa", &record.Record{
		Request: record.Request{
			Method: "GET", Path: "/api/v1/nodes", Query: "limit=500",
			User:   "system:serviceaccount:kube-system:coredns",
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"},
			Verb:   "list", APIVersion: "v1", Resource: "nodes",
		},
		Predicted: record.Prediction{Status: 0, Stage: record.StageUnknown},
		Actual:    record.Actual{Status: 200},
		Latency:   record.Latency{TotalNs: int64(100 * time.Millisecond)},
	}},
	{"imp", &record.Record{
		Request: record.Request{
			Method: "DELETE", Path: "/apis/apps/v1/namespaces/prod/deployments/api/scale",
			User: "admin", ActingAs: "jane doe", Groups: []string{"system:masters"},
			Verb: "delete", APIGroup: "apps", APIVersion: "v1", Resource: "deployments", Subresource: "scale",
			Namespace: "prod", Name: "api",
		},
		Predicted: record.Prediction{Status: 401, Stage: record.StageAuthentication},
		Actual:    record.Actual{Status: 401},
		Latency:   record.Latency{TotalNs: int64(50 * time.Millisecond)},
	}},
	{"health", &record.Record{
		Request:   record.Request{Method: "get", Path: "/healthz", Verb: "get"},
		Predicted: record.Prediction{Status: 200},
		Actual:    record.Actual{Status: 0, Error: "connection refused"},
	}},
	{"hook", &record.Record{
		Request: record.Request{
			Method: "PATCH", Path: "/api/v1/namespaces/default/configmaps/cfg",
			User: "bob", Groups: []string{"ops", "system:authenticated"},
			Verb: "patch", APIVersion: "v1", Resource: "configmaps", Namespace: "default", Name: "cfg",
		},
		Predicted: record.Prediction{Status: 400, Stage: record.StageValidatingAdmission},
		Actual:    record.Actual{Status: 500},
		Latency:   record.Latency{TotalNs: int64(time.Second)},
	}},
}

const all = "get log deploy sa imp health hook"

// matchCases lists expressions and the fixtures each selects.
var matchCases = []struct {
	expr string
	want string // fixture names, space separated
}{
	// Empty.
	{"", all},
	{" \t\n ", all},

	// ~u: exact, acting-as, wildcards, quoting.
	{"~u alice", "get log"},
	{"~u bob", "deploy hook"},
	{"~u ali", ""},
	{"~u Alice", ""},
	{"~u admin", "imp"},
	{`~u "jane doe"`, "imp"},
	{"~u system:serviceaccount:*", "sa"},
	{"~u system:serviceaccount:kube-system:*", "sa"},
	{"~u *ice", "get log"},
	{"~u a*e", "get log"},
	{"~u *", "get log deploy sa imp hook"},
	{`~u ""`, "health"},

	// ~g
	{"~g dev", "get log"},
	{"~g system:authenticated", "get log deploy sa hook"},
	{"~g system:serviceaccounts:*", "sa"},
	{"~g system:masters", "imp"},

	// ~v
	{"~v get", "get log health"},
	{"~v list", "sa"},
	{"~v *e*", "get log deploy imp health"},

	// ~r: resource, subresource, group.
	{"~r pods", "get log"},
	{"~r pods/log", "log"},
	{"~r pods/*", "log"},
	{"~r pods/exec", ""},
	{"~r nodes", "sa"},
	{"~r deployments", "deploy imp"},
	{"~r deployments.apps", "deploy imp"},
	{"~r deployments.apps/scale", "imp"},
	{"~r deployments.extensions", ""},
	{"~r *.apps", "deploy imp"},
	{"~r *", "get log deploy sa imp hook"},
	{`~r ""`, "health"},
	{`~r "pods/log"`, "log"},

	// ~n
	{"~n default", "get log hook"},
	{"~n kube-*", "deploy"},
	{"~n *", "get log deploy imp hook"},
	{`~n ""`, "sa health"},

	// ~m: any case.
	{"~m get", "get log sa health"},
	{"~m POST", "deploy"},
	{"~m Delete", "imp"},

	// ~p: regexp over path?query.
	{"~p ^/api/v1/", "get log sa hook"},
	{"~p ^/healthz$", "health"},
	{"~p follow=true$", "log"},
	{`~p "^/api/v1/nodes\?limit=\d+$"`, "sa"},
	{`~p ^/api/v1/nodes\?limit=\d+$`, "sa"},
	{`~p "^/apis/apps/v1/.*/(deployments|statefulsets)"`, "deploy imp"},
	{"~p /log$", ""},

	// ~c: codes, classes, lists; an unanswered request has no status.
	{"~c 200", "get sa"},
	{"~c 2xx", "get sa"},
	{"~c 4xx", "log deploy imp"},
	{"~c 5xx", "hook"},
	{"~c 401,403", "log imp"},
	{"~c 4XX,500", "log deploy imp hook"},

	// ~s: the predicted deciding stage.
	{"~s authorization", "log"},
	{"~s Authentication", "imp"},
	{"~s validating-admission", "hook"},
	{"~s unknown", "sa"},
	{"~s storage", ""},

	// ~x: both known and the statuses differ; unknown and unanswered are
	// no mismatch.
	{"~x", "deploy hook"},
	{"~unknown", "sa"},
	{"~x | ~unknown", "deploy sa hook"},

	// ~slow: at least.
	{"~slow 1s", "log hook"},
	{"~slow 500ms", "log deploy hook"},
	{"~slow 1.5s", "log"},
	{"~slow 0", all},

	// Bare words: substrings of the path (not the query).
	{"pods", "get log"},
	{`"/web"`, "get log"},
	{`"pods/web"`, "get log"},
	{"follow", ""},
	{"foo!bar", ""},
	{`""`, all},

	// Operators and precedence.
	{"!~x", "get log sa imp health"},
	{"!!~x", "deploy hook"},
	{"~u alice ~c 4xx", "log"},
	{"~u alice & ~c 4xx", "log"},
	{"~v get&~n default", "get log"},
	{"(~v get)(~n default)", "get log"},
	{"~x !~unknown", "deploy hook"},
	{"~u alice | ~u bob ~c 5xx", "get log hook"},
	{"~u alice | ~u bob & ~c 5xx", "get log hook"},
	{"(~u alice | ~u bob) ~c 5xx", "hook"},
	{"!~u alice ~c 4xx", "deploy imp"},
	{"!(~u alice ~c 4xx)", "get deploy sa imp health hook"},
	{"~x ~slow 1s", "hook"},
	{"~c 4xx | ~c 5xx & ~slow 2s", "log deploy imp"},
	{"(~c 4xx | ~c 5xx) & ~slow 1s", "log hook"},
	{"~r pods !~r pods/*", "get"},
	{"((~u alice))", "get log"},
	{"~u bob | ~u alice | ~unknown", "get log deploy sa hook"},
	{"!(~x | ~unknown) & ~g system:authenticated", "get log"},
}

func TestMatch(t *testing.T) {
	for _, c := range matchCases {
		e, err := Parse(c.expr)
		if err != nil {
			t.Errorf("Parse(%q): %v", c.expr, err)
			continue
		}
		var got []string
		for _, f := range fixtures {
			if e.Match(f.rec) {
				got = append(got, f.name)
			}
		}
		if g := strings.Join(got, " "); g != c.want {
			t.Errorf("%q matches [%s], want [%s]", c.expr, g, c.want)
		}
		// The normal form selects the same records.
		e2, err := Parse(e.String())
		if err != nil {
			t.Errorf("Parse(%q) (the String of %q): %v", e.String(), c.expr, err)
			continue
		}
		for _, f := range fixtures {
			if e.Match(f.rec) != e2.Match(f.rec) {
				t.Errorf("%q and its String %q disagree on %s", c.expr, e.String(), f.name)
			}
		}
	}
}

// TestMismatchNeedsAnAnswer: ~x leaves out a status kproxy wrote because
// no answer came, as the AGREE column and --stats do (found by a probe:
// a 502 kproxy wrote was listed by ~x and counted unknown).
func TestMismatchNeedsAnAnswer(t *testing.T) {
	e, err := Parse("~x")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		a    record.Actual
		want bool
	}{
		{record.Actual{Status: 502, Error: "kproxy could not reach the apiserver at x: refused"}, false},
		{record.Actual{Status: 403, Error: record.ErrorUnforwardable + "a control character"}, false},
		{record.Actual{Status: 502}, true},
		{record.Actual{Status: 403}, true},
	} {
		if got := e.Match(&record.Record{Predicted: record.Prediction{Status: 201}, Actual: tc.a}); got != tc.want {
			t.Errorf("~x on %d %q = %v, want %v", tc.a.Status, tc.a.Error, got, tc.want)
		}
	}
}

func TestMatchNil(t *testing.T) {
	var e *Expr
	if !e.Match(fixtures[0].rec) || !e.Match(nil) {
		t.Error("a nil *Expr must match everything")
	}
	if e.String() != "" {
		t.Errorf("nil String = %q", e.String())
	}
	empty, _ := Parse("")
	if !empty.Match(nil) {
		t.Error(`Parse("") must match everything`)
	}
	x, _ := Parse("!~x")
	if x.Match(nil) {
		t.Error("a non-empty filter must not match a nil record")
	}
}

func TestString(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"  ", ""},
		{"~u alice ~c 4xx", "~u alice & ~c 4xx"},
		{"  ~x|~unknown  ", "~x | ~unknown"},
		{"(~u a | ~u b) ~v get", "(~u a | ~u b) & ~v get"},
		{"~u a | (~u b & ~v get)", "~u a | ~u b & ~v get"},
		{"(~u a | ~u b) | ~u c", "~u a | ~u b | ~u c"},
		{"~x & (~unknown & ~c 5xx)", "~x & ~unknown & ~c 5xx"},
		{"((~x))", "~x"},
		{"!(~x)", "!~x"},
		{"!(~x | ~unknown)", "!(~x | ~unknown)"},
		{"!(~x ~unknown)", "!(~x & ~unknown)"},
		{"!!~x", "!!~x"},
		{"~c 4XX,401", "~c 4xx,401"},
		{"~m post", "~m POST"},
		{"~s Authorization", "~s authorization"},
		{"~slow 1500ms", "~slow 1.5s"},
		{"~slow 0", "~slow 0s"},
		{"~r deployments.apps/scale", "~r deployments.apps/scale"},
		{`~u "jane doe"`, `~u "jane doe"`},
		{`~u "alice"`, `~u alice`},
		{`~u "~x"`, `~u "~x"`},
		{`~u "!x"`, `~u "!x"`},
		{`~u "a|b"`, `~u "a|b"`},
		{`~u ""`, `~u ""`},
		{`"pods"`, `pods`},
		{`~p "\d+"`, `~p \d+`},
		{`~p "(a|b)"`, `~p "(a|b)"`},
		{`~p "a b\d"`, `~p "a b\d"`},
		{`~u "a\"b"`, `~u "a\"b"`},
		{`~u "a\\"`, `~u a\`},
		{`~u "a b\\"`, `~u "a b\\"`},
		{`~u "a\\\"b c"`, `~u "a\\\"b c"`},
		{"foo!bar", "foo!bar"},
		{"~u\t\"x\"\n~v\rget", "~u x & ~v get"},
	} {
		e, err := Parse(c.in)
		if err != nil {
			t.Errorf("Parse(%q): %v", c.in, err)
			continue
		}
		if got := e.String(); got != c.want {
			t.Errorf("Parse(%q).String() = %q, want %q", c.in, got, c.want)
			continue
		}
		e2, err := Parse(c.want)
		if err != nil {
			t.Errorf("re-Parse(%q): %v", c.want, err)
			continue
		}
		if got := e2.String(); got != c.want {
			t.Errorf("String is not stable: %q -> %q -> %q", c.in, c.want, got)
		}
	}
}

// TestQuotedValues checks what a quoted string stands for.
func TestQuotedValues(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`~u "jane doe"`, "jane doe"},
		{`~u "a\"b"`, `a"b`},
		{`~u "a\\b"`, `a\b`},
		{`~u "a\b"`, `a\b`},
		{`~u "\d"`, `\d`},
		{`~u "(x) & | !"`, `(x) & | !`},
		{`~u ""`, ""},
		{`~u a\b`, `a\b`},
	} {
		e, err := Parse(c.in)
		if err != nil {
			t.Errorf("Parse(%q): %v", c.in, err)
			continue
		}
		got := e.root.(*userNode).pat.raw
		if got != c.want {
			t.Errorf("Parse(%q): value %q, want %q", c.in, got, c.want)
		}
	}
}

func TestPattern(t *testing.T) {
	for _, c := range []struct {
		pat, s string
		want   bool
	}{
		{"alice", "alice", true},
		{"alice", "alice2", false},
		{"", "", true},
		{"*", "", false},
		{"*", "x", true},
		{"**", "x", true},
		{"a*", "a", true},
		{"a*", "ab/c", true},
		{"*a", "ba", true},
		{"*a", "ab", false},
		{"a*a", "a", false},
		{"a*a", "aa", true},
		{"a*b*c", "abc", true},
		{"a*b*c", "axxbxxc", true},
		{"a*b*c", "acb", false},
		{"a*b*b*c", "abc", false},
		{"a*b*b*c", "abbc", true},
		{"system:serviceaccount:*:default", "system:serviceaccount:ns:default", true},
		{"system:serviceaccount:*:default", "system:serviceaccount:ns:builder", false},
		{"a?c", "abc", false}, // only * is special
		{"[a]", "[a]", true},
	} {
		p := compilePattern(c.pat)
		if got := p.match(c.s); got != c.want {
			t.Errorf("pattern %q on %q = %v, want %v", c.pat, c.s, got, c.want)
		}
	}
}

// badCases lists expressions that must not parse, with the byte offset
// and a fragment of the message.
var badCases = []struct {
	expr string
	pos  int
	msg  string
}{
	{"~z", 0, "unknown operator ~z; valid operators: ~u ~g ~v ~r ~n ~m ~p ~c ~s ~x ~unknown ~slow"},
	{"~x ~foo", 3, "unknown operator ~foo"},
	{"~", 0, "~ must be followed by an operator name; valid operators: ~u"},
	{"~ u", 0, "~ must be followed by an operator name"},
	{"~U alice", 0, "(did you mean ~u?)"},
	{"~c403", 0, "(did you mean ~c 403?)"},
	{"~slow1s", 0, "(did you mean ~slow 1s?)"},
	{"~x!~unknown", 0, "(did you mean ~x !~unknown?)"},
	{"~u", 2, "~u wants a user name, got end of expression"},
	{"~g  ", 4, "~g wants a group name, got end of expression"},
	{"~u ~v get", 3, `~u wants a user name, got ~v (to match "~v" literally, quote it)`},
	{"~n !x", 3, "~n wants a namespace, got ! (to match a value starting with ! literally, quote it)"},
	{"~v (get)", 3, "~v wants a verb such as get, list or create, got ("},
	{"~c abc", 3, `~c wants a status such as 403, 4xx or 401,403, got "abc"`},
	{"~c 600", 3, `got "600"`},
	{"~c 099", 3, `got "099"`},
	{"~c 4x", 3, `got "4x"`},
	{"~c 401,,403", 3, `got "401,,403"`},
	{"~c 401, 403", 3, `got "401,"`},
	{"~c", 2, "~c wants a status such as 403, 4xx or 401,403, got end of expression"},
	{"~slow fast", 6, `~slow wants a duration such as 500ms or 1s, got "fast"`},
	{"~slow 500", 6, "add a unit"},
	{"~slow -1s", 6, "zero or more"},
	{"~s foo", 3, `~s wants a stage name, got "foo"; the stages are authentication, impersonation, flowcontrol, authorization, decode, mutating-admission, validation, validating-admission, storage, unknown`},
	{`~s ""`, 3, "~s wants a stage name"},
	{`~p "(a"`, 3, "~p wants a valid Go regular expression: error parsing regexp: missing closing ): `(a`"},
	{`~p a**`, 3, "invalid nested repetition operator"},
	{"~p (a|b)", 3, `quote a regular expression that holds ( ) | & or spaces`},
	{"~r pods/", 3, `~r wants RESOURCE, RESOURCE/SUBRESOURCE or RESOURCE.GROUP`},
	{"~r /log", 3, `got "/log"`},
	{"~r .apps", 3, `got ".apps"`},
	{"~r pods.", 3, `got "pods."`},
	{"~r pods/log/x", 3, `got "pods/log/x"`},
	{`~m ""`, 3, "~m wants an HTTP method such as GET"},
	{"~m GET,POST", 3, `got "GET,POST"`},
	{"(~x", 3, "missing ): the ( at position 1 is never closed"},
	{"((~x)", 5, "missing ): the ( at position 1 is never closed"},
	{"~x (~unknown | (~x)", 19, "the ( at position 4 is never closed"},
	{"~x)", 2, "unexpected ) without a matching ("},
	{")", 0, "unexpected ) without a matching ("},
	{"~x | )", 5, "expected a filter term after |, got )"},
	{"()", 1, "empty parentheses"},
	{"~x ( )", 5, "empty parentheses"},
	{"~x &", 4, "expected a filter term after &, got end of expression"},
	{"~x |", 4, "expected a filter term after |, got end of expression"},
	{"!", 1, "expected a filter term after !, got end of expression"},
	{"!)", 1, "expected a filter term after !, got )"},
	{"~x && ~unknown", 4, "unexpected & after &: write a single &"},
	{"~x || ~unknown", 4, "unexpected | after |: write a single |"},
	{"| ~x", 0, "expected a filter term such as ~u alice, got |"},
	{"& ~x", 0, "got &"},
	{"~x | & ~x", 5, "expected a filter term after |, got &"},
	{`"abc`, 0, `this quoted string has no closing "`},
	{`~u "abc`, 3, `no closing "`},
	{`~u "abc\"`, 3, `no closing "`},
	{`foo"bar"`, 3, `unexpected " inside the word "foo"`},
	{`"a"b`, 3, "put a space after a closing quote"},
	{`"a""b"`, 3, "put a space after a closing quote"},
	{`"a"!~x`, 3, "put a space after a closing quote"},
	// The leftmost mistake wins, even when a later one is lexical.
	{`~c abc "unterminated`, 3, "~c wants a status"},
	{strings.Repeat("(", 101) + "~x" + strings.Repeat(")", 101), 100, "nests ! and ( more than 100 levels deep"},
	{strings.Repeat("!", 101) + "~x", 100, "more than 100 levels deep"},
}

func TestSyntaxErrors(t *testing.T) {
	for _, c := range badCases {
		e, err := Parse(c.expr)
		if err == nil {
			t.Errorf("Parse(%q) = %q, want an error", c.expr, e)
			continue
		}
		var se *SyntaxError
		if !errors.As(err, &se) {
			t.Errorf("Parse(%q): %T is not a *SyntaxError", c.expr, err)
			continue
		}
		if se.Expr != c.expr {
			t.Errorf("Parse(%q): Expr = %q", c.expr, se.Expr)
		}
		if se.Pos != c.pos || !strings.Contains(se.Msg, c.msg) {
			t.Errorf("Parse(%q):\n  got  pos %d: %s\n  want pos %d: ...%s...", c.expr, se.Pos, se.Msg, c.pos, c.msg)
		}
		if want := fmt.Sprintf("filter: %s at position %d", se.Msg, se.Pos+1); err.Error() != want {
			t.Errorf("Error() = %q, want %q", err.Error(), want)
		}
	}
}

func TestCaret(t *testing.T) {
	for _, c := range []struct {
		expr string
		pos  int
		want string
	}{
		{"~c abc", 3, "~c abc\n   ^"},
		{"~u", 2, "~u\n  ^"},
		{"", 0, "\n^"},
		{"\t~c abc", 4, "\t~c abc\n\t   ^"},
		{`"é" ~c abc`, 8, "\"é\" ~c abc\n       ^"},
		{"~x\n~c abc\n~x", 6, "~c abc\n   ^"},
		{"~x\n", 3, "\n^"},
		{"abc", 99, "abc\n   ^"},
		{"abc", -1, "abc\n^"},
	} {
		se := &SyntaxError{Expr: c.expr, Pos: c.pos, Msg: "m"}
		if got := se.Caret(); got != c.want {
			t.Errorf("Caret(%q, %d) =\n%s\nwant\n%s", c.expr, c.pos, got, c.want)
		}
	}
	_, err := Parse("~u alice ~c abc")
	var se *SyntaxError
	if !errors.As(err, &se) {
		t.Fatal(err)
	}
	if got, want := se.Caret(), "~u alice ~c abc\n            ^"; got != want {
		t.Errorf("Caret() =\n%s\nwant\n%s", got, want)
	}
	if got, want := err.Error(), `filter: ~c wants a status such as 403, 4xx or 401,403, got "abc" at position 13`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestHelpNamesEveryOperator(t *testing.T) {
	for _, o := range ops {
		if !strings.Contains(Help, "~"+o.name+" ") {
			t.Errorf("Help does not mention ~%s", o.name)
		}
	}
	for _, s := range append(record.StageOrder[:], record.StageUnknown) {
		if !strings.Contains(Help, s) {
			t.Errorf("Help does not mention the stage %s", s)
		}
	}
	// Every example in Help parses.
	_, examples, _ := strings.Cut(Help, "Examples:\n")
	for _, line := range strings.Split(examples, "\n") {
		ex := strings.TrimSpace(line)
		if i := strings.Index(ex, "   "); i >= 0 {
			ex = ex[:i]
		}
		if _, err := Parse(ex); err != nil {
			t.Errorf("Help example %q: %v", ex, err)
		}
	}
}

// TestMatchDoesNotAllocate guards the 100,000-record filtering budget.
func TestMatchDoesNotAllocate(t *testing.T) {
	for _, s := range benchExprs {
		e, err := Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		n := testing.AllocsPerRun(100, func() {
			for _, f := range fixtures {
				e.Match(f.rec)
			}
		})
		if n != 0 {
			t.Errorf("%q: %v allocations per run over the fixtures", s, n)
		}
	}
}

var benchExprs = []string{
	"~u alice",
	"~c 4xx & ~r pods",
	"~x | ~unknown",
	"~u system:serviceaccount:* !~n kube-system",
	`~p "^/api/v1/namespaces/[^/]+/pods"`,
	"~p limit=", // joins path and query
	"web",
	"(~v create | ~v update | ~v patch) & ~slow 100ms & ~s validating-admission",
}

// benchRecords builds n varied records.
func benchRecords(n int) []*record.Record {
	users := []string{"alice", "bob", "system:serviceaccount:kube-system:coredns", "system:node:worker-1", "admin"}
	verbs := []string{"get", "list", "watch", "create", "update", "patch", "delete"}
	resources := []string{"pods", "deployments", "configmaps", "secrets", "nodes", "leases"}
	namespaces := []string{"default", "kube-system", "prod", ""}
	stages := append(record.StageOrder[:], record.StageUnknown, "", "", "")
	statuses := []int{200, 200, 201, 401, 403, 404, 409, 422, 429, 500}
	recs := make([]*record.Record, n)
	for i := range recs {
		res, ns := resources[i%len(resources)], namespaces[i/7%len(namespaces)]
		path := "/api/v1/" + res
		if ns != "" {
			path = "/api/v1/namespaces/" + ns + "/" + res + "/web-" + fmt.Sprint(i%100)
		}
		query := ""
		if i%3 == 0 {
			query = "limit=500&resourceVersion=" + fmt.Sprint(i)
		}
		recs[i] = &record.Record{
			Request: record.Request{
				Method: "GET", Path: path, Query: query,
				User:   users[i%len(users)],
				Groups: []string{"system:authenticated", "group-" + fmt.Sprint(i%13)},
				Verb:   verbs[i%len(verbs)], Resource: res, Namespace: ns,
			},
			Predicted: record.Prediction{Status: statuses[i/3%len(statuses)], Stage: stages[i%len(stages)]},
			Actual:    record.Actual{Status: statuses[i%len(statuses)]},
			Latency:   record.Latency{TotalNs: int64(i%2000) * int64(time.Millisecond/10)},
		}
	}
	return recs
}

// BenchmarkMatch filters 100,000 records per op, as the TUI does when the
// user types a filter; ns/record is the cost per record.
func BenchmarkMatch(b *testing.B) {
	recs := benchRecords(100_000)
	for _, s := range benchExprs {
		e, err := Parse(s)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(s, func(b *testing.B) {
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				for _, r := range recs {
					if e.Match(r) {
						n++
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
			_ = n
		})
	}
}

func BenchmarkParse(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(benchExprs[len(benchExprs)-1]); err != nil {
			b.Fatal(err)
		}
	}
}

// TestNamespaceOfANamespace: a Namespace is cluster-scoped, as kubectl
// has it, though the apiserver's RequestInfo gives /api/v1/namespaces/x
// the namespace x: ~n "" matches it, ~n x does not.
func TestNamespaceOfANamespace(t *testing.T) {
	ns := &record.Record{Request: record.Request{Method: "GET", Path: "/api/v1/namespaces/team-a", Verb: "get", Resource: "namespaces", Namespace: "team-a", Name: "team-a"}}
	pods := &record.Record{Request: record.Request{Method: "GET", Path: "/api/v1/namespaces/team-a/pods", Verb: "list", Resource: "pods", Namespace: "team-a"}}
	for _, tc := range []struct {
		expr       string
		ns, inTeam bool
	}{
		{`~n ""`, true, false},
		{"~n team-a", false, true},
		{"~r namespaces", true, false},
	} {
		e, err := Parse(tc.expr)
		if err != nil {
			t.Fatal(err)
		}
		if got := e.Match(ns); got != tc.ns {
			t.Errorf("%s on the Namespace team-a: %v, want %v", tc.expr, got, tc.ns)
		}
		if got := e.Match(pods); got != tc.inTeam {
			t.Errorf("%s on the pods in team-a: %v, want %v", tc.expr, got, tc.inTeam)
		}
	}
}
