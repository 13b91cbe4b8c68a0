package stages

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kproxy/kproxy/internal/record"
)

// TestOpenAPIV3Hash: a document asked for by hash, against the index's
// entry for it (as kube-apiserver v1.37.2 lists apps/v1).
func TestOpenAPIV3Hash(t *testing.T) {
	const current = "A9C4B1F0E37D2C6B5A8F9E0D1C2B3A4F5E6D7C8B9A0F1E2D3C4B5A6F7E8D9C0B1A2F3E4D5C6B7A8F9E0D1C2B3A4F5E6D7C8B9A0F1E2D3C4B5A6F7E8D9C0B"
	link := "/openapi/v3/apis/apps/v1?hash=" + current
	for _, tc := range []struct {
		name    string
		settled bool
		hash    string
		link    string
		want    int // the predicted status; 0: unknown
	}{
		{"the current hash", true, current, link, http.StatusOK},
		{"another hash", true, "0123456789ABCDEF", link, http.StatusMovedPermanently},
		{"another hash, the documents changing around the arrival", false, "0123456789ABCDEF", link, 0},
		{"the current hash, the documents changed seconds ago", false, current, link, http.StatusOK},
		{"an entry without a hash", true, current, "/openapi/v3/apis/apps/v1", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := openAPIV3Hash(tc.settled, "apis/apps/v1", tc.hash, tc.link)
			switch {
			case tc.want == 0 && !res.Unknown:
				t.Errorf("%+v, want unknown", res)
			case tc.want != 0 && (res.Unknown || res.Outcome != record.Pass || answerOf(res) != tc.want):
				t.Errorf("%+v, want a pass answered %d", res, tc.want)
			}
		})
	}
}

// answerOf is the status a passing decode result predicts.
func answerOf(r Result) int {
	if r.Answer != 0 {
		return r.Answer
	}
	return http.StatusOK
}

// TestOpenAPIV3ByETag: a document asked for again with its ETag (the hash
// the index links it by), as ServeContent answers it.
func TestOpenAPIV3ByETag(t *testing.T) {
	const current = "A9C4B1F0E37D2C6B"
	link := "/openapi/v3/apis/apps/v1?hash=" + current
	for _, tc := range []struct {
		name    string
		header  http.Header
		settled bool
		link    string
		want    int // the predicted status; 0: unknown
	}{
		{"If-None-Match, the current ETag", http.Header{"If-None-Match": {`"` + current + `"`}}, true, link, http.StatusNotModified},
		{"If-None-Match, weak and among others", http.Header{"If-None-Match": {`"x", W/"` + current + `"`}}, true, link, http.StatusNotModified},
		{"If-None-Match, another ETag", http.Header{"If-None-Match": {`"nomatch"`}}, true, link, http.StatusOK},
		{"If-None-Match, another ETag, and If-Modified-Since (not looked at)", http.Header{"If-None-Match": {`"nomatch"`}, "If-Modified-Since": {"Fri, 01 Jan 2100 00:00:00 GMT"}}, true, link, http.StatusOK},
		{"If-Match, another ETag", http.Header{"If-Match": {`"nomatch"`}}, true, link, http.StatusPreconditionFailed},
		{"If-None-Match, the documents changing around the arrival", http.Header{"If-None-Match": {`"` + current + `"`}}, false, link, 0},
		{"an entry without a hash", http.Header{"If-None-Match": {`"` + current + `"`}}, true, "/openapi/v3/apis/apps/v1", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !conditionalByETag(tc.header) {
				t.Fatalf("%v: not conditional by ETag alone", tc.header)
			}
			hr := httptest.NewRequest(http.MethodGet, "/openapi/v3/apis/apps/v1", nil)
			hr.Header = tc.header
			res := openAPIV3ByETag(context.Background(), &Request{HTTP: hr}, tc.settled, "apis/apps/v1", tc.link)
			switch {
			case tc.want == 0 && !res.Unknown:
				t.Errorf("%+v, want unknown", res)
			case tc.want == http.StatusPreconditionFailed && (res.Outcome != record.Reject || res.Status == nil || res.Status.Code != int32(tc.want)):
				t.Errorf("%+v, want a refusal %d", res, tc.want)
			case tc.want != 0 && tc.want < 400 && (res.Unknown || res.Outcome != record.Pass || answerOf(res) != tc.want):
				t.Errorf("%+v, want a pass answered %d", res, tc.want)
			}
		})
	}
	// Conditions ServeContent decides by time stay unknown.
	for _, h := range []http.Header{
		{"If-Modified-Since": {"Fri, 01 Jan 2100 00:00:00 GMT"}},
		{"If-Match": {`"x"`}, "Range": {"bytes=0-1"}},
		{"If-None-Match": {`"x"`}, "If-Unmodified-Since": {"Fri, 01 Jan 2100 00:00:00 GMT"}},
	} {
		if conditionalByETag(h) {
			t.Errorf("%v: said to be decided by the ETag alone", h)
		}
	}
}
