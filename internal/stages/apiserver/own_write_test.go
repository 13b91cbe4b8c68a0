package apiserver

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	api "k8s.io/kubernetes/pkg/apis/core"

	"github.com/kproxy/kproxy/internal/record"
)

// history is an objectSource over a pod's stored versions: at a revision
// the store holds the newest version written at or before it.
type history struct {
	versions []*api.Pod // by resourceVersion, ascending; a nil Pod's UID-less entry marks a delete
	reads    int
}

func (h *history) at(_ context.Context, rv string, out runtime.Object) (bool, error) {
	h.reads++
	n, _ := strconv.ParseInt(rv, 10, 64)
	var cur *api.Pod
	for _, v := range h.versions {
		m, _ := strconv.ParseInt(v.ResourceVersion, 10, 64)
		if m > n {
			break
		}
		cur = v
		if v.UID == "" {
			cur = nil // deleted
		}
	}
	if cur == nil {
		return false, nil
	}
	*out.(*api.Pod) = *cur.DeepCopy()
	return true, nil
}
func (h *history) latest(context.Context, runtime.Object) (bool, string, error) { panic("unused") }
func (h *history) lastExisting(context.Context, runtime.Object) (string, error) { panic("unused") }

func podAt(rv int, uid, node string, deleting bool) *api.Pod {
	p := &api.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", ResourceVersion: strconv.Itoa(rv), UID: types.UID(uid)}, Spec: api.PodSpec{NodeName: node}}
	if deleting {
		now := metav1.Now()
		p.DeletionTimestamp = &now
	}
	return p
}

