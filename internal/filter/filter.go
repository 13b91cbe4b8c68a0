package filter

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/kproxy/kproxy/internal/record"
)

// Help is a short description of the language, for `?` help screens and
// --help texts.
const Help = `Filter expressions select flows (mitmproxy style):

  ~u USER       user or impersonated user (acting as)
  ~g GROUP      any of the user's groups
  ~v VERB       Kubernetes verb: get, list, watch, create, patch, delete, ...
  ~r RESOURCE   pods, pods/log (subresource), deployments.apps (group)
  ~n NAMESPACE  namespace (~n "" for cluster-scoped requests)
  ~m METHOD     HTTP method, any case: GET, post
  ~p REGEXP     Go regular expression over the path (and ?query if any)
  ~c STATUS     actual status: 403, a class 4xx, or a list 401,403
  ~s STAGE      predicted deciding stage: authentication, impersonation,
                flowcontrol, authorization, decode, mutating-admission,
                validation, validating-admission, storage, unknown
  ~x            predicted and actual status disagree (both known)
  ~unknown      kproxy could not predict
  ~slow DUR     total latency at least DUR: 500ms, 2s
  WORD          the path contains WORD

  !A not    A & B and (A B also means and)    A | B or    (A) grouping
  ! binds tightest, then &, then |.

Values match exactly; * is a wildcard matching any non-empty value
(~u system:serviceaccount:kube-system:*, ~r *.apps, ~r pods/*).
Quote values with spaces or ( ) & | ! ~ in double quotes: ~u "jane doe";
inside quotes \" is a quote and \\ a backslash.

Examples:
  ~u alice ~c 4xx                     alice's client errors
  ~x | ~unknown                       predictions worth a look
  ~s authorization !~n kube-system
  ~slow 1s & (~v create | ~v update)
  ~p "^/apis/apps/v1/.*/(deployments|statefulsets)"`

// Expr is a compiled filter expression. It is immutable and safe for
// concurrent use.
type Expr struct {
	root node   // nil: matches everything
	norm string // the normalised expression
}

// Parse compiles an expression; "" (or only whitespace) matches
// everything. Errors are *SyntaxError.
func Parse(s string) (*Expr, error) {
	root, err := parse(s)
	if err != nil {
		return nil, err
	}
	e := &Expr{root: root}
	if root != nil {
		var b strings.Builder
		format(&b, root, precOr)
		e.norm = b.String()
	}
	return e, nil
}

// Match reports whether r matches; a nil *Expr matches everything. A nil
// record matches only the empty expression.
func (e *Expr) Match(r *record.Record) bool {
	if e == nil || e.root == nil {
		return true
	}
	if r == nil {
		return false
	}
	return e.root.match(r)
}

// String returns the normalised expression: single spaces, explicit &,
// parentheses only where needed, values quoted only where needed. It
// parses back to an equivalent Expr (and to the same string).
func (e *Expr) String() string {
	if e == nil {
		return ""
	}
	return e.norm
}

// SyntaxError is a filter that does not parse.
type SyntaxError struct {
	Expr string // the whole expression
	Pos  int    // byte offset of the error in Expr (len(Expr) for "unexpected end")
	Msg  string // what is wrong and how to fix it
}

// Error returns "filter: <Msg> at position <Pos+1>" (a 1-based column).
func (e *SyntaxError) Error() string {
	return fmt.Sprintf("filter: %s at position %d", e.Msg, e.Pos+1)
}

// Caret renders the expression (the line of it holding the error) and a ^
// under the error position, on two lines with no trailing newline, for
// terminals. Tabs before the error are kept so the caret lines up.
func (e *SyntaxError) Caret() string {
	pos := min(max(e.Pos, 0), len(e.Expr))
	start := strings.LastIndexByte(e.Expr[:pos], '\n') + 1
	end := len(e.Expr)
	if i := strings.IndexByte(e.Expr[pos:], '\n'); i >= 0 {
		end = pos + i
	}
	var b strings.Builder
	b.Grow(2*(end-start) + 2)
	b.WriteString(e.Expr[start:end])
	b.WriteByte('\n')
	for i := start; i < pos; {
		r, n := utf8.DecodeRuneInString(e.Expr[i:pos])
		if r == '\t' {
			b.WriteByte('\t')
		} else {
			b.WriteByte(' ')
		}
		i += n
	}
	b.WriteByte('^')
	return b.String()
}
