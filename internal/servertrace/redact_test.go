package servertrace

import (
	"testing"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// TestRedactURLs: the apiserver's spans carry the request's URL, query
// credentials included; kproxy passes them on to its own OTLP endpoint,
// so it redacts them first, as records do (a probe found ?password= in
// Jaeger).
func TestRedactURLs(t *testing.T) {
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
	redactURLs([]*tracepb.ResourceSpans{{ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{span}}}}})
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
}
