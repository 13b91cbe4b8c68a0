package flowview

import (
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/record"
)

func TestCaller(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    record.Record
		want string
	}{
		{"a user", record.Record{Identity: "token", Request: record.Request{User: "alice"}}, "alice"},
		{"an impersonating user", record.Record{Identity: "certificate", Request: record.Request{User: "dave", ActingAs: "erin"}}, "dave as erin"},
		{"acting as itself", record.Record{Request: record.Request{User: "dave", ActingAs: "dave"}}, "dave"},
		{"a token the apiserver refused", record.Record{Identity: "token"}, "token"},
		{"a rejected certificate", record.Record{Identity: "rejected"}, "rejected"},
		{"nothing known", record.Record{}, None},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Caller(&tc.r); got != tc.want {
				t.Errorf("Caller = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestVerb(t *testing.T) {
	for _, tc := range []struct {
		q    record.Request
		want string
	}{
		{record.Request{Method: "GET", Verb: "watch"}, "watch"},
		{record.Request{Method: "GET"}, "GET"},
		{record.Request{}, None},
	} {
		if got := Verb(&record.Record{Request: tc.q}); got != tc.want {
			t.Errorf("Verb(%+v) = %q, want %q", tc.q, got, tc.want)
		}
	}
}

func TestResource(t *testing.T) {
	for _, tc := range []struct {
		name string
		q    record.Request
		want string
	}{
		{"named, namespaced", record.Request{Resource: "pods", Namespace: "default", Name: "web-0"}, "pods default/web-0"},
		{"a subresource", record.Request{Resource: "pods", Subresource: "log", Namespace: "default", Name: "web-0"}, "pods/log default/web-0"},
		{"a non-core group", record.Request{Resource: "deployments", APIGroup: "apps", Namespace: "prod"}, "deployments.apps -n prod"},
		{"named, cluster-scoped", record.Request{Resource: "nodes", Name: "node-1"}, "nodes node-1"},
		{"the cluster's collection", record.Request{Resource: "namespaces"}, "namespaces"},
		// RequestInfo gives a Namespace its own name as its namespace.
		{"a Namespace", record.Request{Resource: "namespaces", Namespace: "team-a", Name: "team-a"}, "namespaces team-a"},
		{"a Namespace's subresource", record.Request{Resource: "namespaces", Subresource: "finalize", Namespace: "team-a", Name: "team-a"}, "namespaces/finalize team-a"},
		{"a non-resource request", record.Request{Path: "/healthz"}, "/healthz"},
		{"nothing", record.Request{}, None},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Resource(&record.Record{Request: tc.q}); got != tc.want {
				t.Errorf("Resource = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestPredictedActualAgreement(t *testing.T) {
	for _, tc := range []struct {
		name      string
		p         record.Prediction
		a         record.Actual
		predicted string
		actual    string
		mark      string
		kind      AgreementKind
	}{
		{"a predicted success", record.Prediction{Status: 201}, record.Actual{Status: 201}, "201", "201", "=", Match},
		{"a predicted refusal", record.Prediction{Status: 403, Stage: record.StageAuthorization, Reason: "Forbidden"}, record.Actual{Status: 403, Reason: "Forbidden"}, "403 @authorization", "403", "=", Match},
		{"a wrong prediction", record.Prediction{Status: 200}, record.Actual{Status: 409}, "200", "409", "!=", Mismatch},
		{"unknown", record.Prediction{Stage: record.StageUnknown, Message: "cannot predict: x"}, record.Actual{Status: 200}, "unknown", "200", "?", Unknown},
		{"no answer", record.Prediction{Status: 200}, record.Actual{Error: "dial tcp: connection refused"}, "200", "error", "?", Unknown},
		{"nothing at all", record.Prediction{Status: 200}, record.Actual{}, "200", None, "?", Unknown},
		{"the client went away before the answer", record.Prediction{Status: 200}, record.Actual{Status: 499, Error: "client canceled the request"}, "200", "499", "?", Unknown},
		{"kproxy could not reach the apiserver", record.Prediction{Status: 200}, record.Actual{Status: 502, Error: "kproxy could not reach the apiserver at x: dial tcp: refused"}, "200", "502", "?", Unknown},
		{"the apiserver's own 502", record.Prediction{Status: 200}, record.Actual{Status: 502}, "200", "502", "!=", Mismatch},
		{"kproxy refused a caller it cannot forward exactly", record.Prediction{Status: 201}, record.Actual{Status: 403, Error: record.ErrorUnforwardable + "a control character"}, "201", "403", "?", Unknown},
		{"kproxy's own 401 for a certificate", record.Prediction{Status: 401, Stage: record.StageAuthentication}, record.Actual{Status: 401, Error: "answered by kproxy: the apiserver's 401"}, "401 @authentication", "401", "=", Match},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &record.Record{Predicted: tc.p, Actual: tc.a}
			if got := Predicted(r); got != tc.predicted {
				t.Errorf("Predicted = %q, want %q", got, tc.predicted)
			}
			if got := Actual(r); got != tc.actual {
				t.Errorf("Actual = %q, want %q", got, tc.actual)
			}
			mark, kind := Agreement(r)
			if mark != tc.mark || kind != tc.kind {
				t.Errorf("Agreement = %q, %v; want %q, %v", mark, kind, tc.mark, tc.kind)
			}
		})
	}
	if Match.String() != "match" || Mismatch.String() != "mismatch" || Unknown.String() != "unknown" {
		t.Errorf("AgreementKind names: %v %v %v", Match, Mismatch, Unknown)
	}
}

func TestReason(t *testing.T) {
	long := "cannot predict: storage: " + strings.Repeat("x", 200)
	for _, tc := range []struct {
		name string
		r    record.Record
		want string
	}{
		{"the answer's reason", record.Record{Predicted: record.Prediction{Status: 403, Stage: "authorization", Reason: "Forbidden"}, Actual: record.Actual{Status: 403, Reason: "Forbidden"}}, "Forbidden"},
		{"the predicted reason when the answer has none", record.Record{Predicted: record.Prediction{Status: 404, Stage: "storage", Reason: "NotFound"}, Actual: record.Actual{Status: 404}}, "NotFound"},
		{"no answer", record.Record{Predicted: record.Prediction{Status: 200}, Actual: record.Actual{Error: "upstream: EOF; retried"}}, "upstream: EOF"},
		{"a success", record.Record{Predicted: record.Prediction{Status: 200}, Actual: record.Actual{Status: 200}}, ""},
		{"unknown: the first clause", record.Record{Predicted: record.Prediction{Stage: record.StageUnknown,
			Message: "cannot predict: storage: the apiserver would now connect to 10.0.0.7:10250 (a kubelet, or the backend of a proxy): only it answers"}},
			"storage: the apiserver would now connect to 10.0.0.7:10250"},
		{"unknown, several causes", record.Record{Predicted: record.Prediction{Stage: record.StageUnknown,
			Message: "cannot predict: flowcontrol: the FlowSchemas and PriorityLevelConfigurations have not synced yet; authorization: x"}},
			"flowcontrol: the FlowSchemas and PriorityLevelConfigurations have not synced yet"},
		// Reasons that differ only by when are one reason (kproxy flows
		// --stats had a row per time).
		{"unknown, a time in the first clause", record.Record{Predicted: record.Prediction{Stage: record.StageUnknown,
			Message: "cannot predict: decode: the OpenAPI v2 document last changed at 2026-12-07T12:24:18Z (ETag B28C…); the request's If-None-Match"}},
			"decode: the OpenAPI v2 document last changed at TIME"},
		{"unknown, no message", record.Record{Predicted: record.Prediction{Stage: record.StageUnknown}}, "no reason given"},
		{"unknown, long", record.Record{Predicted: record.Prediction{Stage: record.StageUnknown, Message: long}}, "storage: " + strings.Repeat("x", 70) + "…"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Reason(&tc.r); got != tc.want {
				t.Errorf("Reason = %q, want %q", got, tc.want)
			}
		})
	}
	if got := UnknownReason(&record.Record{Predicted: record.Prediction{Status: 200}}); got != "" {
		t.Errorf("UnknownReason of a prediction = %q, want empty", got)
	}
}

func TestDuration(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"},
		{850, "850ns"},
		{4500, "4.5µs"},
		{4 * time.Microsecond, "4µs"},
		{9960, "10µs"},
		{340 * time.Microsecond, "340µs"},
		{340400, "340µs"},
		{999600, "1ms"},
		{1234567, "1.2ms"},
		{34567890, "35ms"},
		{2100 * time.Millisecond, "2.1s"},
		{59700 * time.Millisecond, "1m0s"},
		{65 * time.Second, "1m5s"},
		{2*time.Hour + 3*time.Minute + 10*time.Second, "2h3m"},
		{-1500 * time.Microsecond, "-1.5ms"},
	} {
		if got := Duration(int64(tc.d)); got != tc.want {
			t.Errorf("Duration(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}
