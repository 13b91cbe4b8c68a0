package apiserver

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// Admission plugins read the cluster's state from informers, in the
// apiserver as in the replay, and the replay reads it after the request:
// a replay behind a queue meets the state as it is since. kubectl apply
// -f on a directory sends its files in name order, so pod.yaml reaches
// the apiserver before limitrange.yaml and priorityclass.yaml, and a
// namespace's labels (Pod Security) or a webhook's configuration change
// between two requests of one script. A write refused (or admitted) for
// state created right after it is then admitted (or refused) by the
// replay: a confident prediction the request never met.
//
// So kproxy keeps, per kind of state the enabled plugins read, when it
// last saw an object of it change (per namespace for namespaced kinds,
// namespaces by their own name). When the replay's admission verdict
// contradicts the apiserver's answer and such state changed after the
// request arrived, the verdict says nothing about the request: it is
// unknown, naming what changed. The handlers ride on the informers the
// plugins already registered: no list or watch is added. A quota's usage
// changes with every write it counts, so in a namespace with quotas the
// clock is rarely still: it only ever turns a contradiction into unknown.
// A quota exceeded by the request's own write has its own check
// (own_write.go), which needs no clock.

// admissionChanges are the change clocks of the state the enabled
// admission plugins read (nil: none).
type admissionChanges struct {
	clock clock.PassiveClock
	kinds []*kindChanges
	// authz names the authorizers' state (RBAC) kproxy saw change after
	// a time, or "" (nil: not known). Admission policies ask the
	// authorizer in CEL (authorizer.group('').resource('secrets').check),
	// the apiserver's on the request's way, the replay's after it: a
	// user deleting the RoleBinding a policy checks, by that very
	// request, is refused by the replay's policy alone.
	authz func(time.Time) string
}

// kindChanges is when kproxy last saw an object of one kind change: for
// a cluster-scoped kind, anywhere (any namespace's request may read it);
// for a namespaced one, per namespace.
type kindChanges struct {
	name string // as the unknown names it: "LimitRanges"
	// lag: the plugins load this kind's objects once in a while, not as
	// they come (admission policies, policyLag): a change up to lag before
	// the request arrived may have reached the apiserver's plugin after
	// it, or the replay's before it.
	lag time.Duration
	// lagNote says why, after the kind's names in an unknown's reason.
	lagNote string
	// mutating: the plugins reading it mutate the object, so a change
	// moves any later stage's verdict (validation, above all).
	mutating bool
	// readBy: the enabled plugins that read it.
	readBy  []string
	key     func(metav1.Object) string
	last    atomic.Int64 // cluster-scoped
	mu      sync.Mutex
	inNS    map[string]int64 // namespaced
	sweepAt int              // len(inNS) that prunes it
	clock   clock.PassiveClock
}

// changeHorizon is how long a namespace's last change is kept: longer
// than any replay runs after its request arrived. Older ones are pruned,
// so a cluster that makes and deletes namespaces all day does not grow
// the map without end.
const changeHorizon = time.Hour

func (k *kindChanges) mark(obj any) { k.markBefore(obj, 0) }

// markInitial marks the informer's first list: a change at kproxy's start,
// before any request; for a lagging kind, before any request's lag too
// (the replay's plugins have loaded it before kproxy serves).
func (k *kindChanges) markInitial(obj any) { k.markBefore(obj, k.lag) }

// markBefore marks obj changed, back then.
func (k *kindChanges) markBefore(obj any, back time.Duration) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	now := k.clock.Now().Add(-back).UnixNano()
	if k.key == nil {
		k.last.Store(now)
		return
	}
	m, ok := obj.(metav1.Object)
	if !ok {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.inNS[k.key(m)] = now
	if len(k.inNS) > k.sweepAt {
		for ns, t := range k.inNS {
			if t < now-int64(changeHorizon) {
				delete(k.inNS, ns)
			}
		}
		k.sweepAt = max(1024, 2*len(k.inNS))
	}
}