// TestReadBeforeOwnWrite: the pod as it was just before a binding or an
// eviction the apiserver answered without a resourceVersion, found in
// its history, however far behind the replay runs.
func TestReadBeforeOwnWrite(t *testing.T) {
	binding := ownWriteOf(&Run{Verb: "create", Resource: "pods", Subresource: "binding"})
	eviction := ownWriteOf(&Run{Verb: "create", Resource: "pods", Subresource: "eviction"})
	arrival := time.Date(2026, 12, 4, 16, 0, 0, 0, time.UTC)
	evictedAt := func(rv int, uid string, at time.Time) *api.Pod {
		p := podAt(rv, uid, "node-1", false)
		p.Status.Conditions = []api.PodCondition{{Type: api.DisruptionTarget, Status: api.ConditionTrue, Reason: "EvictionByEvictionAPI",
			LastTransitionTime: metav1.NewTime(at)}}
		return p
	}
	evicted := func(rv int, uid string) *api.Pod { return evictedAt(rv, uid, arrival) }
	// deletedAt: a pod deleted (30 s of grace) at the time given.
	deletedAt := func(rv int, uid string, at time.Time) *api.Pod {
		p := podAt(rv, uid, "node-1", false)
		ts, grace := metav1.NewTime(at.Add(30*time.Second)), int64(30)
		p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &ts, &grace
		return p
	}
	many := []*api.Pod{podAt(100, "u1", "", false)}
	for rv := 101; rv < 4000; rv += 7 { // a pod written often after its binding
		many = append(many, podAt(rv, "u1", "node-1", false))
	}
	for _, tc := range []struct {
		name     string
		w        *ownWrite
		versions []*api.Pod
		hi       int // the newest version showing the write
		at       string
		why      string
		earlier  bool // read as the newest: the write was an earlier request's
	}{
		{"binding, the newest write", binding, []*api.Pod{podAt(10, "u1", "", false), podAt(11, "u1", "node-1", false)}, 11, "10", "", false},
		{"binding, revisions of other objects between", binding, []*api.Pod{podAt(10, "u1", "", false), podAt(17, "u1", "node-1", false)}, 17, "16", "", false},
		{"binding, written often since", binding, many, 3998, "100", "", false},
		{"binding of a pod whose name an older pod had", binding,
			[]*api.Pod{podAt(5, "u0", "node-2", false), {ObjectMeta: metav1.ObjectMeta{ResourceVersion: "6"}}, podAt(8, "u1", "", false), podAt(9, "u1", "node-1", false)}, 9, "8", "", false},
		{"eviction: marked, then deleting", eviction,
			[]*api.Pod{podAt(20, "u1", "node-1", false), evicted(30, "u1"), podAt(31, "u1", "node-1", true)}, 31, "29", "", false},
		// A second eviction of a pod being deleted: the apiserver skips
		// its budget and writes nothing.
		{"eviction of a pod marked a minute before the request", eviction,
			[]*api.Pod{podAt(20, "u1", "node-1", false), evictedAt(30, "u1", arrival.Add(-time.Minute)), deletedAt(31, "u1", arrival.Add(-time.Minute))}, 31, "31", "", true},
		{"eviction of a pod deleted a minute before the request", eviction,
			[]*api.Pod{podAt(20, "u1", "node-1", false), deletedAt(30, "u1", arrival.Add(-time.Minute))}, 30, "30", "", true},
		{"eviction of a pod marked a second before the request: not known as earlier", eviction,
			[]*api.Pod{podAt(20, "u1", "node-1", false), evictedAt(30, "u1", arrival.Add(-time.Second)), deletedAt(31, "u1", arrival.Add(-time.Second))}, 31, "29", "", false},
		{"the pod as stored does not show the write", binding, []*api.Pod{podAt(10, "u1", "", false)}, 10, "", "does not show it", false},
		{"created showing the write", binding, []*api.Pod{podAt(10, "u1", "node-1", false), podAt(12, "u1", "node-1", false)}, 12, "", "created already showing", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &history{versions: tc.versions}
			out := &api.Pod{}
			if _, err := h.at(context.Background(), strconv.Itoa(tc.hi), out); err != nil {
				t.Fatal(err)
			}
			got, err := readBeforeOwnWrite(context.Background(), h, tc.w, strconv.Itoa(tc.hi), arrival, nil, out)
			switch {
			case tc.why != "":
				if err == nil || !strings.Contains(err.Error(), tc.why) {
					t.Fatalf("err = %v, want it to say %q", err, tc.why)
				}
			case err != nil:
				t.Fatal(err)
			case got.at != tc.at || got.earlier != tc.earlier:
				t.Errorf("read at %s (earlier %v), want %s (earlier %v)", got.at, got.earlier, tc.at, tc.earlier)
			case tc.w.done(out) != tc.earlier:
				t.Errorf("out shows the write: %v, want %v: %+v", tc.w.done(out), tc.earlier, out)
			}
			if h.reads > 30 {
				t.Errorf("%d reads", h.reads)
			}
		})
	}
}

