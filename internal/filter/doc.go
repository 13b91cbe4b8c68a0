// Package filter is the flow filter language shared by the TUI, the flow
// API and the CI mode: small mitmproxy-style expressions such as
//
//	~u alice ~c 4xx
//	~x | ~unknown
//	~r pods/log & !~n kube-system
//	~slow 1s & (~v create | ~v update)
//
// that select capture records (see [Help] for the whole language).
//
// # Why a hand-written parser
//
// The grammar is tiny: a dozen operators of the form ~name [VALUE], bare
// words, !, &, |, juxtaposition and parentheses. A parser generator or a
// combinator library would cost more to read than the hundred-odd lines of
// recursive descent it replaces (one function per precedence level:
// or, and, unary, primary), and it would make the one thing that matters
// to a person typing a filter into a terminal harder: error messages that
// point at a byte in the expression and say what to write instead. Every
// error is a [*SyntaxError] carrying the expression and the byte offset of
// the offending token; [SyntaxError.Caret] draws it under the expression.
//
// The lexer is pulled one token at a time by the parser, so the first
// mistake from the left is the one reported, whether it is lexical (an
// unterminated quote) or grammatical (a missing value). Values are checked
// where they are read: a regular expression is compiled, a status list or
// a duration parsed, a stage name looked up, so a filter that parses can
// never fail later.
//
// # Why evaluation looks at the capture record only
//
// A filter is a predicate over [record.Record], the one data shape behind
// the capture file, the live event stream and the flow API. It never
// consults the cluster, the replay or anything that may change between two
// evaluations, so the same expression selects the same flows in the TUI,
// over the API and in CI, today and when the capture is replayed next
// year.
//
// # Why it is fast
//
// Match runs on every record a user has captured (up to 100,000) each time
// they change the filter, so all the work that can happen once happens in
// [Parse]: regular expressions are compiled, wildcard patterns split into
// their literal pieces, status lists turned into ranges. Match then walks
// a small tree of nodes and does not allocate (a path regexp that must see
// "?query" borrows a pooled buffer). BenchmarkMatch measures it.
package filter
