package stages

import (
	"context"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// The members of a chain a stage asks (authenticators, authorizers) are
// traced after the fact: each is timed, and only one with something to
// say (a verdict, a reason, an error, or slowPlugin or more of time) gets
// a span, over the time it took; nothing of kproxy's runs under it. The
// quiet ones (no opinion, quickly: x509 before every token, Node for
// anyone not a node) are named with their times on the stage's span, as
// admission folds its unremarkable plugins.

// quietMembers names the quiet members of one stage's chain.
type quietMembers []string

// fold names a member that had nothing to say and took d, and reports
// true, unless it took slowPlugin or more: then it keeps its span.
func (q *quietMembers) fold(name string, d time.Duration) bool {
	if d >= slowPlugin {
		return false
	}
	*q = append(*q, timedName(name, d))
	return true
}

// annotate names the quiet members on the stage's span (ctx's), under key.
func (q quietMembers) annotate(ctx context.Context, key string) {
	if len(q) > 0 {
		trace.SpanFromContext(ctx).SetAttributes(attribute.String(key, strings.Join(q, ", ")))
	}
}

// memberSpan is a member's span, made after the fact: from start, for took.
func memberSpan(ctx context.Context, tracer trace.Tracer, name string, start time.Time, took time.Duration, attrs ...attribute.KeyValue) {
	_, span := tracer.Start(ctx, name, trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	span.End(trace.WithTimestamp(start.Add(took)))
}

// timedName is a folded member as an attribute names it: "x509 2µs".
func timedName(name string, d time.Duration) string {
	return name + " " + d.Round(time.Microsecond).String()
}
