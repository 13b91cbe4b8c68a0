package apiserver

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestAdmissionChangesSince: the clocks count a namespaced kind per
// namespace, namespaces by their own name, and a cluster-scoped kind for
// every request; only the kinds an enabled plugin reads are watched.
func TestAdmissionChangesSince(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	f := informers.NewSharedInformerFactory(fake.NewClientset(), 0)
	c := watchAdmissionState(clk, f, []string{"NamespaceLifecycle", "LimitRanger", "Priority", "NodeRestriction"}, nil)
	if len(c.kinds) != 5 { // not ResourceQuotas, RuntimeClasses, ...
		t.Fatalf("%d kinds watched, want 5 (namespaces, LimitRanges, PriorityClasses, Nodes, Pods)", len(c.kinds))
	}
	arrival := clk.Now()
	clk.Step(time.Second)
	find := func(name string) *kindChanges { return kindNamed(t, c, name) }
	find("LimitRanges").mark(&corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: "small", Namespace: "a"}})
	find("the namespace (its labels, its phase)").mark(cache.DeletedFinalStateUnknown{Obj: &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "b"}}})
	for _, tc := range []struct {
		ns, want string
	}{
		{"a", "LimitRanges" + limitRangeLagNote},
		{"b", "the namespace (its labels, its phase)"},
		{"c", ""},
	} {
		if got := c.changedSince(arrival, tc.ns); got != tc.want {
			t.Errorf("changedSince(%q) = %q, want %q", tc.ns, got, tc.want)
		}
	}
	find("PriorityClasses").mark(&schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "high"}})
	if got := c.changedSince(arrival, "c"); got != "PriorityClasses" {
		t.Errorf("a cluster-scoped change: changedSince = %q, want PriorityClasses", got)
	}
	// LimitRanger's live lookups are kept 30 s: a change up to then
	// before the request counts.
	if got := c.changedSince(clk.Now(), "a"); got != "LimitRanges"+limitRangeLagNote {
		t.Errorf("a LimitRange changed just before the request: %q, want LimitRanges (its 30s)", got)
	}
	if got := c.changedSince(clk.Now().Add(31*time.Second), "a"); got != "" {
		t.Errorf("nothing changed in the 30s before the request: %q", got)
	}
	// A Node re-created with a new uid (NodeRestriction's mirror pods).
	mid := clk.Now()
	clk.Step(time.Second)
	find("Nodes").mark(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", UID: "new"}})
	if got := c.changedSince(mid, "any"); got != "Nodes" {
		t.Errorf("a Node's change: changedSince = %q, want Nodes", got)
	}
	// A pod deleted (a kubelet's final delete), in its namespace only.
	mid = clk.Now()
	clk.Step(time.Second)
	find("Pods").mark(cache.DeletedFinalStateUnknown{Obj: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "d"}}})
	if got := c.changedSince(mid, "d"); got != "Pods" {
		t.Errorf("a pod's deletion: changedSince = %q, want Pods", got)
	}
	if got := c.changedSince(mid, "e"); got != "" {
		t.Errorf("a pod's deletion elsewhere: changedSince = %q, want nothing", got)
	}
	// A namespace's change older than the horizon is pruned once the map
	// grows past its sweep size; a recent one stays.
	lr := find("LimitRanges")
	for i := range 1100 {
		lr.mark(&corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: "l", Namespace: fmt.Sprintf("old-%d", i)}})
	}
	clk.Step(2 * changeHorizon)
	for i := range 1000 {
		lr.mark(&corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: "l", Namespace: fmt.Sprintf("new-%d", i)}})
	}
	lr.mu.Lock()
	kept := len(lr.inNS)
	lr.mu.Unlock()
	if kept != 1000 || !lr.changedSince(clk.Now().Add(-time.Second), "new-0") {
		t.Errorf("after a sweep, %d namespaces kept, want the 1000 recent ones", kept)
	}
	var none *admissionChanges
	if got := none.changedSince(arrival, "a"); got != "" {
		t.Errorf("no clocks: %q", got)
	}
}

