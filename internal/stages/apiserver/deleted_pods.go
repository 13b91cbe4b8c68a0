package apiserver

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core"
	corev1informers "k8s.io/client-go/informers/core/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// A kubelet ends each pod it ran with a delete of it (grace period 0),
// which NodeRestriction allows only for a pod bound to that node: it reads
// the pod from its informer. In the apiserver the pod is there, the delete
// not yet done. The replay of a write runs as it arrives, but the replay's
// admission is reached after the apiserver may have deleted the pod and
// kproxy's informer seen it go: NodeRestriction then finds no pod, and
// the replay refused with 404 a delete that succeeded. An eviction reads
// its pod the same way.
//
// So the admission plugins' pod lister also keeps, for a minute, the pods
// its informer saw deleted, as they were last seen, and gives one back
// only while every replay in flight naming that pod (a delete or an
// eviction of it) arrived before the informer saw it go: for such a
// replay the pod was there when its request arrived, or was deleted
// while the request was on its way, which the apiserver's informer, no
// faster than kproxy's, cannot have seen either.

// goneHorizon is how long a deleted pod is kept: longer than a replay
// runs after its request arrived.
const goneHorizon = time.Minute

// deletedPods are the pods the informer saw deleted, and the replays in
// flight that name a pod.
type deletedPods struct {
	clock clock.PassiveClock
	mu    sync.Mutex
	gone  map[string]gonePod
	// naming counts, per pod, the replays in flight that name it, by
	// the time their request arrived.
	naming map[string]map[time.Time]int
	sweep  time.Time
	// marked is when the informer first saw each pod marked for
	// deletion (markedBefore).
	marked map[string]seenMark
}

type seenMark struct {
	uid types.UID
	at  time.Time
}

type gonePod struct {
	pod    *corev1.Pod
	seenAt time.Time
}

func podKey(namespace, name string) string { return namespace + "/" + name }

// watch keeps the pods informer's deletions from now on. It adds a
// handler only: the informer is one the plugins asked for.
func (d *deletedPods) watch(inf cache.SharedIndexInformer) {
	seen := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.DeletionTimestamp == nil {
			return
		}
		k := podKey(p.Namespace, p.Name)
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.marked == nil {
			d.marked = map[string]seenMark{}
		}
		if m, ok := d.marked[k]; !ok || m.uid != p.UID {
			d.marked[k] = seenMark{uid: p.UID, at: d.clock.Now()}
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(_, obj any) { seen(obj) }, DeleteFunc: func(obj any) {
		if u, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = u.Obj
		}
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		now := d.clock.Now()
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.gone == nil {
			d.gone = map[string]gonePod{}
		}
		d.gone[podKey(p.Namespace, p.Name)] = gonePod{pod: p, seenAt: now}
		delete(d.marked, podKey(p.Namespace, p.Name))
		if now.Sub(d.sweep) > goneHorizon {
			for k, g := range d.gone {
				if now.Sub(g.seenAt) > goneHorizon {
					delete(d.gone, k)
				}
			}
			d.sweep = now
		}
	}})
}

// name registers a replay in flight naming a pod, from its request's
// arrival; the returned func ends it.
func (d *deletedPods) name(namespace, name string, arrival time.Time) func() {
	if d == nil || name == "" || arrival.IsZero() {
		return func() {}
	}
	k := podKey(namespace, name)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.naming == nil {
		d.naming = map[string]map[time.Time]int{}
	}
	if d.naming[k] == nil {
		d.naming[k] = map[time.Time]int{}
	}
	d.naming[k][arrival]++
	return func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.naming[k][arrival]--; d.naming[k][arrival] == 0 {
			delete(d.naming[k], arrival)
		}
		if len(d.naming[k]) == 0 {
			delete(d.naming, k)
		}
	}
}

// before is the pod namespace/name as last seen, when the informer saw it
// deleted after every replay in flight naming it arrived.
func (d *deletedPods) before(namespace, name string) (*corev1.Pod, bool) {
	if d == nil {
		return nil, false
	}
	k := podKey(namespace, name)
	d.mu.Lock()
	defer d.mu.Unlock()
	g, ok := d.gone[k]
	if !ok || len(d.naming[k]) == 0 {
		return nil, false
	}
	for arrival := range d.naming[k] {
		if !arrival.Before(g.seenAt) {
			return nil, false
		}
	}
	return g.pod, true
}

// markedBefore reports whether the informer saw the pod (this uid)
// marked for deletion before t: then whatever marked it came before a
// request that arrived at t, which met the pod being deleted (an
// eviction of it skips its disruption budget). The mark's own time, in
// seconds, cannot say so within a second or two of the arrival (found by
// a probe: an eviction 240 ms after an earlier one's 201, said unknown).
func (d *deletedPods) markedBefore(namespace, name string, uid types.UID, t time.Time) bool {
	if d == nil || t.IsZero() {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	m, ok := d.marked[podKey(namespace, name)]
	return ok && m.uid == uid && m.at.Before(t)
}

// namesPod is the pod a request's replay reads as the request met it: a
// delete's or an eviction's.
func namesPod(r *Run, name string) bool {
	return r.Resource == "pods" && name != "" &&
		(r.Verb == "delete" && r.Subresource == "" || r.Verb == "create" && r.Subresource == "eviction")
}

// withDeletedPods is f for the admission plugins: its pods lister falls
// back on d.
func withDeletedPods(f informers.SharedInformerFactory, d *deletedPods) informers.SharedInformerFactory {
	return deletedPodsFactory{SharedInformerFactory: f, d: d}
}

type deletedPodsFactory struct {
	informers.SharedInformerFactory
	d *deletedPods
}

func (f deletedPodsFactory) Core() coreinformers.Interface {
	return deletedPodsCore{Interface: f.SharedInformerFactory.Core(), d: f.d}
}

type deletedPodsCore struct {
	coreinformers.Interface
	d *deletedPods
}

func (c deletedPodsCore) V1() corev1informers.Interface {
	return deletedPodsV1{Interface: c.Interface.V1(), d: c.d}
}

type deletedPodsV1 struct {
	corev1informers.Interface
	d *deletedPods
}

func (v deletedPodsV1) Pods() corev1informers.TypedPodInformer {
	return deletedPodsInformer{TypedPodInformer: v.Interface.Pods(), d: v.d}
}

type deletedPodsInformer struct {
	corev1informers.TypedPodInformer
	d *deletedPods
}

func (i deletedPodsInformer) Lister() corev1listers.PodLister {
	return deletedPodsLister{PodLister: i.TypedPodInformer.Lister(), d: i.d}
}

type deletedPodsLister struct {
	corev1listers.PodLister
	d *deletedPods
}

func (l deletedPodsLister) Pods(namespace string) corev1listers.PodNamespaceLister {
	return deletedPodsNamespaceLister{PodNamespaceLister: l.PodLister.Pods(namespace), namespace: namespace, d: l.d}
}

type deletedPodsNamespaceLister struct {
	corev1listers.PodNamespaceLister
	namespace string
	d         *deletedPods
}

func (l deletedPodsNamespaceLister) Get(name string) (*corev1.Pod, error) {
	p, err := l.PodNamespaceLister.Get(name)
	if apierrors.IsNotFound(err) {
		if gone, ok := l.d.before(l.namespace, name); ok {
			return gone, nil
		}
	}
	return p, err
}