// TestRefusedLate: a refusal of the replay that the apiserver's answer
// shows came from state changed after the request is unknown: a namespace
// gone for the replay that the apiserver found, a budget or a namespace's
// termination met only by the replay. Otherwise the refusal stands.
func TestRefusedLate(t *testing.T) {
	nsGone := &metav1.Status{Code: 404, Reason: metav1.StatusReasonNotFound, Message: `namespaces "kcm-1" not found`}
	terminating := &metav1.Status{Code: 403, Message: `configmaps "x" is forbidden: unable to create new content in namespace kcm-1 because it is being terminated`}
	quota := &metav1.Status{Code: 403, Message: `configmaps "cm-1" is forbidden: exceeded quota: two, requested: count/configmaps=1, used: count/configmaps=2, limited: count/configmaps=2`}
	budget := &metav1.Status{Code: 429, Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: "DisruptionBudget"}}}}
	twoBudgets := &metav1.Status{Code: 500, Message: "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."}
	saGone := &metav1.Status{Code: 403, Reason: metav1.StatusReasonForbidden,
		Message: `pods "last" is forbidden: error looking up service account sa-late/leaving: serviceaccount "leaving" not found`}
	for _, tc := range []struct {
		name     string
		run      *Run
		answered int
		want     string // contains; "" keeps the refusal
	}{
		{"namespace gone, the apiserver refused 403 (terminating)", &Run{Verb: "create", Resource: "configmaps", Status: nsGone, PluginErrName: "NamespaceLifecycle"}, 403, "the apiserver answered 403, so its NamespaceLifecycle found the namespace"},
		{"namespace gone, the apiserver admitted it", &Run{Verb: "create", Resource: "events", Status: nsGone, PluginErrName: "NamespaceLifecycle"}, 201, "deleted after this request"},
		{"namespace gone, a dry run the apiserver admitted", &Run{Verb: "create", Resource: "configmaps", DryRun: true, Status: nsGone, PluginErrName: "NamespaceLifecycle"}, 201, "deleted after this request"},
		{"namespace gone for both", &Run{Verb: "create", Resource: "configmaps", Status: nsGone, PluginErrName: "NamespaceLifecycle"}, 404, ""},
		{"terminating for the replay, admitted by the apiserver", &Run{Verb: "create", Resource: "configmaps", Status: terminating, PluginErrName: "NamespaceLifecycle"}, 201, "began terminating after this request"},
		{"terminating for both", &Run{Verb: "create", Resource: "configmaps", Status: terminating, PluginErrName: "NamespaceLifecycle"}, 403, ""},
		{"budget used by the request itself", &Run{Verb: "create", Resource: "pods", Subresource: "eviction", Status: budget}, 201, "the budget as the request met it was not read"},
		{"budget refused for both", &Run{Verb: "create", Resource: "pods", Subresource: "eviction", Status: budget}, 429, ""},
		{"budget, the pod read before a mark made within seconds of the arrival", &Run{Verb: "create", Resource: "pods", Subresource: "eviction", Status: budget,
			arrival: time.Unix(1000, 0), Reads: []StorageRead{{OwnWrite: "marked the pod for eviction", MarkedAt: time.Unix(999, 0)}}}, 201, "or by an earlier eviction or delete, which left the pod being deleted"},
		{"budget, the pod read before a mark made after the arrival", &Run{Verb: "create", Resource: "pods", Subresource: "eviction", Status: budget,
			arrival: time.Unix(1000, 0), Reads: []StorageRead{{OwnWrite: "marked the pod for eviction", MarkedAt: time.Unix(1002, 0)}}}, 201, "the budget as the request met it was not read"},
		{"two budgets, the pod read before a mark made within seconds of the arrival", &Run{Verb: "create", Resource: "pods", Subresource: "eviction", Status: twoBudgets,
			arrival: time.Unix(1000, 0), Reads: []StorageRead{{OwnWrite: "marked the pod for eviction", MarkedAt: time.Unix(1000, 0)}}}, 201, "the replay refuses it for the pod's two disruption budgets"},
		{"two budgets, refused by both", &Run{Verb: "create", Resource: "pods", Subresource: "eviction", Status: twoBudgets,
			arrival: time.Unix(1000, 0), Reads: []StorageRead{{OwnWrite: "marked the pod for eviction", MarkedAt: time.Unix(1000, 0)}}}, 500, ""},
		{"two budgets, no mark", &Run{Verb: "create", Resource: "pods", Subresource: "eviction", Status: twoBudgets}, 201, ""},
		{"a 404 from another plugin", &Run{Verb: "create", Resource: "configmaps", Status: nsGone, PluginErrName: "SomethingElse"}, 403, ""},
		{"over quota for the replay, admitted by the apiserver", &Run{Verb: "create", Resource: "configmaps", Status: quota, PluginErrName: "ResourceQuota"}, 201, "already counts this request"},
		{"over quota for both", &Run{Verb: "create", Resource: "configmaps", Status: quota, PluginErrName: "ResourceQuota"}, 403, ""},
		{"over quota for a dry run the apiserver admitted", &Run{Verb: "create", Resource: "configmaps", DryRun: true, Status: quota, PluginErrName: "ResourceQuota"}, 201, ""},
		{"no ServiceAccount for the replay, admitted by the apiserver", &Run{Verb: "create", Resource: "pods", Status: saGone, PluginErrName: "ServiceAccount"}, 201, "the ServiceAccount was deleted after this request"},
		{"no ServiceAccount for the replay, a dry run the apiserver admitted", &Run{Verb: "create", Resource: "pods", DryRun: true, Status: saGone, PluginErrName: "ServiceAccount"}, 201, "deleted after this request"},
		{"no ServiceAccount for both", &Run{Verb: "create", Resource: "pods", Status: saGone, PluginErrName: "ServiceAccount"}, 403, ""},
		{"an address held for the replay, allocated by the apiserver", &Run{Verb: "create", Resource: "services", Status: &metav1.Status{Code: 422,
			Message: `Service "b" is invalid: spec.clusterIPs: Invalid value: ["10.96.202.23"]: failed to allocate IP 10.96.202.23: provided IP is already allocated`}}, 201, "its holder released it"},
		{"a node port held for both", &Run{Verb: "update", Resource: "services", Status: &metav1.Status{Code: 422,
			Message: `Service "b" is invalid: spec.ports[0].nodePort: Invalid value: 30512: provided port is already allocated`}}, 422, ""},
		{"another ServiceAccount refusal, admitted by the apiserver", &Run{Verb: "create", Resource: "pods", PluginErrName: "ServiceAccount",
			Status: &metav1.Status{Code: 403, Message: `pods "p" is forbidden: no service account specified for pod ns/p`}}, 201, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.run
			r.actual = func(context.Context) (Answer, bool) { return Answer{Status: tc.answered}, true }
			why := r.refusedLate(context.Background())
			if (tc.want == "") != (why == "") || !strings.Contains(why, tc.want) {
				t.Errorf("refusedLate = %q, want %q", why, tc.want)
			}
		})
	}
}

