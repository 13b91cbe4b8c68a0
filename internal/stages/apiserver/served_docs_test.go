package apiserver

import (
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
)

// TestSeenBefore: the last read of a document kproxy had by a time, from
// the few it keeps.
func TestSeenBefore(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 11, 0, 0, 0, time.UTC)
	d := &ServedDocs{}
	if _, ok := d.SeenBefore("/openapi/v3", t0); ok {
		t.Fatal("a read before any was made")
	}
	for i := range seenKept + 2 {
		d.remember("/openapi/v3", Seen{At: t0.Add(time.Duration(i) * time.Second), ETag: string(rune('a' + i))})
	}
	for _, tc := range []struct {
		name string
		at   time.Duration
		want string // ETag; "" for none
	}{
		{"before every read kept", 1 * time.Second, ""},
		{"at a read", 5 * time.Second, "f"},
		{"between two reads", 5*time.Second + time.Millisecond, "f"},
		{"after the last", time.Hour, string(rune('a' + seenKept + 1))},
	} {
		s, ok := d.SeenBefore("/openapi/v3", t0.Add(tc.at))
		if got := map[bool]string{true: s.ETag}[ok]; got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	if _, ok := d.SeenBefore("/openapi/v2", t0.Add(time.Hour)); ok {
		t.Error("a read of another document")
	}
}

// TestSettledBefore: the documents are settled for a request when what
// they list last changed discoverySettle or more before it arrived; a
// change since, or none seen yet (the informers not synced), is not.
func TestSettledBefore(t *testing.T) {
	arrival := time.Date(2026, 12, 4, 14, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		changed time.Time
		want    bool
	}{
		{"changed a minute before", arrival.Add(-time.Minute), true},
		{"changed 10s before", arrival.Add(-10 * time.Second), false},
		{"changed after", arrival.Add(time.Second), false},
		{"no change seen yet", time.Time{}, false},
	} {
		d := &ServedDocs{changed: tc.changed}
		if got := d.SettledBefore(arrival); got != tc.want {
			t.Errorf("%s: SettledBefore = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestServedDocsKeep: a read is cached only if made once the documents
// had settled after their last change; one made while the aggregator was
// still updating them, or begun before a change, is read again next time.
func TestServedDocsKeep(t *testing.T) {
	changed := time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		read time.Time
		kept bool
	}{
		{"read a second after the change", changed.Add(time.Second), false},
		{"read just inside the settle window", changed.Add(discoverySettle), false},
		{"read after it", changed.Add(discoverySettle + time.Second), true},
		{"read begun before the change", changed.Add(-time.Minute), false},
	} {
		d := &ServedDocs{changed: changed, docs: map[string]cachedDoc{}}
		d.keep("/openapi/v3 application/json", cachedDoc{ServedDoc: ServedDoc{Status: 200}, read: tc.read})
		if _, got := d.docs["/openapi/v3 application/json"]; got != tc.kept {
			t.Errorf("%s: kept %v, want %v", tc.name, got, tc.kept)
		}
	}
}

// TestListedChangedAtItsLastWrite: an object the informers find at start
// counts as changed at its last write (creation, managed fields,
// conditions), not when kproxy started (a fresh kproxy had doubted every
// document for 30 s).
func TestListedChangedAtItsLastWrite(t *testing.T) {
	created := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	applied := metav1.NewTime(created.Add(time.Hour))
	crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com",
		CreationTimestamp: metav1.NewTime(created), ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Time: &applied}}},
		Status: apiextensionsv1.CustomResourceDefinitionStatus{Conditions: []apiextensionsv1.CustomResourceDefinitionCondition{
			{Type: apiextensionsv1.Established, LastTransitionTime: metav1.NewTime(created.Add(time.Minute))}}}}
	available := metav1.NewTime(created.Add(2 * time.Hour))
	svc := &apiregistrationv1.APIService{ObjectMeta: metav1.ObjectMeta{Name: "v1.apps", CreationTimestamp: metav1.NewTime(created)},
		Status: apiregistrationv1.APIServiceStatus{Conditions: []apiregistrationv1.APIServiceCondition{{Type: apiregistrationv1.Available, LastTransitionTime: available}}}}
	d := &ServedDocs{now: func() time.Time { return created.Add(24 * time.Hour) }, docs: map[string]cachedDoc{}}
	d.listed(crd)
	if !d.changed.Equal(applied.Time) {
		t.Errorf("after the CRD: changed %v, want its last apply %v", d.changed, applied.Time)
	}
	d.listed(svc)
	if !d.changed.Equal(available.Time) {
		t.Errorf("after the APIService: changed %v, want its condition's transition %v", d.changed, available.Time)
	}
	if !d.SettledBefore(created.Add(3 * time.Hour)) {
		t.Error("documents last changed an hour before the arrival are not settled")
	}
}

