package filter

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/kproxy/kproxy/internal/record"
)

// The grammar, by precedence (juxtaposition is and):
//
//	expr    = and { "|" and }
//	and     = unary { ["&"] unary }
//	unary   = "!" unary | primary
//	primary = "(" expr ")" | "~" name [value] | word | string
//	value   = word | string

// maxDepth bounds the nesting of ! and ( ), so that a hostile expression
// sent to the flow API cannot make the parser, Match or String recurse
// without end.
const maxDepth = 100

type parser struct {
	src   string
	pos   int   // the lexer's position: the byte after tok
	tok   token // the current token
	depth int
}

// bail carries a *SyntaxError from deep in the parser up to parse.
type bail struct{ err *SyntaxError }

// errAt makes the bail for an error at byte pos; fail panics with it.
func (p *parser) errAt(pos int, format string, args ...any) bail {
	return bail{&SyntaxError{Expr: p.src, Pos: pos, Msg: fmt.Sprintf(format, args...)}}
}

func (p *parser) fail(pos int, format string, args ...any) { panic(p.errAt(pos, format, args...)) }

func (p *parser) advance() { p.tok = p.lex() }

// parse returns the expression's tree, nil for an empty expression.
func parse(s string) (n node, err error) {
	defer func() {
		if r := recover(); r != nil {
			b, ok := r.(bail)
			if !ok {
				panic(r)
			}
			n, err = nil, b.err
		}
	}()
	p := &parser{src: s}
	p.advance()
	if p.tok.kind == tokEOF {
		return nil, nil
	}
	n = p.parseOr("")
	if p.tok.kind == tokRParen {
		p.fail(p.tok.pos, "unexpected ) without a matching (")
	}
	return n, nil
}

// startsTerm reports whether a token of kind k can start a unary term
// (juxtaposition: "a b" is "a & b").
func startsTerm(k tokKind) bool {
	switch k {
	case tokNot, tokLParen, tokOp, tokWord, tokString:
		return true
	}
	return false
}

// parseOr parses an expr; after names what precedes it ("" or "(") for
// error messages.
func (p *parser) parseOr(after string) node {
	first := p.parseAnd(after)
	if p.tok.kind != tokOr {
		return first
	}
	kids := appendFlat(nil, first, true)
	for p.tok.kind == tokOr {
		p.advance()
		kids = appendFlat(kids, p.parseAnd("|"), true)
	}
	return &orNode{kids: kids}
}

func (p *parser) parseAnd(after string) node {
	first := p.parseUnary(after)
	var kids []node
	for {
		var next node
		switch {
		case p.tok.kind == tokAnd:
			p.advance()
			next = p.parseUnary("&")
		case startsTerm(p.tok.kind):
			next = p.parseUnary("")
		default:
			if kids == nil {
				return first
			}
			return &andNode{kids: kids}
		}
		if kids == nil {
			kids = appendFlat(nil, first, false)
		}
		kids = appendFlat(kids, next, false)
	}
}

// appendFlat appends n to kids, splicing in the children of a nested or
// (or) or and (and): (a & b) & c is a & b & c.
func appendFlat(kids []node, n node, or bool) []node {
	switch n := n.(type) {
	case *orNode:
		if or {
			return append(kids, n.kids...)
		}
	case *andNode:
		if !or {
			return append(kids, n.kids...)
		}
	}
	return append(kids, n)
}

func (p *parser) enter(pos int) {
	p.depth++
	if p.depth > maxDepth {
		p.fail(pos, "the expression nests ! and ( more than %d levels deep", maxDepth)
	}
}

func (p *parser) parseUnary(after string) node {
	switch t := p.tok; t.kind {
	case tokNot:
		p.enter(t.pos)
		p.advance()
		kid := p.parseUnary("!")
		p.depth--
		return &notNode{kid: kid}
	case tokLParen:
		p.enter(t.pos)
		p.advance()
		n := p.parseOr("(")
		if p.tok.kind != tokRParen {
			// parseOr stops only at ) or at the end.
			p.fail(p.tok.pos, "missing ): the ( at position %d is never closed", t.pos+1)
		}
		p.advance()
		p.depth--
		return n
	case tokOp:
		return p.parseOp()
	case tokWord, tokString:
		p.advance()
		return &wordNode{word: t.text}
	}
	p.failTerm(after)
	return nil
}