func (k *kindChanges) changedSince(t time.Time, namespace string) bool {
	t = t.Add(-k.lag)
	if k.key == nil {
		return k.last.Load() > t.UnixNano()
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.inNS[namespace] > t.UnixNano()
}

// watchAdmissionState starts the change clocks of the state the enabled
// plugins read from f.
func watchAdmissionState(clk clock.PassiveClock, f informers.SharedInformerFactory, plugins []string, authz func(time.Time) string) *admissionChanges {
	byNamespace := func(m metav1.Object) string { return m.GetNamespace() }
	byName := func(m metav1.Object) string { return m.GetName() }
	type source struct {
		name     string
		key      func(metav1.Object) string
		informer func() cache.SharedIndexInformer
		readBy   []string
		lag      time.Duration
		mutating bool
	}
	// LimitRanger keeps what it looked up live (when its informer holds
	// no LimitRange for the namespace) for 30 s, in the apiserver as in
	// the replay, each by its own requests: a LimitRange deleted, or
	// created, up to 30 s before a request may still be the one either
	// enforces (found by a probe: a LimitRange deleted a second before,
	// its cpu maximum still enforced by the apiserver, 403, predicted
	// 201).
	limitRanges := source{"LimitRanges", byNamespace, func() cache.SharedIndexInformer { return f.Core().V1().LimitRanges().Informer() }, []string{"LimitRanger"}, limitRangeLag, false}
	adm := f.Admissionregistration().V1()
	sources := []source{
		{"the namespace (its labels, its phase)", byName, func() cache.SharedIndexInformer { return f.Core().V1().Namespaces().Informer() },
			[]string{"NamespaceLifecycle", "PodSecurity", "MutatingAdmissionWebhook", "ValidatingAdmissionWebhook", "ValidatingAdmissionPolicy"}, 0, false},
		{"ServiceAccounts", byNamespace, func() cache.SharedIndexInformer { return f.Core().V1().ServiceAccounts().Informer() }, []string{"ServiceAccount"}, 0, false},
		limitRanges,
		{"ResourceQuotas", byNamespace, func() cache.SharedIndexInformer { return f.Core().V1().ResourceQuotas().Informer() }, []string{"ResourceQuota"}, 0, false},
		{"PriorityClasses", nil, func() cache.SharedIndexInformer { return f.Scheduling().V1().PriorityClasses().Informer() }, []string{"Priority"}, 0, false},
		{"RuntimeClasses", nil, func() cache.SharedIndexInformer { return f.Node().V1().RuntimeClasses().Informer() }, []string{"RuntimeClass"}, 0, false},
		// NodeRestriction checks a mirror pod's owner against its Node's
		// uid, as its informer holds the Node: a Node deleted and created
		// again (a new uid) right after the request is another Node.
		{"Nodes", nil, func() cache.SharedIndexInformer { return f.Core().V1().Nodes().Informer() }, []string{"NodeRestriction"}, 0, false},
		// It also reads the pod a node deletes, evicts or asks a token
		// for: a kubelet's final delete of its pod, replayed once its
		// informer saw the pod go, finds no pod (404 for a 200).
		{"Pods", byNamespace, func() cache.SharedIndexInformer { return f.Core().V1().Pods().Informer() }, []string{"NodeRestriction"}, 0, false},
		{"MutatingWebhookConfigurations", nil, func() cache.SharedIndexInformer { return adm.MutatingWebhookConfigurations().Informer() }, []string{"MutatingAdmissionWebhook"}, 0, true},
		{"ValidatingWebhookConfigurations", nil, func() cache.SharedIndexInformer { return adm.ValidatingWebhookConfigurations().Informer() }, []string{"ValidatingAdmissionWebhook"}, 0, false},
		{"ValidatingAdmissionPolicies", nil, func() cache.SharedIndexInformer { return adm.ValidatingAdmissionPolicies().Informer() }, []string{"ValidatingAdmissionPolicy"}, policyLag, false},
		{"ValidatingAdmissionPolicyBindings", nil, func() cache.SharedIndexInformer { return adm.ValidatingAdmissionPolicyBindings().Informer() }, []string{"ValidatingAdmissionPolicy"}, policyLag, false},
		{"MutatingAdmissionPolicies", nil, func() cache.SharedIndexInformer { return adm.MutatingAdmissionPolicies().Informer() }, []string{"MutatingAdmissionPolicy"}, policyLag, true},
		{"MutatingAdmissionPolicyBindings", nil, func() cache.SharedIndexInformer { return adm.MutatingAdmissionPolicyBindings().Informer() }, []string{"MutatingAdmissionPolicy"}, policyLag, true},
	}
	c := &admissionChanges{clock: clk, authz: authz}
	for _, s := range sources {
		if !slices.ContainsFunc(s.readBy, func(p string) bool { return slices.Contains(plugins, p) }) {
			continue // no enabled plugin reads it: no informer to ride on
		}
		readBy := slices.DeleteFunc(slices.Clone(s.readBy), func(p string) bool { return !slices.Contains(plugins, p) })
		k := &kindChanges{name: s.name, key: s.key, lag: s.lag, lagNote: lagNoteOf(s.lag), mutating: s.mutating, readBy: readBy, inNS: map[string]int64{}, clock: clk}
		_, _ = s.informer().AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
			AddFunc: func(obj any, initial bool) {
				if initial {
					k.markInitial(obj)
				} else {
					k.mark(obj)
				}
			},
			UpdateFunc: func(_, obj any) { k.mark(obj) },
			DeleteFunc: k.mark,
		})
		c.kinds = append(c.kinds, k)
	}
	return c
}

