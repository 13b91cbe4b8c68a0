package apiserver

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
)

// TestSnapshotRevision: which state of the object a write's replay reads,
// given the apiserver's answer and what the store holds when the replay
// reads it (possibly late, behind a queue).
func TestSnapshotRevision(t *testing.T) {
	for _, tc := range []struct {
		name     string
		verb     string
		bodyRV   string
		status   int
		answerRV string
		found    bool
		rv       string // the object's resourceVersion when the replay reads it
		at       string
		why      string // contains
		sub      string // a pods subresource
	}{
		{"update, its own write visible", "update", "", 200, "10", true, "10", "9", "", ""},
		{"update that named the rv it left (no-op)", "update", "10", 200, "10", true, "10", "", "", ""},
		{"update, changed again since (a late replay)", "patch", "", 200, "10", true, "12", "9", "", ""},
		{"update, deleted since (a late replay)", "patch", "", 200, "10", false, "", "9", "", ""},
		{"no-op that named its rv, changed since", "update", "10", 200, "10", true, "12", "10", "", ""},
		{"no-op that named its rv, deleted since", "update", "10", 200, "10", false, "", "10", "", ""},
		{"create, its own write visible", "create", "", 201, "10", true, "10", "9", "", ""},
		{"create, changed since (a controller)", "create", "", 201, "10", true, "15", "9", "", ""},
		{"delete, gone", "delete", "", 200, "10", false, "", "9", "", ""},
		{"refused: nothing written", "update", "", 409, "", true, "12", "", "", ""},
		{"create refused as existing, found", "create", "", 409, "", true, "12", "", "", ""},
		{"create refused as existing, gone since (a late replay)", "create", "", 409, "", false, "", "", "deleted between the apiserver's read and the replay's", ""},
		{"update of a missing object, still missing", "update", "", 404, "", false, "", "", "", ""},
		{"update of a missing object, created since (a late replay)", "patch", "", 404, "", true, "12", "", "created, or deleted, between the apiserver's read", ""},
		{"delete of a missing object, created since", "delete", "", 404, "", true, "12", "", "created, or deleted, between the apiserver's read", ""},
		{"eviction refused for its budget, pod deleted since", "create", "", 429, "", false, "", "", "deleted between the apiserver's read and the replay's", "eviction"},
		{"eviction refused for its budget, pod still there", "create", "", 429, "", true, "12", "", "", "eviction"},
		{"eviction of a missing pod, still missing", "create", "", 404, "", false, "", "", "", "eviction"},
		{"binding refused as already assigned, pod deleted since", "create", "", 409, "", false, "", "", "deleted between the apiserver's read and the replay's", "binding"},
		{"update refused 409 (a conflict), deleted since", "update", "", 409, "", false, "", "", "deleted between the apiserver's read and the replay's", ""},
		{"namespace finalize refused 409, deleted since", "update", "", 409, "", false, "", "", "deleted between the apiserver's read and the replay's", "finalize"},
		{"update refused 409, still there", "update", "", 409, "", true, "12", "", "", ""},
		// Found by a probe of racing writers (each once a few dozen races).
		{"delete refused by its precondition, deleted since", "delete", "", 409, "", false, "", "", "deleted between the apiserver's read and the replay's", ""},
		{"merge patch refused as invalid, deleted since", "patch", "", 422, "", false, "", "", "deleted between the apiserver's read and the replay's", ""},
		{"update refused as invalid, not found (it may create)", "update", "", 422, "", false, "", "", "", ""},
		{"scale of a missing deployment, created since", "update", "", 404, "", true, "12", "", "created, or deleted, between the apiserver's read", "scale"},
		{"status patch of a missing object, created since", "patch", "", 404, "", true, "12", "", "created, or deleted, between the apiserver's read", "status"},
		{"proxy to a pod answered 404 by its backend", "create", "", 404, "", true, "12", "", "", "proxy"},
		{"TokenRequest bound to a missing pod", "create", "", 404, "", true, "12", "", "", "token"},
		{"binding refused otherwise (403), pod deleted since", "create", "", 403, "", false, "", "", "", "binding"},
		// A TokenRequest's answer carries back the resourceVersion its body
		// named: no revision of the service account.
		{"TokenRequest whose body named an old resourceVersion", "create", "3", 201, "3", true, "213", "", "", "token"},
		{"TokenRequest whose body named the service account's", "create", "213", 201, "213", true, "213", "", "", "token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Run{Verb: tc.verb, BodyRV: tc.bodyRV, Subresource: tc.sub, actual: func(context.Context) (Answer, bool) {
				return Answer{Status: tc.status, ResourceVersion: tc.answerRV}, true
			}}
			switch tc.sub {
			case "":
			case "token":
				r.Resource = "serviceaccounts"
			default:
				r.Resource = "pods"
			}
			at, why := r.snapshotRevision(context.Background(), "", tc.found, tc.rv)
			if at != tc.at || (tc.why == "") != (why == "") || !strings.Contains(why, tc.why) {
				t.Errorf("snapshotRevision = %q, %q; want %q and a reason saying %q", at, why, tc.at, tc.why)
			}
		})
	}
}