// TestQuotaCountedThenRefused: the apiserver's ResourceQuota counts a
// write it admits before its storage refuses it (409 AlreadyExists) and
// does not give the count back; the replay's quota refusal, over a usage
// that counts the request, is then unknown. Any other refusal keeps it.
func TestQuotaCountedThenRefused(t *testing.T) {
	quota := &metav1.Status{Code: 403, Message: `jobs.batch "manual-1" is forbidden: exceeded quota: q, requested: count/jobs.batch=1, used: count/jobs.batch=3, limited: count/jobs.batch=3`}
	exists := &metav1.Status{Code: 409, Reason: metav1.StatusReasonAlreadyExists, Message: `jobs.batch "manual-1" already exists`}
	conflict := &metav1.Status{Code: 409, Reason: metav1.StatusReasonConflict, Message: `Operation cannot be fulfilled on pods "p": the object has been modified`}
	webhook := &metav1.Status{Code: 403, Reason: metav1.StatusReasonForbidden, Message: `admission webhook "w.example.com" denied the request: no`}
	for _, tc := range []struct {
		name   string
		dryRun bool
		answer Answer
		want   string // contains; "" keeps the refusal
	}{
		{"a create of an object that exists", false, Answer{Status: 409, Refusal: exists}, `its storage then refused it (409: jobs.batch "manual-1" already exists)`},
		{"an update that conflicted", false, Answer{Status: 409, Refusal: conflict}, "counting this very request"},
		{"a 409 without a Status", false, Answer{Status: 409}, ""},
		{"refused before the quota", false, Answer{Status: 403, Refusal: webhook}, ""},
		{"a dry run", true, Answer{Status: 409, Refusal: exists}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Run{Verb: "create", Resource: "jobs", DryRun: tc.dryRun, Status: quota, PluginErrName: "ResourceQuota",
				actual: func(context.Context) (Answer, bool) { return tc.answer, true }}
			why := r.refusedLate(context.Background())
			if (tc.want == "") != (why == "") || !strings.Contains(why, tc.want) {
				t.Errorf("refusedLate = %q, want %q", why, tc.want)
			}
		})
	}
}

