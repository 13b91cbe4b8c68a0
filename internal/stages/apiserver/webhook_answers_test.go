package apiserver

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestWebhookAnswers: a verdict that hangs on an admission webhook the
// apiserver's answer contradicts is unknown, in either direction; one it
// does not contradict stands.
func TestWebhookAnswers(t *testing.T) {
	denied := &metav1.Status{Code: 403, Message: `admission webhook "flip.example.com" denied the request: no`}
	failed := &metav1.Status{Code: 500, Message: `Internal error occurred: failed calling webhook "slow.example.com": context deadline exceeded`}
	deniedOtherwise := &metav1.Status{Code: 403, Message: `admission webhook "flip.example.com" denied the request: no, again`}
	exists := &metav1.Status{Code: 409, Message: `configmaps "x" already exists`}
	quota := &metav1.Status{Code: 403, Message: `configmaps "x" is forbidden: exceeded quota: q`}
	for _, tc := range []struct {
		name     string
		replay   *metav1.Status // nil: the replay admitted the write
		answered int
		refusal  *metav1.Status
		want     string // contains; "" keeps the verdict
	}{
		{"denied in the replay, admitted by the apiserver", denied, 201, nil, `admission webhook "flip.example.com" refused kproxy's call (403`},
		{"denied in the replay, refused otherwise by the apiserver", denied, 409, exists, "the apiserver refused the write otherwise (409"},
		{"a failed call in the replay, admitted by the apiserver", failed, 201, nil, `admission webhook "slow.example.com" refused kproxy's call (500`},
		{"denied by both", denied, 403, denied, ""},
		{"denied by both, with other messages", denied, 403, deniedOtherwise, ""},
		{"denied in the replay, shed by the apiserver", denied, 429, &metav1.Status{Code: 429, Message: "Too many requests"}, ""},
		{"refused by another plugin in the replay, admitted by the apiserver", quota, 201, nil, ""},
		{"admitted in the replay, denied by the apiserver's call", nil, 403, denied, `the apiserver's call to admission webhook "flip.example.com" refused the write (403`},
		{"admitted in the replay, the apiserver's call failed", nil, 500, failed, `admission webhook "slow.example.com"`},
		{"admitted in the replay, refused by another plugin", nil, 403, quota, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Run{Verb: "create", Resource: "configmaps", Status: tc.replay, actual: func(context.Context) (Answer, bool) {
				return Answer{Status: tc.answered, Refusal: tc.refusal}, true
			}}
			if tc.replay != nil {
				r.Code = int(tc.replay.Code)
			}
			var got string
			if tc.replay != nil {
				got = r.webhookRefusedOnlyHere(context.Background())
			} else {
				got = r.webhookRefusedOnlyThere(Answer{Status: tc.answered, Refusal: tc.refusal})
			}
			switch {
			case tc.want == "" && got != "":
				t.Errorf("unknown %q, want the verdict kept", got)
			case tc.want != "" && !strings.Contains(got, tc.want):
				t.Errorf("got %q, want it to say %q", got, tc.want)
			case tc.want != "" && !strings.Contains(got, "a webhook's answer is its own"):
				t.Errorf("%q does not say why", got)
			}
		})
	}
}
