package stages

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/record"
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

// TestShedForLoad: a request the apiserver shed for load (APF's or
// max-in-flight's plain-text 429), or refused with another 429 the replay
// allowed, has an unknown prediction saying what the later stages would
// answer; a refusal predicted before flowcontrol, a 429 the replay
// predicted, or any other answer keeps the replay's prediction.
func TestShedForLoad(t *testing.T) {
	shed := record.Actual{Status: 429, Message: "Too many requests, please try again later.", PriorityLevel: "workload-low", FlowSchema: "service-accounts"}
	allowed := record.Prediction{Status: 200, FlowSchema: "service-accounts", PriorityLevel: "workload-low"}
	for _, tc := range []struct {
		name   string
		p      record.Prediction
		a      record.Actual
		want   string // the unknown's message contains; "" keeps p
		wantFS string
	}{
		{name: "APF shed an allowed request", p: allowed, a: shed, want: `429 from API Priority and Fairness, priority level "workload-low"); whether a request is shed depends on the apiserver's load at that instant, which kproxy does not predict; the stages after flowcontrol allow the request (200)`, wantFS: "service-accounts"},
		{name: "APF shed a request authorization refuses", p: record.Prediction{Status: 403, Stage: record.StageAuthorization}, a: shed, want: "the stages after flowcontrol refuse it at authorization (403)"},
		{name: "APF shed, names not resolved", p: allowed, a: record.Actual{Status: 429, Message: shed.Message, PriorityLevelUID: "0f3c"}, want: "priority level uid 0f3c", wantFS: "service-accounts"},
		{name: "max-in-flight shed", p: allowed, a: record.Actual{Status: 429, Message: shed.Message}, want: "429 from max-in-flight", wantFS: "service-accounts"},
		{name: "refused by authentication first", p: record.Prediction{Status: 401, Stage: record.StageAuthentication}, a: shed},
		{name: "refused by impersonation first", p: record.Prediction{Status: 403, Stage: record.StageImpersonation}, a: shed},
		{name: "already unknown", p: record.Prediction{Stage: record.StageUnknown, Message: "cannot predict: x"}, a: shed},
		{name: "a watch cache initializing, the replay allowing", p: allowed, a: record.Actual{Status: 429, Reason: "TooManyRequests", Message: "storage is (re)initializing"},
			want: `the apiserver refused the request with 429 ("storage is (re)initializing"), a limit of that instant`, wantFS: "service-accounts"},
		{name: "a Status 429, the replay refusing at authorization", p: record.Prediction{Status: 403, Stage: record.StageAuthorization}, a: record.Actual{Status: 429, Reason: "TooManyRequests", Message: "storage is (re)initializing"}},
		{name: "an eviction's budget, predicted", p: record.Prediction{Status: 429, Stage: record.StageStorage, Reason: "TooManyRequests"}, a: record.Actual{Status: 429, Reason: "TooManyRequests", Message: "Cannot evict pod as it would violate the pod's disruption budget."}},
		{name: "answered 200", p: allowed, a: record.Actual{Status: 200}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ShedForLoad(tc.p, tc.a)
			if tc.want == "" {
				if got != tc.p {
					t.Errorf("ShedForLoad = %+v, want the prediction kept: %+v", got, tc.p)
				}
				return
			}
			if got.Stage != record.StageUnknown || !strings.HasPrefix(got.Message, "cannot predict: the apiserver ") || !strings.Contains(got.Message, tc.want) {
				t.Errorf("ShedForLoad = %+v, want unknown saying %q", got, tc.want)
			}
			if got.FlowSchema != tc.wantFS || got.Status != 0 {
				t.Errorf("ShedForLoad = %+v: want the classification kept (flow schema %q) and no status", got, tc.wantFS)
			}
		})
	}
}