// TestAdmittedEarly: a write the replay admits that the apiserver refused
// for state the replay reads from an informer after the request (a
// namespace being terminated, a quota's usage) is unknown. Any other
// refusal keeps the admission, a disagreement the record shows.
func TestAdmittedEarly(t *testing.T) {
	terminating := &metav1.Status{Code: 403, Reason: metav1.StatusReasonForbidden,
		Message: `events "web.1" is forbidden: unable to create new content in namespace kcm-1 because it is being terminated`,
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: corev1.NamespaceTerminatingCause}}}}
	causeOnly := &metav1.Status{Code: 403, Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: corev1.NamespaceTerminatingCause}}}}
	quota := &metav1.Status{Code: 403, Reason: metav1.StatusReasonForbidden,
		Message: `configmaps "cm-2" is forbidden: exceeded quota: two, requested: count/configmaps=1, used: count/configmaps=2, limited: count/configmaps=2`}
	rbac := &metav1.Status{Code: 403, Reason: metav1.StatusReasonForbidden, Message: `configmaps is forbidden: User "bob" cannot create resource "configmaps"`}
	noSA := &metav1.Status{Code: 403, Reason: metav1.StatusReasonForbidden,
		Message: `pods "early" is forbidden: error looking up service account sa-late/arriving: serviceaccount "arriving" not found`}
	nsMissing := &metav1.Status{Code: 404, Reason: metav1.StatusReasonNotFound, Message: `namespaces "later" not found`,
		Details: &metav1.StatusDetails{Name: "later", Kind: "namespaces"}}
	objMissing := &metav1.Status{Code: 404, Reason: metav1.StatusReasonNotFound, Message: `configmaps "x" not found`,
		Details: &metav1.StatusDetails{Name: "x", Kind: "configmaps"}}
	ipTaken := &metav1.Status{Code: 422, Reason: metav1.StatusReasonInvalid,
		Message: `Service "ipa-22-5" is invalid: spec.clusterIPs: Invalid value: ["10.96.22.5"]: failed to allocate IP 10.96.22.5: provided IP is already allocated`}
	portTaken := &metav1.Status{Code: 422, Reason: metav1.StatusReasonInvalid,
		Message: `Service "np-2" is invalid: spec.ports[0].nodePort: Invalid value: 31442: provided port is already allocated`}
	for _, tc := range []struct {
		name     string
		run      *Run
		answered int
		refusal  *metav1.Status
		want     string // contains; "" keeps the admission
		stage    string // the stage that says so
	}{
		{"a create refused in a terminating namespace", &Run{Verb: "create", Resource: "events"}, 403, terminating, "is being terminated, and the replay's NamespaceLifecycle found it active", record.StageMutatingAdmission},
		{"the namespace's cause alone", &Run{Verb: "create", Resource: "events"}, 403, causeOnly, "is being terminated", record.StageMutatingAdmission},
		{"a dry run refused in a terminating namespace", &Run{Verb: "create", Resource: "events", DryRun: true}, 403, terminating, "is being terminated", record.StageMutatingAdmission},
		{"a create over quota", &Run{Verb: "create", Resource: "configmaps"}, 403, quota, "found less used than the apiserver had counted", record.StageValidatingAdmission},
		{"an update over quota", &Run{Verb: "update", Resource: "pods"}, 403, quota, "exceeded quota", record.StageValidatingAdmission},
		{"an update in a terminating namespace", &Run{Verb: "update", Resource: "events"}, 403, terminating, "", ""},
		{"refused by RBAC", &Run{Verb: "create", Resource: "configmaps"}, 403, rbac, "", ""},
		{"a create before its namespace", &Run{Verb: "create", Resource: "configmaps"}, 404, nsMissing, "it was created after this request", record.StageMutatingAdmission},
		{"a dry-run create before its namespace", &Run{Verb: "create", Resource: "configmaps", DryRun: true}, 404, nsMissing, "namespace", record.StageMutatingAdmission},
		{"an update of an object not found", &Run{Verb: "update", Resource: "configmaps"}, 404, objMissing, "", ""},
		{"a pod before its ServiceAccount", &Run{Verb: "create", Resource: "pods"}, 403, noSA, "the ServiceAccount: it was created after this request", record.StageMutatingAdmission},
		{"a dry-run pod before its ServiceAccount", &Run{Verb: "create", Resource: "pods", DryRun: true}, 403, noSA, "created after this request", record.StageMutatingAdmission},
		{"a Service whose cluster IP another took in flight", &Run{Verb: "create", Resource: "services"}, 422, ipTaken, "the allocations changed while this request was in flight", record.StageValidation},
		{"a Service whose node port another took in flight", &Run{Verb: "update", Resource: "services"}, 422, portTaken, "already allocated", record.StageValidation},
		{"a Service refused otherwise", &Run{Verb: "create", Resource: "services"}, 422, &metav1.Status{Code: 422, Reason: metav1.StatusReasonInvalid, Message: `Service "x" is invalid: spec.ports: Required value`}, "", ""},
		{"refused without a Status", &Run{Verb: "create", Resource: "configmaps"}, 403, nil, "", ""},
		{"admitted by both", &Run{Verb: "create", Resource: "configmaps"}, 201, nil, "", ""},
		{"refused by the replay too", &Run{Verb: "create", Resource: "configmaps", Status: quota}, 403, quota, "", ""},
		{"a read", &Run{Verb: "create", Resource: "configmaps", Read: true}, 403, quota, "", ""},
		{"an exec (its answer is its stream)", &Run{Verb: "create", Resource: "pods", Subresource: "exec"}, 403, terminating, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.run
			r.actual = func(context.Context) (Answer, bool) { return Answer{Status: tc.answered, Refusal: tc.refusal}, true }
			stage, why := r.admittedEarly(context.Background())
			if (tc.want == "") != (why == "") || !strings.Contains(why, tc.want) {
				t.Errorf("admittedEarly = %q, want %q", why, tc.want)
			}
			if stage != tc.stage {
				t.Errorf("admittedEarly's stage = %q, want %q", stage, tc.stage)
			}
		})
	}
}