// failTerm reports a missing term at the current token.
func (p *parser) failTerm(after string) {
	t := p.tok
	got := describe(t)
	switch {
	case after == "(" && t.kind == tokRParen:
		p.fail(t.pos, "empty parentheses: put a filter term between ( and )")
	case after == "" && t.kind == tokRParen:
		p.fail(t.pos, "unexpected ) without a matching (")
	case after == "":
		p.fail(t.pos, "expected a filter term such as ~u alice, got %s", got)
	case after == "&" && t.kind == tokAnd, after == "|" && t.kind == tokOr:
		p.fail(t.pos, "unexpected %s after %s: write a single %s", got, after, after)
	}
	p.fail(t.pos, "expected a filter term after %s, got %s", after, got)
}

// describe names a token for error messages.
func describe(t token) string {
	switch t.kind {
	case tokEOF:
		return "end of expression"
	case tokOp:
		return "~" + t.text
	case tokWord, tokString:
		return strconv.Quote(t.text)
	}
	return t.text
}

// An op is one ~name operator.
type op struct {
	name string
	// arg describes the value ("" when the operator takes none).
	arg string
	// build makes the node from the value, or returns a message saying
	// what is wrong with it.
	build func(v string) (node, string)
}

// ops lists the operators in the order Help and error messages give them.
var ops []op

// opNames is " ~u ~g ...", for error messages.
var opNames string

// stageNames is "authentication, ..., unknown", for error messages.
var stageNames = strings.Join(append(record.StageOrder[:len(record.StageOrder):len(record.StageOrder)], record.StageUnknown), ", ")

func init() {
	ops = []op{
		{"u", "a user name", func(v string) (node, string) { return &userNode{pat: compilePattern(v)}, "" }},
		{"g", "a group name", func(v string) (node, string) { return &groupNode{pat: compilePattern(v)}, "" }},
		{"v", "a verb such as get, list or create", func(v string) (node, string) { return &verbNode{pat: compilePattern(v)}, "" }},
		{"r", "a resource such as pods, pods/log or deployments.apps", buildResource},
		{"n", "a namespace", func(v string) (node, string) { return &namespaceNode{pat: compilePattern(v)}, "" }},
		{"m", "an HTTP method such as GET", buildMethod},
		{"p", "a regular expression over the path", buildPath},
		{"c", "a status such as 403, 4xx or 401,403", buildStatus},
		{"s", "a stage name (" + stageNames + ")", buildStage},
		{"x", "", func(string) (node, string) { return mismatchNode{}, "" }},
		{"unknown", "", func(string) (node, string) { return unknownNode{}, "" }},
		{"slow", "a duration such as 500ms or 1s", buildSlow},
	}
	names := make([]string, len(ops))
	for i, o := range ops {
		names[i] = "~" + o.name
	}
	opNames = strings.Join(names, " ")
}

func lookupOp(name string) *op {
	for i := range ops {
		if ops[i].name == name {
			return &ops[i]
		}
	}
	return nil
}

// suggest guesses what an unknown operator name meant: a case slip (~U),
// or a missing space after a real operator (~c403, ~x!~u).
func suggest(name string) string {
	if o := lookupOp(strings.ToLower(name)); o != nil {
		return " (did you mean ~" + o.name + "?)"
	}
	best := ""
	for _, o := range ops {
		if len(o.name) > len(best) && strings.HasPrefix(name, o.name) {
			best = o.name
		}
	}
	if best == "" {
		return ""
	}
	if c := name[len(best)]; (c|0x20) >= 'a' && (c|0x20) <= 'z' {
		return "" // ~slowly is not ~slow ly
	}
	return fmt.Sprintf(" (did you mean ~%s %s?)", best, name[len(best):])
}

