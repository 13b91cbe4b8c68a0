package servertrace

import (
	"encoding/binary"
	"encoding/hex"
	"time"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// t0 is the synthetic traces' epoch.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// ms is a time t0 + v milliseconds, in unix nanoseconds.
func ms(v float64) uint64 { return uint64(t0.UnixNano() + int64(v*float64(time.Millisecond))) }

// synthTrace builds a synthetic apiserver trace.
type synthTrace struct {
	id    []byte
	next  uint64
	spans []*tracepb.Span
}

func newTrace(n uint64) *synthTrace {
	id := make([]byte, 16)
	binary.BigEndian.PutUint64(id[8:], n)
	id[0] = 0xab
	return &synthTrace{id: id, next: n << 16}
}

func (t *synthTrace) hex() string { return hex.EncodeToString(t.id) }

// add makes a span under parent (nil: none) from start to end ms.
func (t *synthTrace) add(parent *tracepb.Span, name string, kind tracepb.Span_SpanKind, start, end float64, attrs ...string) *tracepb.Span {
	t.next++
	sid := make([]byte, 8)
	binary.BigEndian.PutUint64(sid, t.next)
	s := &tracepb.Span{TraceId: t.id, SpanId: sid, Name: name, Kind: kind, StartTimeUnixNano: ms(start), EndTimeUnixNano: ms(end)}
	if parent != nil {
		s.ParentSpanId = parent.SpanId
	}
	for i := 0; i+1 < len(attrs); i += 2 {
		s.Attributes = append(s.Attributes, &commonpb.KeyValue{Key: attrs[i],
			Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: attrs[i+1]}}})
	}
	t.spans = append(t.spans, s)
	return s
}

func (t *synthTrace) child(parent *tracepb.Span, name string, start, end float64, attrs ...string) *tracepb.Span {
	return t.add(parent, name, tracepb.Span_SPAN_KIND_INTERNAL, start, end, attrs...)
}

func event(s *tracepb.Span, name string, at float64) {
	s.Events = append(s.Events, &tracepb.Span_Event{Name: name, TimeUnixNano: ms(at)})
}

// root is the apiserver's root span of a request.
func (t *synthTrace) root(auditID string, start, end float64) *tracepb.Span {
	return t.add(nil, "POST /api/v1/namespaces/{:namespace}/configmaps", tracepb.Span_SPAN_KIND_SERVER, start, end, attrAuditID, auditID)
}

// chain adds the traced filter chain under root, each filter nesting the
// next, and returns the innermost (authorization).
func (t *synthTrace) chain(root *tracepb.Span) *tracepb.Span {
	s, e := float64(root.StartTimeUnixNano-ms(0))/1e6, float64(root.EndTimeUnixNano-ms(0))/1e6
	p := root
	for i, name := range []string{"audit", "impersonation", "priorityandfairness", "authorization"} {
		p = t.child(p, name, s+float64(i+1), e-float64(i+1)*0.5)
	}
	return p
}

// batch wraps spans as one export request's resource spans.
func batch(spans ...*tracepb.Span) []*tracepb.ResourceSpans {
	return []*tracepb.ResourceSpans{{ScopeSpans: []*tracepb.ScopeSpans{{Spans: spans}}}}
}

// createWithSlowWebhook is a POST whose validating webhook takes 320 ms:
// the test cases' and the benchmark's request.
func createWithSlowWebhook(n uint64, auditID string) (*synthTrace, *tracepb.Span) {
	t := newTrace(n)
	root := t.root(auditID, 0, 400)
	authz := t.chain(root)
	h := t.child(authz, "Create", 6, 395)
	for _, e := range []struct {
		name string
		at   float64
	}{{"limitedReadBody succeeded", 7}, {"About to convert to expected version", 7.5}, {"Conversion done", 8},
		{"About to store object in database", 9}, {"Write to database call succeeded", 380},
		{"About to write a response", 381}, {"Writing http response done", 390}} {
		event(h, e.name, e.at)
	}
	wh := t.child(h, "Call validating webhook", 20, 340, "webhook", "policy.example.com", "configuration", "policy")
	t.add(wh, "HTTP POST", tracepb.Span_SPAN_KIND_CLIENT, 21, 339, "url.full", "https://10.0.0.9:443/validate?timeout=10s")
	t.child(h, "Create etcd3", 345, 375, attrAuditID, auditID)
	ser := t.child(h, "SerializeObject", 382, 389)
	event(ser, "About to start writing response", 386)
	event(ser, "Write call succeeded", 388)
	return t, root
}