// TestMetBeforeEmptying: an update answered with its object being deleted
// and no finalizers left met the state at the answered resourceVersion
// when that state still had finalizers (the apiserver deleted it instead
// of storing the update); a pod in graceful deletion, stored without
// finalizers, was the update's own write there.
func TestMetBeforeEmptying(t *testing.T) {
	held := podAt(11, "u1", "node-1", true)
	held.Finalizers = []string{"foregroundDeletion"}
	graceful := podAt(11, "u1", "node-1", true)
	for _, tc := range []struct {
		name     string
		versions []*api.Pod
		want     bool
	}{
		{"finalizers at the answered resourceVersion", []*api.Pod{podAt(10, "u1", "node-1", false), held}, true},
		{"a pod in graceful deletion, no finalizers", []*api.Pod{podAt(10, "u1", "node-1", true), graceful}, false},
		{"not being deleted", []*api.Pod{podAt(11, "u1", "node-1", false)}, false},
		{"absent", []*api.Pod{podAt(12, "u1", "node-1", false)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := &api.Pod{}
			met, err := metBeforeEmptying(context.Background(), &history{versions: tc.versions}, "11", out)
			switch {
			case err != nil:
				t.Fatal(err)
			case met != tc.want:
				t.Errorf("met = %v, want %v", met, tc.want)
			case met && (out.ResourceVersion != "11" || len(out.Finalizers) == 0):
				t.Errorf("out = %+v, want the state at 11", out.ObjectMeta)
			case !met && out.Name != "":
				t.Errorf("out was touched: %+v", out.ObjectMeta)
			}
		})
	}
}