// policyLag is how long before a request a change of admission policies
// may still not have reached the apiserver's plugins, or already reached
// the replay's: both load policies once a second (the policy source's
// refresh interval), with a second more for their informers.
const policyLag = 2 * time.Second

// policyLagNote follows the names of lagging kinds in an unknown's reason.
const policyLagNote = " (or in the 2s before it arrived: the apiserver and the replay each load admission policies once a second)"

// limitRangeLag is LimitRanger's live-lookup cache's time to live
// (liveTTL); limitRangeLagNote says so.
const (
	limitRangeLag     = 30 * time.Second
	limitRangeLagNote = " (or in the 30s before it arrived: LimitRanger keeps the LimitRanges it looked up live, for a namespace its informer held none for, 30s, the apiserver's and the replay's each their own)"
)

func lagNoteOf(lag time.Duration) string {
	switch lag {
	case 0:
		return ""
	case limitRangeLag:
		return limitRangeLagNote
	}
	return policyLagNote
}

// changedSince names the state seen to change after t that a request in
// namespace may have read, or "".
func (c *admissionChanges) changedSince(t time.Time, namespace string) string {
	return c.changed(t, namespace, false)
}

// mutatorsChangedSince names the state of mutating plugins seen to change
// after t that a request in namespace may have read, or "".
func (c *admissionChanges) mutatorsChangedSince(t time.Time, namespace string) string {
	return c.changed(t, namespace, true)
}

// refusalChangedSince names the state seen to change after t that may
// have moved plugin's refusal of a request for resource (group, plural) in
// namespace, or "": the state plugin reads, and the state a plugin reads
// that mutates such an object before it (a mutating webhook's or policy's
// configuration or namespace selector, any object; a LimitRange's
// defaults, a ServiceAccount's token volume, a PriorityClass's value, a
// RuntimeClass's overhead, a pod). A LimitRange's change says nothing of
// a ConfigMap a ValidatingAdmissionPolicy refused, and the request's own
// LimitRange, seen created after it arrived, is no reason for the
// apiserver to have admitted it.
func (c *admissionChanges) refusalChangedSince(t time.Time, namespace, plugin, group, resource string) string {
	changed := c.changedIf(t, namespace, func(k *kindChanges) bool {
		return slices.ContainsFunc(k.readBy, func(p string) bool {
			return p == plugin || mutates(p, group, resource)
		})
	})
	if asksAuthorizer(plugin) {
		changed = c.withAuthz(changed, t)
	}
	return changed
}

// asksAuthorizer reports the admission plugins that ask the authorizer
// (RBAC) about the request's user: the admission policies' CEL, the
// certificates plugins (approve, sign, attest on a signer), NodeRestriction
// (a token's audience, a pod certificate's signer) and
// OwnerReferencesPermissionEnforcement (delete, or update finalizers of,
// an owner). RBAC changed after the request moves their verdicts as it
// moves the authorization stage's (a probe: a CSR approval the apiserver
// allowed, refused by the replay's CertificateApproval after the
// approver's RoleBinding was deleted).
func asksAuthorizer(p string) bool {
	switch p {
	case "ValidatingAdmissionPolicy", "MutatingAdmissionPolicy", "CertificateApproval", "CertificateSigning",
		"ClusterTrustBundleAttest", "NodeRestriction", "OwnerReferencesPermissionEnforcement":
		return true
	}
	return false
}

