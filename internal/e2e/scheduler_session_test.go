package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/kproxy/kproxy/internal/record"
)

// schedNS is where TestSchedulerSession's pods are.
const schedNS = "sched"

// TestSchedulerSession puts the real kube-scheduler (built from the same
// Kubernetes release) behind kproxy, as a cluster's scheduler would talk
// to its apiserver: a client certificate for system:kube-scheduler,
// protobuf, HTTP/2, leader election on a Lease, informers (lists and
// watches), bindings, events and status patches for a pod that fits
// nowhere. Every record's prediction must be the apiserver's answer or an
// honest unknown; a confident wrong prediction fails the test. The
// scheduler and its nodes run on a cluster of their own.
func TestSchedulerSession(t *testing.T) {
	ctx := context.Background()
	c := ownCluster(t)
	cs := adminClientFor(c)
	run := fmt.Sprintf("sched-%d", time.Now().UnixNano()%1e6)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: schedNS}}, createOpts); err != nil {
		t.Fatal(err)
	}
	// No controller manager here makes the namespace's ServiceAccount.
	if _, err := cs.CoreV1().ServiceAccounts(schedNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, createOpts); err != nil {
		t.Fatal(err)
	}
	// Nodes for the pods to land on (no kubelet runs here: the Nodes are
	// objects, as the scheduler sees them).
	for i := range 2 {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-node-%d", run, i), Labels: map[string]string{"kubernetes.io/hostname": fmt.Sprintf("%s-node-%d", run, i)}}}
		n, err := cs.CoreV1().Nodes().Create(ctx, n, createOpts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{}) })
		n.Status = corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
			Capacity:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("110")},
		}
		n.Status.Allocatable = n.Status.Capacity
		if n, err = cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The apiserver taints a new Node not-ready (TaintNodesByCondition);
		// the node lifecycle controller, which would lift it, is not here.
		n.Spec.Taints = nil
		if _, err := cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	stream := record.NewStream()
	recs, dropped, cancel := stream.Subscribe(1 << 14)
	defer cancel()
	k := startKproxy(t, kproxyOptions{stream: stream, cluster: c})
	sched := startComponent(t, "kube-scheduler", c, k, "system:kube-scheduler",
		"--secure-port=0", "--leader-elect=true", "--leader-elect-resource-name=kube-scheduler-"+run, "--v=1")

	// Pods: six that fit, one that fits nowhere (the scheduler patches
	// its status and records an event), one bound by name already.
	pod := func(name string, mod func(*corev1.Pod)) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}}}}}
		if mod != nil {
			mod(p)
		}
		if _, err := cs.CoreV1().Pods(schedNS).Create(ctx, p, createOpts); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cs.CoreV1().Pods(schedNS).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		})
	}
	for i := range 6 {
		pod(fmt.Sprintf("%s-%d", run, i), nil)
	}
	pod(run+"-nowhere", func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"kproxy.dev/nowhere": "true"} })
	cpu := func(q string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse(q)
		}
	}
	// Fill both nodes (1 CPU each; the six take 300m of each), then a pod
	// of a higher priority that fits only if a filler goes: the scheduler
	// preempts (marks the victim DisruptionTarget with an apply patch of
	// its status, deletes it) and nominates the node. No kubelet ends the
	// victim, so the preemptor stays nominated, not bound.
	waitBound(t, cs, run, 6)
	pod(run+"-filler-0", cpu("700m"))
	pod(run+"-filler-1", cpu("700m"))
	waitBound(t, cs, run, 8)
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: run + "-high"}, Value: 1000}
	if _, err := cs.SchedulingV1().PriorityClasses().Create(ctx, pc, createOpts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.SchedulingV1().PriorityClasses().Delete(context.Background(), pc.Name, metav1.DeleteOptions{})
	})
	pod(run+"-urgent", func(p *corev1.Pod) { cpu("500m")(p); p.Spec.PriorityClassName = pc.Name })
	bound := 0
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := cs.CoreV1().Pods(schedNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		bound = 0
		unschedulable, nominated := false, false
		for _, p := range pods.Items {
			if !strings.HasPrefix(p.Name, run) {
				continue
			}
			if p.Spec.NodeName != "" {
				bound++
			}
			nominated = nominated || p.Name == run+"-urgent" && p.Status.NominatedNodeName != ""
			for _, c := range p.Status.Conditions {
				if p.Name == run+"-nowhere" && c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
					unschedulable = true
				}
			}
		}
		return bound == 8 && unschedulable && nominated, nil
	})
	if err != nil {
		t.Fatalf("the scheduler bound %d of 8 pods (and marked one unschedulable, nominated a node for the urgent one?): %v", bound, err)
	}
	time.Sleep(2 * time.Second) // a lease renewal or two
	sched.end()
	kinds := judgeComponent(t, "scheduler", quietRecords(t, recs, dropped, 5*time.Second, 3*time.Second), false)
	for k, want := range map[string]int{"POST pods/binding": 8, "DELETE pods": 1} {
		if kinds[k] < want {
			t.Errorf("%d %s recorded, want %d", kinds[k], k, want)
		}
	}
}

// waitBound waits for n pods named run-* to be bound to a node.
func waitBound(t *testing.T, cs kubernetes.Interface, run string, n int) {
	t.Helper()
	bound := 0
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := cs.CoreV1().Pods(schedNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		bound = 0
		for _, p := range pods.Items {
			if strings.HasPrefix(p.Name, run) && p.Spec.NodeName != "" {
				bound++
			}
		}
		return bound >= n, nil
	})
	if err != nil {
		t.Fatalf("the scheduler bound %d of %d pods: %v", bound, n, err)
	}
}
