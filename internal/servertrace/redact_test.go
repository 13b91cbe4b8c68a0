package servertrace

import (
	"testing"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// TestRedactSpans: the apiserver's spans carry the request's URL, query
// credentials included, and its errors, which may echo a body or a
// stored object; kproxy passes them on to its own OTLP endpoint, so it
// redacts them first, as records do (probes found ?password= and a
// patched Secret's data in Jaeger).
func TestRedactSpans(t *testing.T) {
	str := func(k, v string) *commonpb.KeyValue {
		return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
	}
	span := &tracepb.Span{Attributes: []*commonpb.KeyValue{
		str("http.target", "/api/v1/namespaces/a/services/web:80/proxy/login?user=bob&password=hunter2"),
		str("url.full", "https://10.0.0.1:6443/api/v1/pods?access_token=abc.def&limit=5"),
		str("url.query", "token=xyz"),
		str("http.route", "/api/v1/pods?token=kept-not-a-url-attribute"),
		str("url.path", "/api/v1/pods"),
	}}
	const echo = `Secret "s" is invalid: patch: Invalid value: "{\"data\":{\"pw\":\"U0VLUklU\"}}": illegal base64 data`
	const redacted = `Secret "s" is invalid: patch: Invalid value: "REDACTED": illegal base64 data`
	span.Events = []*tracepb.Span_Event{{Name: "Write to database call failed", Attributes: []*commonpb.KeyValue{str("err", echo)}}}
	span.Status = &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: echo}
	redactSpans([]*tracepb.ResourceSpans{{ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{span}}}}}, nil)
	want := map[string]string{
		"http.target": "/api/v1/namespaces/a/services/web:80/proxy/login?user=bob&password=REDACTED",
		"url.full":    "https://10.0.0.1:6443/api/v1/pods?access_token=REDACTED&limit=5",
		"url.query":   "token=REDACTED",
		"http.route":  "/api/v1/pods?token=kept-not-a-url-attribute",
		"url.path":    "/api/v1/pods",
	}
	for _, a := range span.Attributes {
		if got := a.GetValue().GetStringValue(); got != want[a.Key] {
			t.Errorf("%s = %q, want %q", a.Key, got, want[a.Key])
		}
	}
	if got := span.Events[0].Attributes[0].GetValue().GetStringValue(); got != redacted {
		t.Errorf("the event's err = %q, want %q", got, redacted)
	}
	if got := span.Status.Message; got != redacted {
		t.Errorf("the status = %q, want %q", got, redacted)
	}
	// A span that did not fail: only attributes named as errors are
	// looked at.
	ok := &tracepb.Span{Attributes: []*commonpb.KeyValue{str("error.message", echo), str("http.user_agent", echo)}}
	redactSpans([]*tracepb.ResourceSpans{{ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{ok}}}}}, nil)
	if got := ok.Attributes[0].GetValue().GetStringValue(); got != redacted {
		t.Errorf("error.message on a span that did not fail = %q, want %q", got, redacted)
	}
}

// TestRedactSpansScrubsHeldSecrets: a policy's message quoting a
// Secret's data in free text, which no echo pattern knows, in the
// apiserver's event and status, is scrubbed of the values the proxy
// holds for the bodies it forwards (probe AE found it in Jaeger).
func TestRedactSpansScrubsHeldSecrets(t *testing.T) {
	str := func(k, v string) *commonpb.KeyValue {
		return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
	}
	const msg = `secrets "s" is forbidden: ValidatingAdmissionPolicy 'echo' with binding 'echo' denied request: pw rejected: hunter2-secret`
	const want = `secrets "s" is forbidden: ValidatingAdmissionPolicy 'echo' with binding 'echo' denied request: pw rejected: REDACTED`
	span := &tracepb.Span{
		Events: []*tracepb.Span_Event{{Name: "Write to database call failed", Attributes: []*commonpb.KeyValue{str("err", msg)}}},
		Status: &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: msg},
	}
	passed := &tracepb.Span{Attributes: []*commonpb.KeyValue{str("http.route", "/api/v1/secrets")}}
	asked := 0
	redactSpans([]*tracepb.ResourceSpans{{ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{span, passed}}}}},
		func() []string { asked++; return []string{"hunter2-secret"} })
	if got := span.Events[0].Attributes[0].GetValue().GetStringValue(); got != want {
		t.Errorf("the event's err = %q, want %q", got, want)
	}
	if got := span.Status.Message; got != want {
		t.Errorf("the status = %q, want %q", got, want)
	}
	if asked != 1 {
		t.Errorf("the held values were asked for %d times in one batch, want once", asked)
	}
}
