package apiserver

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestDeletedPods: the admission plugins' pod lister gives back a pod its
// informer saw deleted only while every replay in flight naming it
// arrived before the deletion was seen.
func TestDeletedPods(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	f := informers.NewSharedInformerFactory(fake.NewClientset(), 0)
	d := &deletedPods{clock: clk}
	inf := f.Core().V1().Pods().Informer()
	d.watch(inf)
	lister := withDeletedPods(f, d).Core().V1().Pods().Lister().Pods("ns")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "ns"}, Spec: corev1.PodSpec{NodeName: "node-a"}}
	if err := inf.GetIndexer().Add(pod); err != nil {
		t.Fatal(err)
	}
	if p, err := lister.Get("app"); err != nil || p.Spec.NodeName != "node-a" {
		t.Fatalf("a pod the informer holds: %v, %v", p, err)
	}

	early := clk.Now()
	endEarly := d.name("ns", "app", early) // the kubelet's delete
	clk.Step(time.Second)
	_ = inf.GetIndexer().Delete(pod)
	// The informer's handlers are not run by the indexer: play the delete.
	deleteHandler(t, d, cache.DeletedFinalStateUnknown{Key: "ns/app", Obj: pod})
	clk.Step(time.Second)

	if p, err := lister.Get("app"); err != nil || p.Spec.NodeName != "node-a" {
		t.Errorf("a replay of a request that arrived before the deletion: %v, %v, want the pod as last seen", p, err)
	}
	endLate := d.name("ns", "app", clk.Now()) // a request after the deletion
	if _, err := lister.Get("app"); !apierrors.IsNotFound(err) {
		t.Errorf("with a replay in flight that arrived after the deletion: %v, want NotFound", err)
	}
	endLate()
	endEarly()
	if _, err := lister.Get("app"); !apierrors.IsNotFound(err) {
		t.Errorf("no replay in flight naming the pod: %v, want NotFound", err)
	}
	if _, err := lister.Get("other"); !apierrors.IsNotFound(err) {
		t.Errorf("a pod never seen: %v, want NotFound", err)
	}
	if len(d.naming) != 0 {
		t.Errorf("replays in flight left behind: %v", d.naming)
	}
	var none *deletedPods
	none.name("ns", "app", early)()
	if _, ok := none.before("ns", "app"); ok {
		t.Error("no NodeRestriction: a deleted pod given back")
	}
}

// deleteHandler runs d's informer delete handler on obj, as the informer
// would.
func deleteHandler(t *testing.T, d *deletedPods, obj any) {
	t.Helper()
	inf := &recordingInformer{}
	d.watch(inf)
	inf.handler.OnDelete(obj)
}

type recordingInformer struct {
	cache.SharedIndexInformer
	handler cache.ResourceEventHandler
}

func (r *recordingInformer) AddEventHandler(h cache.ResourceEventHandler) (cache.ResourceEventHandlerRegistration, error) {
	r.handler = h
	return nil, nil
}