func (p *parser) parseOp() node {
	t := p.tok
	o := lookupOp(t.text)
	if o == nil {
		if t.text == "" {
			panic(p.errAt(t.pos, "~ must be followed by an operator name; valid operators: %s", opNames))
		}
		panic(p.errAt(t.pos, "unknown operator ~%s%s; valid operators: %s", t.text, suggest(t.text), opNames))
	}
	p.advance()
	if o.arg == "" {
		n, _ := o.build("")
		return n
	}
	v := p.tok
	if v.kind != tokWord && v.kind != tokString {
		hint := ""
		switch v.kind {
		case tokOp:
			hint = fmt.Sprintf(" (to match %s literally, quote it)", quote("~"+v.text))
		case tokNot:
			hint = " (to match a value starting with ! literally, quote it)"
		case tokLParen, tokRParen, tokOr, tokAnd:
			if o.name == "p" {
				hint = ` (quote a regular expression that holds ( ) | & or spaces: ~p "^/api/v1/(pods|services)")`
			}
		}
		p.fail(v.pos, "~%s wants %s, got %s%s", o.name, o.arg, describe(v), hint)
	}
	n, msg := o.build(v.text)
	if msg != "" {
		p.fail(v.pos, "%s", msg)
	}
	p.advance()
	return n
}

func buildResource(v string) (node, string) {
	n := &resourceNode{raw: v}
	res := v
	if i := strings.IndexByte(res, '/'); i >= 0 {
		res, n.sub, n.hasSub = res[:i], compilePattern(res[i+1:]), true
	}
	if i := strings.IndexByte(res, '.'); i >= 0 {
		res, n.group, n.hasGroup = res[:i], compilePattern(res[i+1:]), true
	}
	n.res = compilePattern(res)
	if v != "" && (res == "" || n.hasSub && (n.sub.raw == "" || strings.Contains(n.sub.raw, "/")) || n.hasGroup && n.group.raw == "") {
		return nil, fmt.Sprintf(`~r wants RESOURCE, RESOURCE/SUBRESOURCE or RESOURCE.GROUP (such as pods, pods/log, deployments.apps or *.apps), got %q`, v)
	}
	return n, ""
}

func buildMethod(v string) (node, string) {
	ok := v != ""
	for i := 0; i < len(v); i++ {
		if c := v[i] | 0x20; c < 'a' || c > 'z' {
			ok = false
		}
	}
	if !ok {
		return nil, fmt.Sprintf("~m wants an HTTP method such as GET or post, got %q", v)
	}
	return &methodNode{method: strings.ToUpper(v)}, ""
}

func buildPath(v string) (node, string) {
	re, err := regexp.Compile(v)
	if err != nil {
		return nil, fmt.Sprintf("~p wants a valid Go regular expression: %v", err)
	}
	return &pathNode{re: re}, ""
}

func buildStatus(v string) (node, string) {
	n := &statusNode{}
	items := strings.Split(v, ",")
	for i, it := range items {
		lo, hi, ok := parseStatus(it)
		if !ok {
			return nil, fmt.Sprintf("~c wants a status such as 403, 4xx or 401,403, got %q", v)
		}
		n.ranges = append(n.ranges, statusRange{lo, hi})
		items[i] = strings.ToLower(it)
	}
	n.text = strings.Join(items, ",")
	return n, ""
}

// parseStatus parses 403 (100 to 599) or a class 4xx (1xx to 5xx).
func parseStatus(s string) (lo, hi int, ok bool) {
	if len(s) != 3 || s[0] < '1' || s[0] > '5' {
		return 0, 0, false
	}
	if s[1]|0x20 == 'x' && s[2]|0x20 == 'x' {
		c := int(s[0]-'0') * 100
		return c, c + 99, true
	}
	if s[1] < '0' || s[1] > '9' || s[2] < '0' || s[2] > '9' {
		return 0, 0, false
	}
	c := int(s[0]-'0')*100 + int(s[1]-'0')*10 + int(s[2]-'0')
	return c, c, true
}

func buildStage(v string) (node, string) {
	s := strings.ToLower(v)
	if s == record.StageUnknown {
		return &stageNode{stage: s}, ""
	}
	for _, st := range record.StageOrder {
		if s == st {
			return &stageNode{stage: s}, ""
		}
	}
	return nil, fmt.Sprintf("~s wants a stage name, got %q; the stages are %s", v, stageNames)
}

func buildSlow(v string) (node, string) {
	d, err := time.ParseDuration(v)
	if err != nil {
		hint := ""
		if strings.Contains(err.Error(), "missing unit") {
			hint = "; add a unit: ns, us, ms, s, m or h"
		}
		return nil, fmt.Sprintf("~slow wants a duration such as 500ms or 1s, got %q%s", v, hint)
	}
	if d < 0 {
		return nil, fmt.Sprintf("~slow wants a duration of zero or more, got %q", v)
	}
	return &slowNode{d: d}, ""
}