// TestGroupChanged: a group's document is doubted after a change of its
// own CRDs and APIServices, not another group's (every group's had been
// doubted after any CRD change); a deletion whose object is lost counts
// for every group.
func TestGroupChanged(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 15, 0, 0, 0, time.UTC)
	now := t0
	d := &ServedDocs{now: func() time.Time { return now }, docs: map[string]cachedDoc{}}
	crd := func(group string) *apiextensionsv1.CustomResourceDefinition {
		return &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "widgets." + group, CreationTimestamp: metav1.NewTime(t0.Add(-time.Hour))},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: group}}
	}
	d.listed(crd("a.example.com"))
	d.listed(&apiregistrationv1.APIService{ObjectMeta: metav1.ObjectMeta{Name: "v1.apps", CreationTimestamp: metav1.NewTime(t0.Add(-2 * time.Hour))},
		Spec: apiregistrationv1.APIServiceSpec{Group: "apps", Version: "v1"}})
	now = t0.Add(time.Minute)
	d.invalidate(crd("b.example.com")) // a CRD created now
	arrival := now.Add(time.Second)
	for _, tc := range []struct {
		group           string
		settled, lagged bool
	}{
		{"a.example.com", true, false},
		{"b.example.com", false, true},
		{"apps", true, false},
		{"", true, false},
	} {
		if got := d.GroupSettledBefore(tc.group, arrival); got != tc.settled {
			t.Errorf("group %q: GroupSettledBefore = %v, want %v", tc.group, got, tc.settled)
		}
		if got := d.GroupChangedSince(tc.group, arrival.Add(-10*time.Second)); got != tc.lagged {
			t.Errorf("group %q: GroupChangedSince = %v, want %v", tc.group, got, tc.lagged)
		}
	}
	d.invalidate(cache.DeletedFinalStateUnknown{Key: "widgets.c.example.com"})
	if d.GroupSettledBefore("apps", arrival) {
		t.Error("a deletion whose object is lost: apps still settled")
	}
	if d.SettledBefore(arrival) {
		t.Error("the documents as a whole are settled right after a change")
	}
	if (&ServedDocs{}).GroupSettledBefore("apps", arrival) || !(&ServedDocs{}).GroupChangedSince("apps", arrival) {
		t.Error("no change seen yet (informers not synced): a group counts as settled")
	}
}

// TestResyncIsNoChange: an informer's resync hands the handler the same
// object again; it changes nothing (apiextensions' informers resync every
// 5 minutes, and every CRD group's documents were doubted each time:
// probe AC). An update with a new resourceVersion is a change.
func TestResyncIsNoChange(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 16, 0, 0, 0, time.UTC)
	now := t0
	d := &ServedDocs{now: func() time.Time { return now }, docs: map[string]cachedDoc{}}
	h := d.changes()
	crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "widgets.stable.example.com", ResourceVersion: "242",
		CreationTimestamp: metav1.NewTime(t0.Add(-time.Hour))}, Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: "stable.example.com"}}
	h.OnAdd(crd, true)
	now = t0.Add(5 * time.Minute)
	h.OnUpdate(crd, crd.DeepCopy())
	if d.GroupChangedSince("stable.example.com", t0) || d.GroupChangedSince("other.example.com", t0) {
		t.Error("a resync counted as a change")
	}
	changed := crd.DeepCopy()
	changed.ResourceVersion = "243"
	h.OnUpdate(crd, changed)
	if !d.GroupChangedSince("stable.example.com", t0) {
		t.Error("an update with a new resourceVersion did not count as a change")
	}
}
