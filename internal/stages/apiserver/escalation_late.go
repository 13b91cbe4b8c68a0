package apiserver

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The RBAC registry's privilege-escalation check resolves the writer's
// roles from the authorizer's informers, in the apiserver as in the
// replay, and the replay runs after the request: a grant or a revocation
// that lands in between makes the two checks see different permissions
// (found by a probe: a RoleBinding patched by alice, refused 403 for a
// role she lacked, then alice granted it at once: the replay, behind a
// queue, predicted 200; 3 of 8 tries). When kproxy saw RBAC change after
// the request arrived and the two checks decided otherwise, the verdict
// says nothing about the request.

// escalationMessage reports the words of the RBAC registry's escalation
// checks' refusals (labelled authorization: labelling.go).
func escalationMessage(msg string) bool {
	return strings.Contains(msg, "attempting to grant RBAC permissions not currently held") ||
		strings.Contains(msg, "must have cluster-admin privileges to use the aggregationRule")
}

// escalationRefusal reports a refusal of the escalation checks.
func escalationRefusal(st *metav1.Status) bool {
	return st != nil && st.Code == http.StatusForbidden && escalationMessage(st.Message)
}

// rbacWrite reports a write of a role or a binding, which the escalation
// checks guard.
func rbacWrite(group, resource, subresource string) bool {
	if group != "rbac.authorization.k8s.io" || subresource != "" {
		return false
	}
	switch resource {
	case "roles", "clusterroles", "rolebindings", "clusterrolebindings":
		return true
	}
	return false
}

// passedEscalation reports an answer only a write past the escalation
// check gets: a success, or the store's or validation's refusal.
func passedEscalation(status int) bool {
	return status >= 200 && status < 300 || status == http.StatusConflict || status == http.StatusUnprocessableEntity
}

// escalationLate says why the replay's escalation verdict on an RBAC
// write, read after kproxy saw RBAC change since the request arrived, is
// not the request's, or "".
func (r *Run) escalationLate(ctx context.Context) string {
	if r.Read || r.actual == nil || r.changes == nil || r.changes.authz == nil || r.arrival.IsZero() || !rbacWrite(r.group, r.Resource, r.Subresource) {
		return ""
	}
	changed := r.changes.authz(r.arrival)
	if changed == "" {
		return ""
	}
	aw, ok := r.actual(ctx)
	if !ok {
		return ""
	}
	here := escalationRefusal(r.Status)
	there := escalationRefusal(aw.Refusal)
	switch {
	case here && passedEscalation(aw.Status):
		return fmt.Sprintf("the apiserver's RBAC registry let the write past its privilege-escalation check (it answered %d), and the replay's refuses it: "+
			"kproxy saw %s change after this request arrived, so the permissions the writer held are not known", aw.Status, changed)
	case !here && there:
		return fmt.Sprintf("the apiserver's RBAC registry refused the write for privilege escalation (%s), and the replay's lets it past: "+
			"kproxy saw %s change after this request arrived, so the permissions the writer held are not known", aw.Refusal.Message, changed)
	}
	return ""
}