// TestSnapshotRevisionAdmissionRefusal: an admission webhook or policy
// refuses with the code it likes, 404 and 409 too; such a refusal says
// nothing of the object, and the replay reads the latest (found by a
// probe: a webhook's 404 to an update of an object that was always there,
// and its 409 to a create or an apply of one that never was, said the
// object was created or deleted after the request).
func TestSnapshotRevisionAdmissionRefusal(t *testing.T) {
	webhook := func(code int32) *metav1.Status {
		return &metav1.Status{Code: code, Message: fmt.Sprintf(`admission webhook "validate.example.com" denied the request: webhook code %d`, code)}
	}
	for _, tc := range []struct {
		name    string
		verb    string
		refusal *metav1.Status
		found   bool
	}{
		{"a webhook's 404 to an update, object there", "update", webhook(404), true},
		{"a webhook's 404 to a patch, object there", "patch", webhook(404), true},
		{"a webhook's 409 to a create, no object", "create", webhook(409), false},
		{"a webhook's 409 to an apply, no object", "patch", webhook(409), false},
		{"a policy's 409, no object", "create", &metav1.Status{Code: 409, Message: `configmaps "c" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'p' denied request: no`}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Run{Verb: tc.verb, Resource: "configmaps", actual: func(context.Context) (Answer, bool) {
				return Answer{Status: int(tc.refusal.Code), Refusal: tc.refusal}, true
			}}
			if at, why := r.snapshotRevision(context.Background(), "", tc.found, "12"); at != "" || why != "" {
				t.Errorf("snapshotRevision = %q, %q; want the latest, nothing unknown", at, why)
			}
		})
	}
	// The store's own 409 still says what it says.
	r := &Run{Verb: "create", Resource: "configmaps", actual: func(context.Context) (Answer, bool) {
		return Answer{Status: 409, Refusal: &metav1.Status{Code: 409, Reason: metav1.StatusReasonAlreadyExists, Message: `configmaps "c" already exists`}}, true
	}}
	if _, why := r.snapshotRevision(context.Background(), "", false, ""); !strings.Contains(why, "deleted between the apiserver's read and the replay's") {
		t.Errorf("the store's 409 for a create, the object gone since: %q", why)
	}
}

// TestCreatedHere: a request the apiserver answered 201 for its own object
// created it, so the object was absent just before (the replay reads
// nothing more); a subresource's 201, any other status, or no answer
// says nothing of the kind.
func TestCreatedHere(t *testing.T) {
	for _, tc := range []struct {
		verb, subresource string
		status            int
		answered          bool
		want              bool
	}{
		{"create", "", 201, true, true},
		{"update", "", 201, true, true}, // created by a PUT
		{"patch", "", 201, true, true},  // created by an apply
		{"update", "", 200, true, false},
		{"create", "", 409, true, false},
		{"create", "eviction", 201, true, false},
		{"create", "", 201, false, false},
	} {
		r := &Run{Verb: tc.verb, Subresource: tc.subresource, actual: func(context.Context) (Answer, bool) {
			return Answer{Status: tc.status, ResourceVersion: "10"}, tc.answered
		}}
		if got := r.createdHere(context.Background()); got != tc.want {
			t.Errorf("%s %s answered %d (%v): createdHere %v, want %v", tc.verb, tc.subresource, tc.status, tc.answered, got, tc.want)
		}
	}
	if (&Run{Verb: "create"}).createdHere(context.Background()) {
		t.Error("createdHere without a live request (kproxy explain)")
	}
}

