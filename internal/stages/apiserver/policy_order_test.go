package apiserver

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// TestPolicyOrder: a replay refused by one admission policy where
// the apiserver refused by another is unknown (the apiserver reports the
// first denying policy in an order it draws again on each reload: the two
// answers below are v1.37.2's to the same create, before and after a
// reload); the same policy's refusal stands.
func TestPolicyOrder(t *testing.T) {
	a := &metav1.Status{Code: 403, Reason: metav1.StatusReasonForbidden, Message: `configmaps "z6" is forbidden: ValidatingAdmissionPolicy 'deny-a' with binding 'deny-a' denied request: deny-a says no`}
	b := &metav1.Status{Code: 422, Reason: metav1.StatusReasonInvalid, Message: `configmaps "z6" is forbidden: ValidatingAdmissionPolicy 'deny-b' with binding 'deny-b' denied request: deny-b says no`}
	otherBinding := &metav1.Status{Code: 403, Reason: metav1.StatusReasonForbidden, Message: `configmaps "z6" is forbidden: ValidatingAdmissionPolicy 'deny-a' with binding 'deny-a-2' denied request: deny-a says no`}
	quota := &metav1.Status{Code: 403, Message: `configmaps "z6" is forbidden: exceeded quota: q`}
	// v1.37.2's answers to two creates, two MutatingAdmissionPolicies whose
	// mutations fail, before and after a reload.
	mapB := &metav1.Status{Code: 403, Reason: metav1.StatusReasonInvalid, Message: `policy 'mp-b' with binding 'mp-b' denied request: expression '[JSONPatch{op: "add", path: "/metadata/annotations", value: {"x": object.metadata.labels["nope-mp-b"]}}]' resulted in error: no such key: labels`}
	mapC := &metav1.Status{Code: 403, Reason: metav1.StatusReasonInvalid, Message: `policy 'mp-c' with binding 'mp-c' denied request: expression '[JSONPatch{op: "add", path: "/metadata/annotations", value: {"x": object.metadata.labels["nope-mp-c"]}}]' resulted in error: no such key: labels`}
	// v1.37.2's refusal by a policy whose paramKind it could not map: no
	// binding named (the replay's, TestPolicyParamKindServedLater).
	unconfigured := &metav1.Status{Code: 422, Reason: metav1.StatusReasonInvalid, Message: `configmaps "c4" is forbidden: ValidatingAdmissionPolicy 'deny-a' denied request: failed to configure policy: failed to find resource referenced by paramKind: 'x.test/v1, Kind=Dial'`}
	for _, tc := range []struct {
		name     string
		replay   *metav1.Status
		answered int
		refusal  *metav1.Status
		known    bool // the answer is known
		want     string
		decided  string // the replay's refusing stage: validating-admission if ""
	}{
		{"another policy", a, 422, b, true, `ValidatingAdmissionPolicy "deny-a" (binding "deny-a") refused kproxy's replay (403) and "deny-b" (binding "deny-b") the apiserver's (422)`, ""},
		{"another binding of the policy", a, 403, otherBinding, true, `and "deny-a" (binding "deny-a-2") the apiserver's (403)`, ""},
		{"the same policy", b, 422, b, true, "", ""},
		{"the same policy, not configured in the replay", unconfigured, 403, a, true, "", ""},
		{"another plugin in the apiserver", a, 403, quota, true, "", ""},
		{"another plugin in the replay", quota, 422, b, true, "", ""},
		{"the apiserver admitted", a, 201, nil, true, "", ""},
		{"no answer", a, 0, nil, false, "", ""},
		{"another failing mutating policy", mapB, 403, mapC, true, `MutatingAdmissionPolicy "mp-b" (binding "mp-b") refused kproxy's replay (403) and "mp-c" (binding "mp-c") the apiserver's (403)`, record.StageMutatingAdmission},
		{"the same failing mutating policy", mapC, 403, mapC, true, "", record.StageMutatingAdmission},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.decided == "" {
				tc.decided = record.StageValidatingAdmission
			}
			r := &Run{Verb: "create", Resource: "configmaps", Status: tc.replay, Code: int(tc.replay.Code), Decided: tc.decided, actual: func(context.Context) (Answer, bool) {
				return Answer{Status: tc.answered, Refusal: tc.refusal}, tc.known
			}}
			checkOwnAnswer(t, r.policyOrderHere(context.Background()), tc.want, "in an order it draws again each time it reloads its policies")
		})
	}
}