// TestAdmissionStateLate: a replay's admission verdict that contradicts
// the answer is unknown only when admission state changed after the
// request arrived, and only for an admission refusal.
func TestAdmissionStateLate(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	arrival := clk.Now()
	changed := &admissionChanges{clock: clk, kinds: []*kindChanges{{name: "LimitRanges", key: func(m metav1.Object) string { return m.GetNamespace() }, readBy: []string{"LimitRanger"}, inNS: map[string]int64{}, clock: clk}}}
	clk.Step(time.Second)
	changed.kinds[0].mark(&corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: "small", Namespace: "ns"}})
	unchanged := &admissionChanges{clock: clk}
	limit := &metav1.Status{Code: 403, Reason: metav1.StatusReasonForbidden, Message: `pods "p" is forbidden: maximum cpu usage per Container is 100m, but limit is 200m`}
	priority := &metav1.Status{Code: 403, Reason: metav1.StatusReasonForbidden, Message: `pods "p" is forbidden: no PriorityClass with name high was found`}
	rbac := &metav1.Status{Code: 403, Reason: metav1.StatusReasonForbidden, Message: `pods is forbidden: User "bob" cannot create resource "pods" in API group "" in the namespace "ns"`}
	webhook := &metav1.Status{Code: 400, Message: `admission webhook "deny.example.com" denied the request: no`}
	policy := &metav1.Status{Code: 422, Message: `pods "p" is forbidden: ValidatingAdmissionPolicy 'max' with binding 'max' denied request: too many`}

	t.Run("refused by the replay", func(t *testing.T) {
		for _, tc := range []struct {
			name     string
			run      *Run
			answered int // -403: refused for a PriorityClass; -1: by the authorizer; -2: over quota
			want     string
		}{
			{"LimitRanger, admitted by the apiserver", &Run{Status: limit, PluginErrName: "LimitRanger", changes: changed}, 201, "the replay's LimitRanger refuses it: kproxy saw LimitRanges change"},
			{"a dry run, admitted by the apiserver", &Run{Status: limit, PluginErrName: "LimitRanger", DryRun: true, changes: changed}, 201, "LimitRanges"},
			{"nothing changed", &Run{Status: limit, PluginErrName: "LimitRanger", changes: unchanged}, 201, ""},
			{"refused by both", &Run{Status: limit, PluginErrName: "LimitRanger", changes: changed}, 403, ""},
			{"refused by the apiserver for another reason", &Run{Status: limit, PluginErrName: "LimitRanger", changes: changed}, -403, "refuses it for another reason"},
			{"over quota for both, at other usages", &Run{Status: &metav1.Status{Code: 403, Message: `configmaps "c" is forbidden: exceeded quota: two, requested: count/configmaps=1, used: count/configmaps=3, limited: count/configmaps=2`},
				PluginErrName: "ResourceQuota", changes: changed}, -2, ""},
			{"refused by the apiserver's authorizer", &Run{Status: limit, PluginErrName: "LimitRanger", changes: changed}, -1, ""},
			{"not by admission", &Run{Status: limit, changes: changed}, 201, ""},
			{"ResourceQuota, a quota created after the request", &Run{Status: &metav1.Status{Code: 403, Message: `pods "p" is forbidden: failed quota: q: must specify limits.cpu for: c`},
				PluginErrName: "ResourceQuota", changes: changed}, 201, "the replay's ResourceQuota refuses it"},
			{"an exec (its answer is its stream)", &Run{Status: limit, PluginErrName: "LimitRanger", Subresource: "exec", changes: changed}, 201, ""},
			// LimitRanger mutates pods (their defaults) before the
			// validating plugins: its state moves their verdicts on a pod,
			// and on nothing else.
			{"PodSecurity, a pod, LimitRanges changed", &Run{Status: &metav1.Status{Code: 403, Message: `pods "p" is forbidden: violates PodSecurity "restricted:latest"`}, PluginErrName: "PodSecurity", changes: changed}, 201, "the replay's PodSecurity refuses it: kproxy saw LimitRanges change"},
			{"a policy, a LimitRange (the request's own, seen created), LimitRanges changed", &Run{Status: policy, PluginErrName: "ValidatingAdmissionPolicy", Resource: "limitranges", changes: changed}, 201, ""},
			{"a policy, a pod in group example.com, LimitRanges changed", &Run{Status: policy, PluginErrName: "ValidatingAdmissionPolicy", group: "example.com", changes: changed}, 201, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := tc.run
				r.arrival, r.namespace = arrival, "ns"
				if r.Resource == "" {
					r.Resource = "pods"
				}
				a := Answer{Status: tc.answered}
				switch tc.answered {
				case 403:
					a.Refusal = limit
				case -403:
					a = Answer{Status: 403, Refusal: priority}
				case -1:
					a = Answer{Status: 403, Refusal: rbac}
				case -2:
					a = Answer{Status: 403, Refusal: &metav1.Status{Code: 403, Message: `configmaps "c" is forbidden: exceeded quota: two, requested: count/configmaps=1, used: count/configmaps=2, limited: count/configmaps=2`}}
				}
				r.actual = func(context.Context) (Answer, bool) { return a, true }
				why := r.refusedByStateLate(context.Background())
				if (tc.want == "") != (why == "") || !strings.Contains(why, tc.want) {
					t.Errorf("refusedByStateLate = %q, want %q", why, tc.want)
				}
			})
		}
	})
	// RBAC changed after the request: the plugins that ask the authorizer.
	rbacChanged := &admissionChanges{clock: clk, authz: func(t time.Time) string {
		if t.Before(clk.Now()) {
			return "RBAC"
		}
		return ""
	}}
	approval := &metav1.Status{Code: 403, Reason: metav1.StatusReasonForbidden,
		Message: `certificatesigningrequests.certificates.k8s.io "race-6" is forbidden: user not permitted to approve requests with signerName "example.com/foo"`}
	t.Run("the authorizer's state", func(t *testing.T) {
		for _, tc := range []struct {
			name    string
			plugin  string
			changes *admissionChanges
			answer  Answer
			refused bool // the replay refused (as plugin); else it admitted
			want    string
		}{
			{"CertificateApproval refused, the apiserver allowed", "CertificateApproval", rbacChanged, Answer{Status: 200}, true,
				"the replay's CertificateApproval refuses it: kproxy saw RBAC (which admission's authorizer checks read) change"},
			{"CertificateApproval refused, RBAC unchanged", "CertificateApproval", unchanged, Answer{Status: 200}, true, ""},
			{"OwnerReferencesPermissionEnforcement refused, the apiserver allowed", "OwnerReferencesPermissionEnforcement", rbacChanged, Answer{Status: 201}, true, "RBAC"},
			{"LimitRanger refused, only RBAC changed", "LimitRanger", rbacChanged, Answer{Status: 201}, true, ""},
			{"admitted, CertificateApproval refused the apiserver's", "", rbacChanged, Answer{Status: 403, Refusal: approval}, false, "RBAC (which admission's authorizer checks read)"},
			{"admitted, Priority refused the apiserver's, only RBAC changed", "", rbacChanged, Answer{Status: 403, Refusal: priority}, false, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := &Run{Verb: "update", Resource: "certificatesigningrequests", Subresource: "approval", group: "certificates.k8s.io", arrival: arrival, changes: tc.changes}
				r.actual = func(context.Context) (Answer, bool) { return tc.answer, true }
				var why string
				if tc.refused {
					r.Status, r.PluginErrName = approval, tc.plugin
					why = r.refusedByStateLate(context.Background())
				} else {
					_, why = r.admittedEarly(context.Background())
				}
				if (tc.want == "") != (why == "") || !strings.Contains(why, tc.want) {
					t.Errorf("%q, want %q", why, tc.want)
				}
			})
		}
	})
	t.Run("admitted by the replay", func(t *testing.T) {
		for _, tc := range []struct {
			name    string
			changes *admissionChanges
			ns      string
			answer  Answer
			want    string
		}{
			{"Priority", changed, "ns", Answer{Status: 403, Refusal: priority}, "the apiserver's admission refused the write (403: pods \"p\" is forbidden: no PriorityClass"},
			{"a webhook", changed, "ns", Answer{Status: 400, Refusal: webhook}, "kproxy saw LimitRanges change"},
			{"an admission policy", changed, "ns", Answer{Status: 422, Refusal: policy}, "LimitRanges"},
			{"the authorizer", changed, "ns", Answer{Status: 403, Refusal: rbac}, ""},
			{"nothing changed", unchanged, "ns", Answer{Status: 403, Refusal: priority}, ""},
			{"another namespace changed", changed, "other", Answer{Status: 403, Refusal: priority}, ""},
			{"admitted by both", changed, "ns", Answer{Status: 201}, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := &Run{Verb: "create", Resource: "pods", arrival: arrival, namespace: tc.ns, changes: tc.changes}
				r.actual = func(context.Context) (Answer, bool) { return tc.answer, true }
				_, why := r.admittedEarly(context.Background())
				if (tc.want == "") != (why == "") || !strings.Contains(why, tc.want) {
					t.Errorf("admittedEarly = %q, want %q", why, tc.want)
				}
			})
		}
	})
}