// TestBodyResourceVersion: the resourceVersion a write's body names, sent
// as JSON, YAML or protobuf (a controller's update): a no-op that named it
// is told apart by it.
func TestBodyResourceVersion(t *testing.T) {
	cm := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default", ResourceVersion: "42"}}
	pb := protobuf.NewSerializer(legacyscheme.Scheme, legacyscheme.Scheme)
	var buf bytes.Buffer
	if err := pb.Encode(cm, &buf); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		body []byte
		want string
	}{
		{"json", []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","resourceVersion":"42"}}`), "42"},
		{"yaml", []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  resourceVersion: \"42\"\n"), "42"},
		{"protobuf", buf.Bytes(), "42"},
		{"json without one (a patch)", []byte(`{"data":{"k":"v"}}`), ""},
		{"no body", nil, ""},
		{"not an object", []byte("\x00\x01garbage"), ""},
	} {
		if got := bodyResourceVersion(tc.body); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestNoOpLate: the replay's refusal of a write the apiserver admitted
// with the resourceVersion the object had, read just before it: the
// request's own write, or an earlier one's kept by a write that changed
// nothing; which, the replay cannot say.
func TestNoOpLate(t *testing.T) {
	refused := &metav1.Status{Code: 422, Message: `Node "n4" is invalid: spec.podCIDRs[0]: Invalid value: "bad"`}
	for _, tc := range []struct {
		name   string
		read   StorageRead
		answer Answer
		dryRun bool
		want   string
	}{
		{"read just before the answered resourceVersion", StorageRead{Snapshot: "9", Found: true}, Answer{Status: 200, ResourceVersion: "10"}, false,
			"answered with resourceVersion 10, which the object had when the replay read it"},
		{"read as the no-op it was", StorageRead{Snapshot: "10", Found: true, NoOp: true}, Answer{Status: 200, ResourceVersion: "10"}, false, ""},
		{"read behind later writes", StorageRead{Snapshot: "9", Found: true, Later: "12"}, Answer{Status: 200, ResourceVersion: "10"}, false, ""},
		{"read at another revision", StorageRead{Snapshot: "7", Found: true}, Answer{Status: 200, ResourceVersion: "10"}, false, ""},
		{"refused by both", StorageRead{Snapshot: "9", Found: true}, Answer{Status: 422}, false, ""},
		{"a dry run", StorageRead{Snapshot: "9", Found: true}, Answer{Status: 200, ResourceVersion: "10"}, true, ""},
		{"the latest read", StorageRead{Found: true}, Answer{Status: 200, ResourceVersion: "10"}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Run{Verb: "patch", Resource: "nodes", Status: refused, Code: 422, DryRun: tc.dryRun, Reads: []StorageRead{tc.read},
				actual: func(context.Context) (Answer, bool) { return tc.answer, true }}
			why := r.noOpLate(context.Background())
			if (tc.want == "") != (why == "") || !strings.Contains(why, tc.want) {
				t.Errorf("noOpLate = %q, want %q", why, tc.want)
			}
		})
	}
}

// TestOwnDeleteMark: the object just before a delete shows the request's
// own mark (grace period 0, at or after the arrival): the state met is
// the revision before it; a mark clearly earlier, or a grace period, is
// not the request's.
func TestOwnDeleteMark(t *testing.T) {
	arrival := time.Date(2026, 12, 6, 14, 50, 41, 700_000_000, time.UTC)
	pod := func(at time.Time, grace int64, rv string) *corev1.Pod {
		ts := metav1.NewTime(at)
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: rv, DeletionTimestamp: &ts, DeletionGracePeriodSeconds: &grace}}
	}
	for _, tc := range []struct {
		name string
		obj  *corev1.Pod
		want string
	}{
		{"marked by the request (the second it arrived in)", pod(arrival.Truncate(time.Second), 0, "398"), "397"},
		{"marked clearly earlier (an object finalizers kept)", pod(arrival.Add(-5*time.Second), 0, "398"), ""},
		{"marked with a grace period (a graceful delete)", pod(arrival.Add(30*time.Second), 30, "398"), ""},
		{"not marked", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "398"}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ownDeleteMark(tc.obj, arrival)
			if got != tc.want || ok != (tc.want != "") {
				t.Errorf("ownDeleteMark = %q, %v; want %q", got, ok, tc.want)
			}
		})
	}
}