// authorizerRefusals are what the refusals of the plugins that ask the
// authorizer (asksAuthorizer, the policies aside) say.
var authorizerRefusals = []string{
	"user not permitted to approve requests with signerName ",
	"user not permitted to sign requests with signerName ",
	"user not permitted to attest for signerName ",
	" is not authorized to request tokens for audience ",
	"cannot set an ownerRef on a resource you can't delete",
	"cannot set blockOwnerDeletion if an ownerReference refers to a resource you can't set finalizers on",
}

// authorizerRefusal reports an admission refusal that an authorizer's
// answer decided: an admission policy's, or that of a plugin that asks
// the authorizer.
func authorizerRefusal(st *metav1.Status) bool {
	return policyRefusal(st) || st != nil && slices.ContainsFunc(authorizerRefusals, func(m string) bool { return strings.Contains(st.Message, m) })
}

// policyRefusal reports an admission policy's refusal.
func policyRefusal(st *metav1.Status) bool {
	return st != nil && (strings.Contains(st.Message, "ValidatingAdmissionPolicy '") || strings.Contains(st.Message, "MutatingAdmissionPolicy '"))
}

// withAuthz adds to changed (the admission state seen changed after t)
// the authorizers' state, if kproxy saw it change after t.
func (c *admissionChanges) withAuthz(changed string, t time.Time) string {
	if c == nil || c.authz == nil || t.IsZero() {
		return changed
	}
	authz := c.authz(t)
	switch {
	case authz == "":
		return changed
	case changed == "":
		return authz + " (which admission's authorizer checks read)"
	}
	return authz + " (which admission's authorizer checks read), " + changed
}

// mutates reports whether the admission plugin p mutates objects of the
// resource (group, plural).
func mutates(p, group, resource string) bool {
	switch p {
	case "MutatingAdmissionWebhook", "MutatingAdmissionPolicy":
		return true
	case "ServiceAccount", "LimitRanger", "Priority", "RuntimeClass":
		return group == "" && resource == "pods"
	}
	return false
}

func (c *admissionChanges) changed(t time.Time, namespace string, mutating bool) string {
	return c.changedIf(t, namespace, func(k *kindChanges) bool { return !mutating || k.mutating })
}

func (c *admissionChanges) changedIf(t time.Time, namespace string, read func(*kindChanges) bool) string {
	if c == nil || t.IsZero() {
		return ""
	}
	var what, notes []string
	for _, k := range c.kinds {
		if read(k) && k.changedSince(t, namespace) {
			what = append(what, k.name)
			if k.lagNote != "" && !slices.Contains(notes, k.lagNote) {
				notes = append(notes, k.lagNote)
			}
		}
	}
	return strings.Join(what, ", ") + strings.Join(notes, "")
}

// refusedByStateLate says why the replay's admission refusal of a write
// the apiserver admitted (2xx), or refused for another reason, read after
// admission state changed, is not the request's, or "".
func (r *Run) refusedByStateLate(ctx context.Context) string {
	if r.PluginErrName == "" {
		return ""
	}
	changed, aw, ok := r.refusalChanged(ctx, func(t time.Time, namespace string) string {
		return r.changes.refusalChangedSince(t, namespace, r.PluginErrName, r.group, r.Resource)
	})
	switch {
	case !ok:
	case aw.Status >= 200 && aw.Status < 300:
		return fmt.Sprintf("the apiserver admitted the write, and the replay's %s refuses it: kproxy saw %s change after this request arrived, "+
			"before the replay read it, so the state on arrival is not known", r.PluginErrName, changed)
	case aw.Refusal != nil && admissionRefusal(aw.Status, aw.Refusal) && aw.Refusal.Message != r.Status.Message &&
		(!quotaExceeded(aw.Refusal) || !quotaExceeded(r.Status)):
		// Refused by both, for other reasons: the status agrees, the
		// explanation would not. (A quota exceeded for both is one
		// reason, whatever usage each read.)
		return fmt.Sprintf("the apiserver's admission refused the write (%d: %s), and the replay's %s refuses it for another reason: kproxy saw %s change after this request arrived, "+
			"before the replay read it, so the state on arrival is not known", aw.Status, aw.Refusal.Message, r.PluginErrName, changed)
	}
	return ""
}

