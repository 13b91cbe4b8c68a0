package filter

import (
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/kproxy/kproxy/internal/record"
)

// A node is one compiled term. match must not allocate: it runs on every
// captured record each time the filter changes.
type node interface {
	match(r *record.Record) bool
}

type (
	orNode  struct{ kids []node }
	andNode struct{ kids []node }
	notNode struct{ kid node }
)

func (n *orNode) match(r *record.Record) bool {
	for _, k := range n.kids {
		if k.match(r) {
			return true
		}
	}
	return false
}

func (n *andNode) match(r *record.Record) bool {
	for _, k := range n.kids {
		if !k.match(r) {
			return false
		}
	}
	return true
}

func (n *notNode) match(r *record.Record) bool { return !n.kid.match(r) }

// A pattern is an exact value or, when it holds a *, a wildcard pattern in
// which * stands for any run of bytes (including / and :). A wildcard
// never matches the empty value, so ~n * selects namespaced requests.
type pattern struct {
	raw    string
	glob   bool
	prefix string   // before the first *
	suffix string   // after the last *
	middle []string // the non-empty pieces between stars, in order
}

func compilePattern(s string) pattern {
	p := pattern{raw: s}
	parts := strings.Split(s, "*")
	if len(parts) == 1 {
		return p
	}
	p.glob = true
	p.prefix, p.suffix = parts[0], parts[len(parts)-1]
	for _, m := range parts[1 : len(parts)-1] {
		if m != "" {
			p.middle = append(p.middle, m)
		}
	}
	return p
}

func (p *pattern) match(s string) bool {
	if !p.glob {
		return s == p.raw
	}
	if s == "" || len(s) < len(p.prefix)+len(p.suffix) ||
		!strings.HasPrefix(s, p.prefix) || !strings.HasSuffix(s, p.suffix) {
		return false
	}
	inner := s[len(p.prefix) : len(s)-len(p.suffix)]
	for _, m := range p.middle {
		i := strings.Index(inner, m)
		if i < 0 {
			return false
		}
		inner = inner[i+len(m):]
	}
	return true
}

// ~u: the authenticated user, or the user it acts as when impersonating.
type userNode struct{ pat pattern }

func (n *userNode) match(r *record.Record) bool {
	return n.pat.match(r.Request.User) || r.Request.ActingAs != "" && n.pat.match(r.Request.ActingAs)
}

// ~g: any of the groups.
type groupNode struct{ pat pattern }

func (n *groupNode) match(r *record.Record) bool {
	for _, g := range r.Request.Groups {
		if n.pat.match(g) {
			return true
		}
	}
	return false
}

// ~v
type verbNode struct{ pat pattern }

func (n *verbNode) match(r *record.Record) bool { return n.pat.match(r.Request.Verb) }

// ~n
type namespaceNode struct{ pat pattern }

func (n *namespaceNode) match(r *record.Record) bool { return n.pat.match(r.Request.ScopeNamespace()) }

// ~r RESOURCE[.GROUP][/SUBRESOURCE]: pods matches every pods request,
// subresources included; pods/log only the log subresource, pods/* any
// subresource; deployments.apps only the apps group's.
type resourceNode struct {
	raw              string
	res, group, sub  pattern
	hasGroup, hasSub bool
}

func (n *resourceNode) match(r *record.Record) bool {
	q := &r.Request
	return n.res.match(q.Resource) &&
		(!n.hasSub || n.sub.match(q.Subresource)) &&
		(!n.hasGroup || n.group.match(q.APIGroup))
}

// ~m, in any case.
type methodNode struct{ method string }

func (n *methodNode) match(r *record.Record) bool {
	return strings.EqualFold(r.Request.Method, n.method)
}

// ~p: a regexp over path?query.
type pathNode struct{ re *regexp.Regexp }

// bufPool holds the buffers in which ~p joins path and query, so Match
// does not allocate.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

func (n *pathNode) match(r *record.Record) bool {
	q := &r.Request
	if q.Query == "" {
		return n.re.MatchString(q.Path)
	}
	bp := bufPool.Get().(*[]byte)
	b := append(append(append((*bp)[:0], q.Path...), '?'), q.Query...)
	ok := n.re.Match(b)
	*bp = b
	bufPool.Put(bp)
	return ok
}

// ~c: the actual status, in any of the ranges.
type statusRange struct{ lo, hi int }

type statusNode struct {
	text   string // normalised: 401,4xx
	ranges []statusRange
}

func (n *statusNode) match(r *record.Record) bool {
	s := r.Actual.Status
	for _, rg := range n.ranges {
		if s >= rg.lo && s <= rg.hi {
			return true
		}
	}
	return false
}

// ~s: the predicted deciding stage.
type stageNode struct{ stage string }

func (n *stageNode) match(r *record.Record) bool { return r.Predicted.Stage == n.stage }

// ~x: prediction and answer are both known and their statuses differ (a
// status kproxy wrote because no answer came is none: flowview's
// Agreement says so too).
type mismatchNode struct{}

func (mismatchNode) match(r *record.Record) bool {
	p, a := r.Predicted.Status, r.Actual.Status
	return r.Predicted.Stage != record.StageUnknown && p != 0 && a != 0 && p != a && !r.Actual.NoAnswer()
}

// ~unknown: kproxy could not predict.
type unknownNode struct{}

func (unknownNode) match(r *record.Record) bool { return r.Predicted.Stage == record.StageUnknown }

// ~slow: total latency at least d.
type slowNode struct{ d time.Duration }

func (n *slowNode) match(r *record.Record) bool { return r.Latency.TotalNs >= int64(n.d) }

// A bare word or quoted string: a substring of the path.
type wordNode struct{ word string }

func (n *wordNode) match(r *record.Record) bool { return strings.Contains(r.Request.Path, n.word) }

// Precedences, for String's parentheses.
const (
	precOr = iota
	precAnd
	precUnary
)

func prec(n node) int {
	switch n.(type) {
	case *orNode:
		return precOr
	case *andNode:
		return precAnd
	}
	return precUnary
}

// format writes n in normal form, in parentheses if it binds looser than
// its context ctx.
func format(b *strings.Builder, n node, ctx int) {
	if prec(n) < ctx {
		b.WriteByte('(')
		defer b.WriteByte(')')
	}
	switch n := n.(type) {
	case *orNode:
		for i, k := range n.kids {
			if i > 0 {
				b.WriteString(" | ")
			}
			format(b, k, precAnd)
		}
	case *andNode:
		for i, k := range n.kids {
			if i > 0 {
				b.WriteString(" & ")
			}
			format(b, k, precUnary)
		}
	case *notNode:
		b.WriteByte('!')
		format(b, n.kid, precUnary)
	case *userNode:
		b.WriteString("~u " + value(n.pat.raw))
	case *groupNode:
		b.WriteString("~g " + value(n.pat.raw))
	case *verbNode:
		b.WriteString("~v " + value(n.pat.raw))
	case *resourceNode:
		b.WriteString("~r " + value(n.raw))
	case *namespaceNode:
		b.WriteString("~n " + value(n.pat.raw))
	case *methodNode:
		b.WriteString("~m " + value(n.method))
	case *pathNode:
		b.WriteString("~p " + value(n.re.String()))
	case *statusNode:
		b.WriteString("~c " + n.text)
	case *stageNode:
		b.WriteString("~s " + n.stage)
	case mismatchNode:
		b.WriteString("~x")
	case unknownNode:
		b.WriteString("~unknown")
	case *slowNode:
		b.WriteString("~slow " + n.d.String())
	case *wordNode:
		b.WriteString(value(n.word))
	}
}
