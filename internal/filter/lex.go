package filter

import (
	"strings"
)

// The lexer splits an expression into tokens:
//
//	! & | ( )          operators
//	~name              an operator name: ~ followed by a run of word bytes
//	"..."              a quoted string: \" is a quote, \\ a backslash, any
//	                   other backslash stands for itself (so "\d+" is the
//	                   regexp \d+)
//	word               a run of word bytes
//
// Word bytes are everything but ASCII whitespace and ( ) & | ". A ! or ~
// is an operator only at the start of a token: foo!bar is one word.

type tokKind uint8

const (
	tokEOF    tokKind = iota
	tokNot            // !
	tokAnd            // &
	tokOr             // |
	tokLParen         // (
	tokRParen         // )
	tokOp             // ~name; text is the name without the ~
	tokWord           // an unquoted word
	tokString         // a quoted string; text is its unescaped value
)

type token struct {
	kind tokKind
	pos  int // byte offset of the token's first byte (len(src) for EOF)
	text string
}

func isSpace(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', '\v', '\f':
		return true
	}
	return false
}

func isDelim(c byte) bool {
	switch c {
	case '(', ')', '&', '|', '"':
		return true
	}
	return false
}

func isWordByte(c byte) bool { return !isSpace(c) && !isDelim(c) }

// lex reads the token at p.pos and moves p.pos past it.
func (p *parser) lex() token {
	s := p.src
	i := p.pos
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	if i == len(s) {
		p.pos = i
		return token{kind: tokEOF, pos: i}
	}
	var k tokKind
	switch s[i] {
	case '!':
		k = tokNot
	case '&':
		k = tokAnd
	case '|':
		k = tokOr
	case '(':
		k = tokLParen
	case ')':
		k = tokRParen
	case '"':
		return p.lexString(i)
	}
	if k != tokEOF {
		p.pos = i + 1
		return token{kind: k, pos: i, text: s[i : i+1]}
	}
	j := i + 1
	for j < len(s) && isWordByte(s[j]) {
		j++
	}
	if j < len(s) && s[j] == '"' {
		p.fail(j, "unexpected \" inside the word %q: quote the whole value, not part of it", s[i:j])
	}
	p.pos = j
	if s[i] == '~' {
		return token{kind: tokOp, pos: i, text: s[i+1 : j]}
	}
	return token{kind: tokWord, pos: i, text: s[i:j]}
}

// lexString reads the quoted string whose opening quote is at i.
func (p *parser) lexString(i int) token {
	s := p.src
	var b []byte // nil until the first escape
	start := i + 1
	for j := start; j < len(s); j++ {
		switch c := s[j]; {
		case c == '"':
			text := s[start:j]
			if b != nil {
				text = string(append(b, text...))
			}
			if k := j + 1; k < len(s) && (isWordByte(s[k]) || s[k] == '"') {
				p.fail(k, "put a space after a closing quote")
			}
			p.pos = j + 1
			return token{kind: tokString, pos: i, text: text}
		case c == '\\' && j+1 < len(s) && (s[j+1] == '"' || s[j+1] == '\\'):
			b = append(b, s[start:j]...)
			b = append(b, s[j+1])
			j++
			start = j + 1
		}
	}
	panic(p.errAt(i, "this quoted string has no closing \""))
}

// needsQuote reports whether a value must be quoted to lex back as one
// word.
func needsQuote(s string) bool {
	if s == "" || s[0] == '~' || s[0] == '!' {
		return true
	}
	for i := 0; i < len(s); i++ {
		if !isWordByte(s[i]) {
			return true
		}
	}
	return false
}

// quote returns s in double quotes, escaping only what the lexer would
// misread: a quote, and a backslash before a quote, a backslash or the
// closing quote.
func quote(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			if i+1 == len(s) || s[i+1] == '"' || s[i+1] == '\\' {
				b.WriteString(`\\`)
			} else {
				b.WriteByte('\\')
			}
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// value renders a value for String: bare when it lexes back as itself.
func value(s string) string {
	if needsQuote(s) {
		return quote(s)
	}
	return s
}
