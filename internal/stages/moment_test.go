package stages

import (
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/record"
)

// TestOfTheMoment: a request the apiserver shed for load (APF's or
// max-in-flight's plain-text 429), or refused with another 429 or failed
// with a 500, 503 or 504 where the replay allowed it, has an unknown
// prediction saying what the replay's stages answer; a refusal predicted
// before flowcontrol, an answer the replay predicted, kproxy's own answer
// or any other keeps the replay's prediction.
func TestOfTheMoment(t *testing.T) {
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
		{name: "an eviction refused for its budget, the replay (reading it later) allowing", p: allowed,
			a:    record.Actual{Status: 429, Reason: "TooManyRequests", Message: "Cannot evict pod as it would violate the pod's disruption budget."},
			want: `the apiserver refused the request with 429 ("Cannot evict pod as it would violate the pod's disruption budget."), a limit of that instant`, wantFS: "service-accounts"},
		{name: "an eviction's budget, predicted", p: record.Prediction{Status: 429, Stage: record.StageStorage, Reason: "TooManyRequests"}, a: record.Actual{Status: 429, Reason: "TooManyRequests", Message: "Cannot evict pod as it would violate the pod's disruption budget."}},
		{name: "answered 200", p: allowed, a: record.Actual{Status: 200}},
		{name: "etcd failing (500)", p: allowed, a: record.Actual{Status: 500, Reason: "InternalError", Message: "etcdserver: request timed out"},
			want: `the apiserver failed the request with 500 ("etcdserver: request timed out"), a failure of that instant (etcd, a request out of time, a backend unavailable) that the same code, replayed after it, did not meet; the replay's stages allow the request (200)`, wantFS: "service-accounts"},
		{name: "out of time (504)", p: allowed, a: record.Actual{Status: 504, Reason: "Timeout", Message: "Timeout: request did not complete within requested timeout - context deadline exceeded"},
			want: "failed the request with 504", wantFS: "service-accounts"},
		{name: "a resourceVersion the watch cache had not reached (504)", p: allowed, a: record.Actual{Status: 504, Reason: "Timeout", Message: "Too large resource version: 3041, current: 3040"},
			want: `answered 504 ("Too large resource version: 3041, current: 3040"): its watch cache waited up to 3 seconds`, wantFS: "service-accounts"},
		{name: "a backend gone (503)", p: allowed, a: record.Actual{Status: 503, Reason: "ServiceUnavailable", Message: "service unavailable"}, want: "failed the request with 503", wantFS: "service-accounts"},
		{name: "a 500 the replay predicted (etcd's size limit)", p: record.Prediction{Status: 500, Stage: record.StageStorage}, a: record.Actual{Status: 500, Message: "etcdserver: request is too large"}},
		{name: "a 500 the replay refused otherwise", p: record.Prediction{Status: 422, Stage: record.StageValidation}, a: record.Actual{Status: 500, Message: "x"}},
		// A refusal resting on what failed (probe W: GETs answered 504
		// while etcd was down, predicted 404 from a read made after).
		{name: "out of time (504), storage refusing", p: record.Prediction{Status: 404, Stage: record.StageStorage, Reason: "NotFound"},
			a: record.Actual{Status: 504, Reason: "Timeout", Message: "request did not complete within the allotted timeout"}, want: "the stages after flowcontrol refuse it at storage (404)"},
		{name: "out of time (504), a webhook refusing", p: record.Prediction{Status: 400, Stage: record.StageValidatingAdmission},
			a: record.Actual{Status: 504, Message: "request did not complete within the allotted timeout"}, want: "failed the request with 504"},
		{name: "out of time (504), authentication refusing", p: record.Prediction{Status: 401, Stage: record.StageAuthentication},
			a: record.Actual{Status: 504, Message: "request did not complete within the allotted timeout"}},
		{name: "etcd failing (500), storage refusing", p: record.Prediction{Status: 409, Stage: record.StageStorage},
			a: record.Actual{Status: 500, Message: "etcdserver: request timed out"}, want: "failed the request with 500"},
		{name: "a 504 the replay predicted", p: record.Prediction{Status: 504, Stage: record.StageStorage}, a: record.Actual{Status: 504, Message: "x"}},
		{name: "a 501 (a fixed answer, not one of the moment)", p: allowed, a: record.Actual{Status: 501}},
		{name: "kproxy's own 502", p: allowed, a: record.Actual{Status: 502, Error: "kproxy could not reach the apiserver at 127.0.0.1:6443"}},
		{name: "kproxy's own answer, a 504", p: allowed, a: record.Actual{Status: 504, Error: "client canceled the request"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := OfTheMoment(tc.p, tc.a)
			if tc.want == "" {
				if got != tc.p {
					t.Errorf("OfTheMoment = %+v, want the prediction kept: %+v", got, tc.p)
				}
				return
			}
			if got.Stage != record.StageUnknown || !strings.HasPrefix(got.Message, "cannot predict: the apiserver ") || !strings.Contains(got.Message, tc.want) {
				t.Errorf("OfTheMoment = %+v, want unknown saying %q", got, tc.want)
			}
			if got.FlowSchema != tc.wantFS || got.Status != 0 {
				t.Errorf("OfTheMoment = %+v: want the classification kept (flow schema %q) and no status", got, tc.wantFS)
			}
		})
	}
}