// TestCreatedOver: a create answered 201 whose replay read an earlier
// copy of its object reads it just before the create; its other reads,
// and other answers, keep what they read. So does a server-side apply
// (a patch) or an update answered 201: it created its object.
func TestCreatedOver(t *testing.T) {
	answered := func(status int, rv string) func(context.Context) (Answer, bool) {
		return func(context.Context) (Answer, bool) { return Answer{Status: status, ResourceVersion: rv}, true }
	}
	for _, tc := range []struct {
		name, verb, key, rv string
		status              int
		bodyName            string
		want                string
	}{
		{name: "an earlier copy of the object created", key: "/configmaps/ns/taken", rv: "7", status: 201, bodyName: "taken", want: "9"},
		{name: "the object just before the create", key: "/configmaps/ns/taken", rv: "9", status: 201, bodyName: "taken", want: "9"},
		{name: "the request's own object", key: "/configmaps/ns/taken", rv: "10", status: 201, bodyName: "taken"},
		{name: "another object (a role an escalation check reads)", key: "/clusterroles/system:basic-user", rv: "7", status: 201, bodyName: "taken"},
		{name: "the same name in another namespace", key: "/configmaps/other/taken", rv: "7", status: 201, bodyName: "taken"},
		{name: "refused as existing", key: "/configmaps/ns/taken", rv: "7", status: 409, bodyName: "taken"},
		{name: "a generated name", key: "/configmaps/ns/taken", rv: "7", status: 201},
		{name: "an apply that created its object", verb: "patch", key: "/configmaps/ns/taken", rv: "7", status: 201, want: "9"},
		{name: "an update that created its object", verb: "update", key: "/configmaps/ns/taken", rv: "7", status: 201, want: "9"},
		{name: "an apply that updated its object", verb: "patch", key: "/configmaps/ns/taken", rv: "7", status: 200},
		{name: "an apply's read of another resource of its name", verb: "patch", key: "/roles/ns/taken", rv: "7", status: 201},
		{name: "an apply's read of another object", verb: "patch", key: "/configmaps/ns/other", rv: "7", status: 201},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body []byte
			if tc.bodyName != "" {
				body = []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"` + tc.bodyName + `","namespace":"ns"}}`)
			} else {
				body = []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"generateName":"taken-"}}`)
			}
			r := &Run{Verb: "create", namespace: "ns", body: body, actual: answered(tc.status, "10")}
			if tc.verb != "" {
				r = &Run{Verb: tc.verb, Resource: "configmaps", namespace: "ns", name: "taken", actual: answered(tc.status, "10")}
			}
			got, ok := r.createdOver(context.Background(), tc.key, tc.rv)
			if got != tc.want || ok != (tc.want != "") {
				t.Errorf("createdOver = %q, %v; want %q", got, ok, tc.want)
			}
		})
	}
}

// TestDryRunCreated: a dry run answered 201 reads its own object as
// absent, as the apiserver found it; its other reads, other answers and
// requests that are not dry runs keep what they read.
func TestDryRunCreated(t *testing.T) {
	answered := func(status int) func(context.Context) (Answer, bool) {
		return func(context.Context) (Answer, bool) { return Answer{Status: status}, true }
	}
	body := []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"taken"}}`)
	for _, tc := range []struct {
		name string
		r    *Run
		key  string
		want bool
	}{
		{"a dry-run create", &Run{Verb: "create", DryRun: true, namespace: "ns", body: body, actual: answered(201)}, "/configmaps/ns/taken", true},
		{"a dry-run apply", &Run{Verb: "patch", DryRun: true, Resource: "configmaps", namespace: "ns", name: "taken", actual: answered(201)}, "/configmaps/ns/taken", true},
		{"a dry-run apply that would update", &Run{Verb: "patch", DryRun: true, Resource: "configmaps", namespace: "ns", name: "taken", actual: answered(200)}, "/configmaps/ns/taken", false},
		{"a create, not a dry run", &Run{Verb: "create", namespace: "ns", body: body, actual: answered(201)}, "/configmaps/ns/taken", false},
		{"another object a dry-run create reads", &Run{Verb: "create", DryRun: true, namespace: "ns", body: body, actual: answered(201)}, "/serviceaccounts/ns/default", false},
		{"another resource of the apply's name", &Run{Verb: "patch", DryRun: true, Resource: "configmaps", namespace: "ns", name: "taken", actual: answered(201)}, "/roles/ns/taken", false},
		{"the same name in another namespace", &Run{Verb: "patch", DryRun: true, Resource: "configmaps", namespace: "ns", name: "taken", actual: answered(201)}, "/configmaps/other/taken", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.r.dryRunCreated(context.Background(), tc.key); got != tc.want {
				t.Errorf("dryRunCreated(%s) = %v, want %v", tc.key, got, tc.want)
			}
		})
	}
}
