package stages

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	apirequest "k8s.io/apiserver/pkg/endpoints/request"
)

// TestRefusedTimeout: the apiserver's request-deadline filter, which runs
// before authentication, refuses a timeout parameter that is not a
// duration (400), except on a long-running request; any other timeout
// passes it.
func TestRefusedTimeout(t *testing.T) {
	a, ok := newAuthentication(&machinery{}).(*authentication)
	if !ok {
		t.Fatal("newAuthentication is not *authentication")
	}
	get := &apirequest.RequestInfo{IsResourceRequest: true, Verb: "get", APIVersion: "v1", Namespace: "ns", Resource: "configmaps", Name: "a"}
	watch := &apirequest.RequestInfo{IsResourceRequest: true, Verb: "watch", APIVersion: "v1", Namespace: "ns", Resource: "configmaps"}
	podLog := &apirequest.RequestInfo{IsResourceRequest: true, Verb: "get", APIVersion: "v1", Namespace: "ns", Resource: "pods", Name: "p", Subresource: "log"}
	version := &apirequest.RequestInfo{Verb: "get", Path: "/version"}
	for _, tc := range []struct {
		name, target string
		info         *apirequest.RequestInfo
		want         string // the refusal's message contains; "" passes
	}{
		{"not a duration", "/api/v1/namespaces/ns/configmaps/a?timeout=bogus", get, `invalid timeout specified in the request URL - time: invalid duration "bogus"`},
		{"no unit", "/api/v1/namespaces/ns/configmaps/a?timeout=10", get, `missing unit in duration "10"`},
		{"a non-resource path", "/version?timeout=xyz", version, "invalid timeout specified in the request URL"},
		{"a duration", "/api/v1/namespaces/ns/configmaps/a?timeout=30s", get, ""},
		{"empty", "/api/v1/namespaces/ns/configmaps/a?timeout=", get, ""},
		{"another parameter's name", "/api/v1/namespaces/ns/configmaps/a?mytimeout=bogus", get, ""},
		{"a watch is long-running", "/api/v1/namespaces/ns/configmaps?watch=true&timeout=bogus", watch, ""},
		{"a log is long-running", "/api/v1/namespaces/ns/pods/p/log?timeout=bogus", podLog, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := &Request{HTTP: httptest.NewRequest("GET", tc.target, nil), Info: tc.info}
			res, refused := a.refusedTimeout(context.Background(), req)
			switch {
			case refused != (tc.want != ""):
				t.Fatalf("refused = %v, want %v (%s)", refused, tc.want != "", res.Explanation)
			case !refused:
			case res.Status == nil || res.Status.Code != 400 || res.Status.Reason != "BadRequest" || !strings.Contains(res.Status.Message, tc.want):
				t.Errorf("refusal %+v, want 400 BadRequest containing %q", res.Status, tc.want)
			case !strings.Contains(res.Explanation, "before authentication"):
				t.Errorf("explanation %q does not say it comes before authentication", res.Explanation)
			}
		})
	}
}

// TestBootstrapTokenLike: only a bearer token of a bootstrap token's form
// waits for the bootstrap-token secrets to sync.
func TestBootstrapTokenLike(t *testing.T) {
	for _, tc := range []struct {
		header string
		want   bool
	}{
		{"Bearer abcdef.0123456789abcdef", true},
		{"bearer abcdef.0123456789abcdef", true},
		{"Bearer  abcdef.0123456789abcdef", false}, // no token, to the apiserver
		{"Bearer admin-token", false},
		{"Bearer ABCDEF.0123456789abcdef", false},
		{"Bearer abcdef.0123456789abcdef0", false},
		{"Basic YWRtaW46cGFzcw==", false},
		{"", false},
	} {
		r := httptest.NewRequest("GET", "/api", nil)
		if tc.header != "" {
			r.Header.Set("Authorization", tc.header)
		}
		if got := bootstrapTokenLike(r); got != tc.want {
			t.Errorf("%q: %v, want %v", tc.header, got, tc.want)
		}
	}
	if bootstrapTokenLike(nil) {
		t.Error("no request: a bootstrap token")
	}
}
