package stages

import (
	"net/http"
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
		{"the current hash, the documents changing around the arrival (it was current then too)", false, current, link, http.StatusOK},
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
