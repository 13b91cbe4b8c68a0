package stages

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// TestMaxInFlight covers --enable-priority-and-fairness=false, where the
// apiserver counts requests against --max-requests-inflight and
// --max-mutating-requests-inflight instead of classifying them.
func TestMaxInFlight(t *testing.T) {
	o, _, err := apiserver.OptionsFromArgs([]string{"--enable-priority-and-fairness=false", "--max-mutating-requests-inflight=7", "--max-requests-inflight=0"})
	if err != nil {
		t.Fatal(err)
	}
	st := newFlowControl(&machinery{opts: o})
	for _, tc := range []struct{ method, path, want string }{
		{"POST", "/api/v1/namespaces/default/configmaps", "--max-mutating-requests-inflight=7"},
		{"GET", "/api/v1/namespaces/default/configmaps", "--max-requests-inflight=0: no limit applies"},
		{"GET", "/api/v1/namespaces/default/configmaps?watch=1", "long-running"},
		{"POST", "/api/v1/namespaces/default/pods/p/exec", "long-running"},
	} {
		r := httptest.NewRequest(tc.method, tc.path, nil)
		info, err := ResolveRequestInfo(r)
		if err != nil {
			t.Fatal(err)
		}
		res := st.Run(context.Background(), &Request{HTTP: r, Info: info})
		if res.Outcome != "pass" || !strings.Contains(res.Explanation, tc.want) {
			t.Errorf("%s %s: %s %q, want pass with %q", tc.method, tc.path, res.Outcome, res.Explanation, tc.want)
		}
	}
}
