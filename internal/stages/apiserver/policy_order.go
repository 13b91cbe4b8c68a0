package apiserver

import (
	"context"
	"fmt"

	"github.com/kproxy/kproxy/internal/record"
)

// When several ValidatingAdmissionPolicies deny a request, the plugin
// reports the first of them, in the order its policy source lists its
// hooks: a walk over a Go map, drawn again each time the policies are
// reloaded, in the apiserver as in the replay. Two policies that deny a
// ConfigMap with reasons Forbidden and Invalid get it answered 403 for a
// while, then 422 after any policy changes (seen on v1.37.2: eight
// reloads, two orders). The replay cannot know the apiserver's draw, so
// where the two name different policies the verdict is unknown; where no
// answer is known (kproxy explain, the local engine) the replay's own
// draw stands. MutatingAdmissionPolicies run in the same drawn order, and
// the first that fails (a mutation's expression in error, params not
// found) is the one reported: two failing policies are the same coin
// flip (seen on v1.37.2: three of fourteen creates after reloads named
// the other policy in the replay).

// policyOrderHere says why the replay's refusal by one admission policy,
// where the apiserver refused by another, is not a prediction, or "".
func (r *Run) policyOrderHere(ctx context.Context) string {
	if r.Status == nil || r.actual == nil {
		return ""
	}
	policy, binding, ok := record.DenyingPolicy(r.Status.Message)
	if !ok {
		return ""
	}
	aw, ok := r.actual(ctx)
	if !ok || aw.Refusal == nil {
		return ""
	}
	theirPolicy, theirBinding, ok := record.DenyingPolicy(aw.Refusal.Message)
	// A policy that could not be configured is named without a binding:
	// the same policy, refusing for another reason, is no draw.
	if !ok || (theirPolicy == policy && (theirBinding == binding || binding == "" || theirBinding == "")) {
		return ""
	}
	kind := "ValidatingAdmissionPolicy"
	if r.Decided == record.StageMutatingAdmission {
		kind = "MutatingAdmissionPolicy"
	}
	return fmt.Sprintf("%s %q (binding %q) refused kproxy's replay (%d) and %q (binding %q) the apiserver's (%d): "+
		"when several policies deny a request, kube-apiserver reports the first in an order it draws again each time it reloads its policies, "+
		"so which one it reports, and its status, is not known",
		kind, policy, binding, r.Code, theirPolicy, theirBinding, aw.Status)
}