// TestModifiedInFlight: an update the replay admits at the version it read
// on arrival, which the apiserver's store refused as modified, met a write
// that landed while it was in flight: unknown. Other conflicts, and other
// verbs, keep the verdict.
func TestModifiedInFlight(t *testing.T) {
	modified := &metav1.Status{Code: 409, Reason: metav1.StatusReasonConflict,
		Message: `Operation cannot be fulfilled on configmaps "ctr": the object has been modified; please apply your changes to the latest version and try again`}
	uid := &metav1.Status{Code: 409, Reason: metav1.StatusReasonConflict,
		Message: `Operation cannot be fulfilled on configmaps "ctr": Precondition failed: UID in precondition: a, UID in object meta: b`}
	exists := &metav1.Status{Code: 409, Reason: metav1.StatusReasonAlreadyExists, Message: `configmaps "ctr" already exists`}
	for _, tc := range []struct {
		name, verb string
		refusal    *metav1.Status
		want       string // contains; "" keeps the verdict
	}{
		{"an update, modified", "update", modified, "read the object at resourceVersion 41 as the request arrived, admits it: another write to the object landed while this request was in flight"},
		{"a patch, modified", "patch", modified, "landed while this request was in flight"},
		{"an update, another uid", "update", uid, ""},
		{"a create that exists", "create", exists, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Run{Verb: tc.verb, Resource: "configmaps", Reads: []StorageRead{{Key: "/configmaps/ns/ctr", Found: true, ResourceVersion: "41"}}}
			r.actual = func(context.Context) (Answer, bool) { return Answer{Status: 409, Refusal: tc.refusal}, true }
			stage, why := r.admittedEarly(context.Background())
			if (tc.want == "") != (why == "") || !strings.Contains(why, tc.want) {
				t.Errorf("admittedEarly = %q, want %q", why, tc.want)
			}
			if why != "" && stage != record.StageStorage {
				t.Errorf("admittedEarly's stage = %q, want storage (the store refused it)", stage)
			}
		})
	}
}

// TestChangedBeforeOwnWrite: a write the apiserver admitted (answered
// with resourceVersion 1905) that the replay refused from the object it
// read on arrival (1903) is unknown where the object was written again
// before the request's own write (at 1904, read as of 1904); where it
// was not, or the verdicts agree, the verdict stands.
func TestChangedBeforeOwnWrite(t *testing.T) {
	conflict := &metav1.Status{Code: 409, Reason: metav1.StatusReasonConflict, Message: `Apply failed with 1 conflict: conflict with "a": .data.a`}
	for _, tc := range []struct {
		name     string
		verb     string
		replay   *metav1.Status
		answered int
		answerRV string
		readRV   string
		atBefore string // the object's resourceVersion as of 1904; "" absent
		want     string // contains; "" keeps the verdict
	}{
		{"written again in between", "patch", conflict, 200, "1905", "1903", "1904",
			"the replay, which read the object at resourceVersion 1903 as the request arrived, refuses it (409: Apply failed with 1 conflict"},
		{"not written in between", "patch", conflict, 200, "1905", "1903", "1903", ""},
		{"an update", "update", conflict, 200, "1905", "1903", "1904", "another write changed the object (resourceVersion 1904)"},
		{"admitted by both", "patch", nil, 200, "1905", "1903", "1904", ""},
		{"refused by the apiserver", "patch", conflict, 409, "", "1903", "1904", ""},
		{"the replay read the request's own write", "patch", conflict, 200, "1905", "1905", "1904", ""},
		{"a create", "create", conflict, 201, "1905", "1903", "1904", ""},
		{"gone as of 1904", "patch", conflict, 200, "1905", "1903", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Run{Verb: tc.verb, Resource: "configmaps", Status: tc.replay,
				actual: func(context.Context) (Answer, bool) {
					return Answer{Status: tc.answered, ResourceVersion: tc.answerRV}, true
				},
				Reads: []StorageRead{{Key: "/registry/configmaps/ns/x", Found: true, ResourceVersion: tc.readRV,
					atRev: func(_ context.Context, rev string) (bool, string, error) {
						if rev != "1904" {
							t.Errorf("read as of %s, want 1904 (just before the request's own write)", rev)
						}
						return tc.atBefore != "", tc.atBefore, nil
					}}},
			}
			if tc.replay != nil {
				r.Code = int(tc.replay.Code)
			}
			got := r.changedBeforeOwnWrite(context.Background())
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("changedBeforeOwnWrite = %q, want %q", got, tc.want)
			}
		})
	}
}