// refusalChanged is, for the replay's refusal of a write, what of the
// state since names changed around the request's arrival, and the
// apiserver's answer; ok is false when nothing changed or there is no
// answer to wait for.
func (r *Run) refusalChanged(ctx context.Context, since func(time.Time, string) string) (string, Answer, bool) {
	// A connect (exec, attach, port-forward, proxy) is answered with its
	// stream: its answer is not waited for.
	if r.Read || r.actual == nil || r.Status == nil || connectSubresource(r.Subresource) {
		return "", Answer{}, false
	}
	changed := since(r.arrival, r.namespace)
	if changed == "" {
		return "", Answer{}, false
	}
	aw, ok := r.actual(ctx)
	return changed, aw, ok
}

// admittedByStateLate says why the replay's admission of a write the
// apiserver's admission refused, read after admission state changed, is
// not the request's, or "".
func (r *Run) admittedByStateLate(aw Answer) string {
	if aw.Refusal == nil || !admissionRefusal(aw.Status, aw.Refusal) {
		return ""
	}
	changed := r.changes.changedSince(r.arrival, r.namespace)
	if authorizerRefusal(aw.Refusal) {
		changed = r.changes.withAuthz(changed, r.arrival)
	}
	if changed == "" {
		return ""
	}
	return fmt.Sprintf("the apiserver's admission refused the write (%d: %s), and the replay's admits it: kproxy saw %s change after this request arrived, "+
		"before the replay read it, so the state on arrival is not known", aw.Status, aw.Refusal.Message, changed)
}

// mutatedLate says why the replay's refusal of a write, after admission's
// mutations, is not the request's, or "": the apiserver answered
// otherwise (admitted it, or refused it with another message), and kproxy
// saw the state of a mutating plugin (a webhook configuration, a
// MutatingAdmissionPolicy or its binding) change around the request's
// arrival. A mutation the request did not meet (or met, and the replay
// not) moves every later stage: a label the policy adds fails
// validation, a default it sets passes it.
func (r *Run) mutatedLate(ctx context.Context) string {
	changed, aw, ok := r.refusalChanged(ctx, r.changes.mutatorsChangedSince)
	switch {
	case !ok || momentary(aw.Status) || momentary(r.Code):
		return ""
	case aw.Status >= 200 && aw.Status < 300:
		return fmt.Sprintf("the apiserver admitted the write, and the replay refuses it (%d: %s) after admission's mutations: %s",
			r.Code, r.Status.Message, mutatorsWhy(changed))
	case aw.Refusal != nil && (aw.Status != r.Code || aw.Refusal.Message != r.Status.Message):
		return fmt.Sprintf("the apiserver refused the write (%d: %s), and the replay refuses it otherwise (%d: %s) after admission's mutations: %s",
			aw.Status, aw.Refusal.Message, r.Code, r.Status.Message, mutatorsWhy(changed))
	}
	return ""
}

// mutatedEarly says why the replay's admission of a write the apiserver
// refused (aw), after admission's mutations, is not the request's, or "";
// as mutatedLate.
func (r *Run) mutatedEarly(aw Answer) string {
	if aw.Refusal == nil || momentary(aw.Status) {
		return ""
	}
	changed := r.changes.mutatorsChangedSince(r.arrival, r.namespace)
	if changed == "" {
		return ""
	}
	return fmt.Sprintf("the apiserver refused the write (%d: %s), and the replay admits it after admission's mutations: %s",
		aw.Status, aw.Refusal.Message, mutatorsWhy(changed))
}

// momentary reports an answer of the moment (a 429: flow control, a
// disruption budget; a 5xx): no mutation leads to it, and the stages say
// why it was given then.
func momentary(status int) bool {
	return status == http.StatusTooManyRequests || status >= 500
}

func mutatorsWhy(changed string) string {
	return "kproxy saw " + changed + " change after this request arrived, before the replay read it, " +
		"so which mutations the request met, and what the stages after them saw, is not known"
}

// admissionRefusal reports an admission plugin's refusal: a 403 `...
// is forbidden: ...` that is not the authorizer's (`User "..." cannot`),
// or a webhook's or an admission policy's denial.
func admissionRefusal(status int, st *metav1.Status) bool {
	switch {
	case strings.Contains(st.Message, "admission webhook ") && strings.Contains(st.Message, " denied the request"):
		return true
	case strings.Contains(st.Message, "ValidatingAdmissionPolicy '"):
		return true
	case status != http.StatusForbidden || !strings.Contains(st.Message, " is forbidden: "):
		return false
	}
	return !strings.Contains(st.Message, `forbidden: User "`)
}
