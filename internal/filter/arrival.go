package filter

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kproxy/kproxy/internal/record"
)

// A replay filter (kproxy serve --replay-filter) picks the requests kproxy
// replays, and is decided before the replay: from what a request carries
// when it arrives, and, for a caller known only once the replay has
// authenticated it (a bearer token), from who it turned out to be. So it
// may hold only the request's terms: never the answer's (~c, ~slow), nor
// the prediction's (~s, ~x, ~unknown), which a write's replay, run on
// arrival, cannot wait for.

// answerTerms are the operators a replay filter refuses, and why.
var answerTerms = map[string]string{
	"~c":       "the apiserver's answer",
	"~slow":    "the request's latency",
	"~s":       "the replay's prediction",
	"~x":       "the replay's prediction",
	"~unknown": "the replay's prediction",
}

// ParseRequestOnly parses a filter that may use only a request's own
// terms (~u ~g ~v ~r ~n ~m ~p and words of the path), as a replay filter
// must; an answer's or a prediction's term is an error naming it.
func ParseRequestOnly(s string) (*Expr, error) {
	e, err := Parse(s)
	if err != nil {
		return nil, err
	}
	var found []string
	walk(e.root, func(n node) {
		if name := answerTermOf(n); name != "" && !slices.Contains(found, name) {
			found = append(found, name)
		}
	})
	if len(found) > 0 {
		why := answerTerms[found[0]]
		return nil, fmt.Errorf("%s needs %s, which is not known when the request arrives: this filter may use only the request's own terms (~u ~g ~v ~r ~n ~m ~p and words of the path)", strings.Join(found, ", "), why)
	}
	return e, nil
}

// MatchRequest evaluates a request-only filter on a record as far as it is
// known: the request's fields, and its user (~u, ~g) only when userKnown.
// decided is false when the answer depends on the user and the user is not
// known yet; match is then meaningless.
func (e *Expr) MatchRequest(r *record.Record, userKnown bool) (match, decided bool) {
	if e == nil || e.root == nil {
		return true, true
	}
	switch tri(e.root, r, userKnown) {
	case yes:
		return true, true
	case no:
		return false, true
	}
	return false, false
}

// Kleene's three-valued logic: maybe is a term that cannot be told yet.
type truth int8

const (
	no truth = iota
	yes
	maybe
)

func tri(n node, r *record.Record, userKnown bool) truth {
	switch n := n.(type) {
	case *orNode:
		return triAll(n.kids, r, userKnown, yes)
	case *andNode:
		return triAll(n.kids, r, userKnown, no)
	case *notNode:
		switch tri(n.kid, r, userKnown) {
		case yes:
			return no
		case no:
			return yes
		}
		return maybe
	case *userNode, *groupNode:
		if !userKnown {
			return maybe
		}
	}
	if answerTermOf(n) != "" {
		return maybe // ParseRequestOnly refuses these
	}
	if n.match(r) {
		return yes
	}
	return no
}

// triAll combines kids as | (decisive: yes) or & (decisive: no) does: the
// decisive value if any kid has it, else maybe if any kid is maybe, else
// the other value.
func triAll(kids []node, r *record.Record, userKnown bool, decisive truth) truth {
	t := yes + no - decisive
	for _, k := range kids {
		switch tri(k, r, userKnown) {
		case decisive:
			return decisive
		case maybe:
			t = maybe
		}
	}
	return t
}

// answerTermOf names n's operator if it needs the answer or the
// prediction.
func answerTermOf(n node) string {
	switch n.(type) {
	case *statusNode:
		return "~c"
	case *slowNode:
		return "~slow"
	case *stageNode:
		return "~s"
	case mismatchNode:
		return "~x"
	case unknownNode:
		return "~unknown"
	}
	return ""
}

func walk(n node, f func(node)) {
	if n == nil {
		return
	}
	f(n)
	switch n := n.(type) {
	case *orNode:
		for _, k := range n.kids {
			walk(k, f)
		}
	case *andNode:
		for _, k := range n.kids {
			walk(k, f)
		}
	case *notNode:
		walk(n.kid, f)
	}
}
