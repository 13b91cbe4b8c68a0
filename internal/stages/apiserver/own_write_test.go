package apiserver

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	api "k8s.io/kubernetes/pkg/apis/core"
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
	evicted := func(rv int, uid string) *api.Pod {
		p := podAt(rv, uid, "node-1", false)
		p.Status.Conditions = []api.PodCondition{{Type: api.DisruptionTarget, Status: api.ConditionTrue, Reason: "EvictionByEvictionAPI"}}
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
	}{
		{"binding, the newest write", binding, []*api.Pod{podAt(10, "u1", "", false), podAt(11, "u1", "node-1", false)}, 11, "10", ""},
		{"binding, revisions of other objects between", binding, []*api.Pod{podAt(10, "u1", "", false), podAt(17, "u1", "node-1", false)}, 17, "16", ""},
		{"binding, written often since", binding, many, 3998, "100", ""},
		{"binding of a pod whose name an older pod had", binding,
			[]*api.Pod{podAt(5, "u0", "node-2", false), {ObjectMeta: metav1.ObjectMeta{ResourceVersion: "6"}}, podAt(8, "u1", "", false), podAt(9, "u1", "node-1", false)}, 9, "8", ""},
		{"eviction: marked, then deleting", eviction,
			[]*api.Pod{podAt(20, "u1", "node-1", false), evicted(30, "u1"), podAt(31, "u1", "node-1", true)}, 31, "29", ""},
		{"the pod as stored does not show the write", binding, []*api.Pod{podAt(10, "u1", "", false)}, 10, "", "does not show it"},
		{"created showing the write", binding, []*api.Pod{podAt(10, "u1", "node-1", false), podAt(12, "u1", "node-1", false)}, 12, "", "created already showing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &history{versions: tc.versions}
			out := &api.Pod{}
			if _, err := h.at(context.Background(), strconv.Itoa(tc.hi), out); err != nil {
				t.Fatal(err)
			}
			at, err := readBeforeOwnWrite(context.Background(), h, tc.w, strconv.Itoa(tc.hi), out)
			switch {
			case tc.why != "":
				if err == nil || !strings.Contains(err.Error(), tc.why) {
					t.Fatalf("err = %v, want it to say %q", err, tc.why)
				}
			case err != nil:
				t.Fatal(err)
			case at != tc.at:
				t.Errorf("read at %s, want %s", at, tc.at)
			case tc.w.done(out):
				t.Errorf("out shows the write: %+v", out)
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
	budget := &metav1.Status{Code: 429, Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: "DisruptionBudget"}}}}
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
		{"a 404 from another plugin", &Run{Verb: "create", Resource: "configmaps", Status: nsGone, PluginErrName: "SomethingElse"}, 403, ""},
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

// TestAdmittedEarly: a create the replay admits and the apiserver refused
// 403, in a namespace being terminated (or gone) now, is unknown: the
// replay's informer may not have seen the deletion the apiserver's
// NamespaceLifecycle looked up live. Otherwise the admission stands, and
// the namespace is read only when the answers disagree.
func TestAdmittedEarly(t *testing.T) {
	active := &corev1.Namespace{Status: corev1.NamespaceStatus{Phase: corev1.NamespaceActive}}
	terminating := &corev1.Namespace{Status: corev1.NamespaceStatus{Phase: corev1.NamespaceTerminating}}
	deleting := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &metav1.Time{}}, Status: corev1.NamespaceStatus{Phase: corev1.NamespaceActive}}
	for _, tc := range []struct {
		name      string
		run       *Run
		namespace string
		answered  int
		now       *corev1.Namespace // nil: gone
		readErr   error
		want      string // contains; "" keeps the admission
		reads     int
	}{
		{"refused 403, terminating now", &Run{Verb: "create", Resource: "events"}, "kcm-1", 403, terminating, nil, `namespace "kcm-1" active; the namespace is being terminated now`, 1},
		{"refused 403, deletion begun now", &Run{Verb: "create", Resource: "events"}, "kcm-1", 403, deleting, nil, "is being terminated now", 1},
		{"refused 403, gone now", &Run{Verb: "create", Resource: "events"}, "kcm-1", 403, nil, nil, "is gone now", 1},
		{"a dry run refused 403, terminating now", &Run{Verb: "create", Resource: "events", DryRun: true}, "kcm-1", 403, terminating, nil, "is being terminated now", 1},
		{"refused 403, active now", &Run{Verb: "create", Resource: "events"}, "kcm-1", 403, active, nil, "", 1},
		{"refused 403, the namespace unreadable", &Run{Verb: "create", Resource: "events"}, "kcm-1", 403, nil, errors.New("throttled"), "", 1},
		{"admitted by both", &Run{Verb: "create", Resource: "events"}, "kcm-1", 201, terminating, nil, "", 0},
		{"an update refused 403", &Run{Verb: "update", Resource: "events"}, "kcm-1", 403, terminating, nil, "", 0},
		{"a cluster-scoped create refused 403", &Run{Verb: "create", Resource: "namespaces"}, "", 403, terminating, nil, "", 0},
		{"a read", &Run{Verb: "create", Resource: "events", Read: true}, "kcm-1", 403, terminating, nil, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.run
			r.actual = func(context.Context) (Answer, bool) { return Answer{Status: tc.answered}, true }
			reads := 0
			now := func(_ context.Context, name string) (*corev1.Namespace, bool, error) {
				reads++
				if name != tc.namespace {
					t.Errorf("read namespace %q, want %q", name, tc.namespace)
				}
				return tc.now, tc.now != nil, tc.readErr
			}
			why := r.admittedEarly(context.Background(), tc.namespace, now)
			if (tc.want == "") != (why == "") || !strings.Contains(why, tc.want) {
				t.Errorf("admittedEarly = %q, want %q", why, tc.want)
			}
			if reads != tc.reads {
				t.Errorf("%d namespace reads, want %d", reads, tc.reads)
			}
		})
	}
}
