package apiserver

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestLimitRangeOrder: a verdict LimitRanger decided that the apiserver's
// answer contradicts is unknown where the namespace has several
// LimitRanges (applied in an order drawn per request), in either
// direction; with one, or where the answers agree, the verdict stands.
func TestLimitRangeOrder(t *testing.T) {
	cpu := &metav1.Status{Code: 403, Reason: metav1.StatusReasonForbidden, Message: `pods "p" is forbidden: maximum cpu usage per Container is 1, but limit is 2`}
	mem := &metav1.Status{Code: 403, Reason: metav1.StatusReasonForbidden, Message: `pods "p" is forbidden: maximum memory usage per Container is 1Gi, but limit is 2Gi`}
	quota := &metav1.Status{Code: 403, Reason: metav1.StatusReasonForbidden, Message: `pods "p" is forbidden: exceeded quota: q`}
	shed := &metav1.Status{Code: 429, Message: "Too many requests"}
	for _, tc := range []struct {
		name     string
		replay   *metav1.Status // nil: the replay admitted the write
		plugin   string         // the plugin that refused in the replay
		ranges   int
		answered int
		refusal  *metav1.Status
		want     string // contains; "" keeps the verdict
	}{
		{"refused in the replay, admitted by the apiserver", cpu, "LimitRanger", 2, 201, nil, "the replay's LimitRanger refused the write (403: " + cpu.Message + "), and the apiserver admitted the write (201)"},
		{"refused by another LimitRange there", cpu, "LimitRanger", 3, 403, mem, "and the apiserver refused it otherwise (403: " + mem.Message + ")"},
		{"refused alike", cpu, "LimitRanger", 2, 403, cpu, ""},
		{"one LimitRange", cpu, "LimitRanger", 1, 201, nil, ""},
		{"refused by another plugin in the replay", quota, "ResourceQuota", 2, 201, nil, ""},
		{"shed by the apiserver", cpu, "LimitRanger", 2, 429, shed, ""},
		{"admitted in the replay, refused by the apiserver's LimitRanger", nil, "", 2, 403, cpu, "the apiserver's LimitRanger refused the write (403: " + cpu.Message + "), and the replay's admits it"},
		{"admitted in the replay, refused by another plugin", nil, "", 2, 403, quota, ""},
		{"admitted in the replay, one LimitRange", nil, "", 1, 403, cpu, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Run{Verb: "create", Resource: "pods", namespace: "ns", Status: tc.replay, PluginErrName: tc.plugin,
				limitRanges: func(ns string) int {
					if ns != "ns" {
						t.Errorf("counted the LimitRanges of %q, want the request's namespace", ns)
					}
					return tc.ranges
				},
				actual: func(context.Context) (Answer, bool) { return Answer{Status: tc.answered, Refusal: tc.refusal}, true }}
			var got string
			if tc.replay != nil {
				r.Code = int(tc.replay.Code)
				got = r.limitRangeOrderHere(context.Background())
			} else {
				got = r.limitRangeOrderThere(Answer{Status: tc.answered, Refusal: tc.refusal})
			}
			checkOwnAnswer(t, got, tc.want, "in an order it draws again for each request")
		})
	}
}
