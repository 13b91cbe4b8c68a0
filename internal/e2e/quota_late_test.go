package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// TestQuotaUsedByOwnWrite: creates in a namespace whose ResourceQuota
// allows two configmaps, replayed late behind a queue of writes. The
// apiserver's ResourceQuota adds each create it admits to the quota's
// usage before it stores the object, so a replay that reads the usage
// after the request finds it already counting the request itself: it
// refused the two creates the apiserver admitted (403 "exceeded quota",
// confidently wrong). They now say the state on arrival is not known; the
// third create, refused by both, is predicted. A fourth, refused, whose
// replay reads the usage after it went down, says unknown too.
func TestQuotaUsedByOwnWrite(t *testing.T) {
	ns := lateNamespace(t, "quota-late")
	createQuota(t, ns, corev1.ResourceList{"count/configmaps": resource.MustParse("2")})
	recs, r, c := oneReplayWorker(t)
	// kproxy's informers have the quota (and its usage) before the writes.
	waitPredicted(t, recs, r, c, request{method: "POST", path: "/api/v1/namespaces/" + ns + "/configmaps?dryRun=All", user: "admin",
		body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"probe"}}`})

	// Forty dry-run writes queue their replays ahead of the creates'.
	const ahead = 40
	queueWrites(t, r, c, ahead)
	want := []int{201, 201, 403}
	for i, w := range want {
		got := do(t, c, r.base, request{method: "POST", path: "/api/v1/namespaces/" + ns + "/configmaps", user: "admin",
			body: fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm-%d"}}`, i)})
		if got.status != w {
			t.Fatalf("create cm-%d: the apiserver answered %d, want %d: %s", i, got.status, w, got.body)
		}
	}
	late := 0
	for range ahead + len(want) {
		rec := nextRecord(t, recs)
		if rec.Request.Namespace != ns {
			continue
		}
		switch {
		case rec.Predicted.Stage == record.StageUnknown && strings.Contains(rec.Predicted.Message, "already counts this request"):
			late++
		case rec.Predicted.Stage == record.StageUnknown:
			t.Errorf("%s: unknown for another reason: %s", rec.Request.Path, rec.Predicted.Message)
		case rec.Predicted.Status != rec.Actual.Status:
			t.Errorf("create in %s: predicted %+v, the apiserver answered %d: confidently wrong", ns, rec.Predicted, rec.Actual.Status)
		case rec.Actual.Status == 403 && (rec.Predicted.Stage != record.StageValidatingAdmission || !strings.Contains(rec.Predicted.Message, "exceeded quota")):
			t.Errorf("the refused create: predicted %+v, want exceeded quota at validating-admission", rec.Predicted)
		}
	}
	if late == 0 {
		t.Errorf("no replay of an admitted create read the quota after its own write: the path under test was not taken")
	}
	t.Logf("%d of the 2 admitted creates replayed after the quota counted them, said unknown", late)

	// The other way: a create refused over quota, whose replay reads the
	// usage after it has gone down (as the quota controller lowers it
	// when objects are deleted), would admit it. It says unknown. Whether
	// the replay runs after kproxy's informer saw the change is up to
	// the machine: a replay that ran before it predicts the 403 (right,
	// but not the path under test), and the test tries again.
	setUsed := func(n string) { setConfigMapsUsed(t, ns, n) }
	tookPath := false
	for try := 1; try <= 3 && !tookPath; try++ {
		if try > 1 {
			setUsed("2")
			waitPredicted(t, recs, r, c, request{method: "POST", path: "/api/v1/namespaces/" + ns + "/configmaps?dryRun=All", user: "admin",
				body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm-3"}}`})
		}
		queueWrites(t, r, c, ahead*try)
		if got := do(t, c, r.base, request{method: "POST", path: "/api/v1/namespaces/" + ns + "/configmaps", user: "admin",
			body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm-3"}}`}); got.status != 403 {
			t.Fatalf("create cm-3: the apiserver answered %d, want 403: %s", got.status, got.body)
		}
		setUsed("0")
		for range ahead*try + 1 {
			rec := nextRecord(t, recs)
			if rec.Request.Namespace != ns {
				continue
			}
			p := rec.Predicted
			switch {
			case p.Stage == record.StageUnknown && strings.Contains(p.Message, "found less used than the apiserver had counted"):
				tookPath = true
				// ResourceQuota refuses in its Validate (it had said decode).
				saysAt(t, rec, "found less used than the apiserver had counted", record.StageValidatingAdmission)
			case p.Status == 403 && strings.Contains(p.Message, "used: count/configmaps=2"):
				t.Logf("try %d: cm-3's replay read the usage before it went down (predicted the 403)", try)
			default:
				t.Errorf("cm-3, refused over quota, replayed after the usage went down: predicted %+v, want unknown", p)
			}
		}
	}
	if !tookPath {
		t.Errorf("in 3 tries, cm-3's replay never read the usage after it went down: the path under test was not taken")
	}
}

// createQuota creates the ResourceQuota "quota" in ns with hard, and sets
// its status as the quota controller would (no controller manager runs
// for these tests): hard as the spec's, nothing used. The quota's
// admission enforces only what the status holds.
func createQuota(t *testing.T, ns string, hard corev1.ResourceList) {
	t.Helper()
	ctx := context.Background()
	cs := adminClient()
	q, err := cs.CoreV1().ResourceQuotas(ns).Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "quota"},
		Spec: corev1.ResourceQuotaSpec{Hard: hard}}, createOpts)
	if err != nil {
		t.Fatal(err)
	}
	used := corev1.ResourceList{}
	for name := range hard {
		used[name] = resource.MustParse("0")
	}
	q.Status = corev1.ResourceQuotaStatus{Hard: hard, Used: used}
	if _, err := cs.CoreV1().ResourceQuotas(ns).UpdateStatus(ctx, q, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestQuotaCountedThenRefusedAtStorage: a create of a configmap that
// exists, in a namespace whose quota has room for one more. The
// apiserver's ResourceQuota admits it and counts it, and its storage then
// refuses it (409 AlreadyExists); the count is not given back (no quota
// controller runs here; one would recompute the usage later). The replay,
// reading the usage after that, refused it over quota: 403 predicted for
// the 409 (a probe, with kubectl create job). It now says unknown; a
// replay that read the usage before the count predicts the 409.
func TestQuotaCountedThenRefusedAtStorage(t *testing.T) {
	ns := lateNamespace(t, "quota-counted")
	createQuota(t, ns, corev1.ResourceList{"count/configmaps": resource.MustParse("2")})
	recs, r, c := oneReplayWorker(t)
	create := request{method: "POST", path: "/api/v1/namespaces/" + ns + "/configmaps", user: "admin",
		body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"there"}}`}
	if got := do(t, c, r.base, create); got.status != 201 {
		t.Fatalf("create: %d %s", got.status, got.body)
	}
	nextRecord(t, recs)
	tookPath := false
	for try := 1; try <= 3 && !tookPath; try++ {
		setConfigMapsUsed(t, ns, "1")
		// kproxy's informer has the usage of 1 before the create.
		waitPredicted(t, recs, r, c, request{method: "POST", path: "/api/v1/namespaces/" + ns + "/configmaps?dryRun=All", user: "admin",
			body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"probe"}}`})
		// Writes queued ahead: the create's replay reads the usage after
		// the apiserver counted it.
		queueWrites(t, r, c, 20*try)
		if got := do(t, c, r.base, create); got.status != 409 {
			t.Fatalf("the create again: the apiserver answered %d, want 409 AlreadyExists: %s", got.status, got.body)
		}
		for range 20*try + 1 {
			rec := nextRecord(t, recs)
			if rec.Request.Namespace != ns {
				continue
			}
			p := rec.Predicted
			switch {
			case p.Stage == record.StageUnknown && strings.Contains(p.Message, "its storage then refused it (409") &&
				strings.Contains(p.Message, "counting this very request"):
				tookPath = true
			case p.Stage == record.StageUnknown:
				t.Errorf("the create of an existing configmap: unknown for another reason: %s", p.Message)
			case p.Status != 409:
				t.Errorf("the create of an existing configmap: predicted %d at %q (%s), the apiserver answered 409: confidently wrong", p.Status, p.Stage, p.Message)
			}
		}
	}
	if !tookPath {
		t.Errorf("no replay read the usage after the apiserver counted the create, in 3 tries: the path under test was not taken")
	}
}

// setConfigMapsUsed sets the usage of count/configmaps in ns's quota, as
// the quota controller would (none runs here).
func setConfigMapsUsed(t *testing.T, ns, n string) {
	t.Helper()
	ctx := context.Background()
	cs := adminClient()
	q, err := cs.CoreV1().ResourceQuotas(ns).Get(ctx, "quota", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	q.Status.Used = corev1.ResourceList{"count/configmaps": resource.MustParse(n)}
	if _, err := cs.CoreV1().ResourceQuotas(ns).UpdateStatus(ctx, q, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