// TestAdmissionPolicyLag: admission policies reach the apiserver's plugins
// and the replay's once a second, so a policy or binding changed in the
// 2s before a request arrived counts as changed around it; LimitRanges
// in the 30s before it (LimitRanger's live lookups); other state, only
// after it. A mutating plugin's change makes any contradiction of a
// write's verdict after admission unknown (validation of a label a
// MutatingAdmissionPolicy added), never an agreeing one.
func TestAdmissionPolicyLag(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	f := informers.NewSharedInformerFactory(fake.NewClientset(), 0)
	c := watchAdmissionState(clk, f, []string{"LimitRanger", "ValidatingAdmissionPolicy", "MutatingAdmissionPolicy", "MutatingAdmissionWebhook"}, nil)
	find := func(name string) *kindChanges { return kindNamed(t, c, name) }
	find("ValidatingAdmissionPolicyBindings").mark(&metav1.ObjectMeta{Name: "deny"})
	find("LimitRanges").mark(&corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: "small", Namespace: "ns"}})
	clk.Step(1500 * time.Millisecond)
	arrival := clk.Now() // 1.5s after both changes
	if got := c.changedSince(arrival, "ns"); got != "LimitRanges, ValidatingAdmissionPolicyBindings"+limitRangeLagNote+policyLagNote {
		t.Errorf("a binding 1.5s before the arrival, a LimitRange too: changedSince = %q, want both, each with its lag", got)
	}
	if got := c.changedSince(arrival.Add(time.Second), "ns"); got != "LimitRanges"+limitRangeLagNote {
		t.Errorf("2.5s after: changedSince = %q, want the LimitRange only (LimitRanger's 30s)", got)
	}
	if got := c.mutatorsChangedSince(arrival, "ns"); got != "" {
		t.Errorf("no mutating plugin's state changed: %q", got)
	}
	find("MutatingAdmissionPolicies").mark(&metav1.ObjectMeta{Name: "label"})
	clk.Step(time.Second)
	later := clk.Now()
	if got := c.mutatorsChangedSince(later, "ns"); !strings.HasPrefix(got, "MutatingAdmissionPolicies") {
		t.Errorf("a MutatingAdmissionPolicy a second before the arrival: mutatorsChangedSince = %q", got)
	}

	invalid := &metav1.Status{Code: 422, Reason: metav1.StatusReasonInvalid, Message: `ConfigMap "c1" is invalid: metadata.labels: Invalid value: "bad label!"`}
	for _, tc := range []struct {
		name     string
		replay   *metav1.Status // nil: admitted
		answer   Answer
		changes  *admissionChanges
		want     string
		admitted bool
	}{
		{"the replay's validation refuses what a new policy added; the apiserver admitted", invalid, Answer{Status: 201}, c, "the apiserver admitted the write, and the replay refuses it (422", false},
		{"refused by both alike", invalid, Answer{Status: 422, Refusal: invalid}, c, "", false},
		{"the apiserver refused for another reason", invalid, Answer{Status: 409, Refusal: &metav1.Status{Code: 409, Message: "conflict"}}, c, "refuses it otherwise (422", false},
		{"nothing mutating changed", invalid, Answer{Status: 201}, &admissionChanges{clock: clk}, "", false},
		{"the replay admits what the apiserver's validation refused", nil, Answer{Status: 422, Refusal: invalid}, c, "and the replay admits it after admission's mutations: kproxy saw MutatingAdmissionPolicies", true},
		{"admitted by both", nil, Answer{Status: 201}, c, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Run{Verb: "create", Resource: "configmaps", arrival: later, namespace: "ns", changes: tc.changes, Status: tc.replay}
			if tc.replay != nil {
				r.Code = int(tc.replay.Code)
			}
			r.actual = func(context.Context) (Answer, bool) { return tc.answer, true }
			var why string
			if tc.admitted {
				_, why = r.admittedEarly(context.Background())
			} else {
				why = r.mutatedLate(context.Background())
			}
			if (tc.want == "") != (why == "") || !strings.Contains(why, tc.want) {
				t.Errorf("got %q, want %q", why, tc.want)
			}
		})
	}
}

// kindNamed is c's clock of the kind named so.
func kindNamed(t *testing.T, c *admissionChanges, name string) *kindChanges {
	t.Helper()
	for _, k := range c.kinds {
		if k.name == name {
			return k
		}
	}
	t.Fatalf("%s not watched", name)
	return nil
}
