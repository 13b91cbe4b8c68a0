package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/pki"
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
	bin, err := localcluster.Binary(os.Getenv("KPROXY_BIN_DIR"), "kube-scheduler")
	if err != nil {
		t.Fatal(err) // make tools builds it
	}
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
	dir := t.TempDir()
	cert, err := c.CA.Issue(pki.Leaf{CommonName: "system:kube-scheduler", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := pki.KeyPEM(cert.Key)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "scheduler.kubeconfig")
	if err := localcluster.WriteCertKubeconfig(kubeconfig, "https://"+k.addr, k.caPEM, pki.CertPEM(cert.Cert), keyPEM); err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	cmd := exec.CommandContext(sctx, bin, "--kubeconfig="+kubeconfig, "--authentication-kubeconfig="+kubeconfig, "--authorization-kubeconfig="+kubeconfig,
		"--secure-port=0", "--leader-elect=true", "--leader-elect-resource-name=kube-scheduler-"+run, "--v=3")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("kube-scheduler's log:\n%s", lastLines(logs.String(), 400))
		}
	}()

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
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
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
	stop()
	_ = cmd.Wait()

	var all []*record.Record
	quiet := time.NewTimer(5 * time.Second)
	for done := false; !done; {
		select {
		case r := <-recs:
			all = append(all, r)
			quiet.Reset(3 * time.Second)
		case <-quiet.C:
			done = true
		}
	}
	if n := dropped(); n > 0 {
		t.Fatalf("%d records dropped", n)
	}
	kinds := map[string]int{}
	for _, r := range all {
		kinds[r.Request.Method+" "+resourceOf(r.Request.Path)]++
	}
	var seen []string
	for k, n := range kinds {
		seen = append(seen, fmt.Sprintf("%4d  %s", n, k))
	}
	sort.Strings(seen)
	res := judgeSession(all)
	t.Logf("scheduler session: %d records: %d agree, %d unknown, %d confidently wrong (agreement %.0f%%)\nrequests:\n%s",
		len(all), res.match, res.unknown, res.wrong, 100*float64(res.match)/float64(max(1, len(all))), strings.Join(seen, "\n"))
	for why, n := range res.unknowns {
		t.Errorf("%d records unknown: %s", n, why)
	}
	for _, w := range res.wrongs {
		t.Errorf("confidently wrong: %s", w)
	}
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

// resourceOf names a request path's resource (and subresource), without
// namespace or name: /api/v1/namespaces/x/pods/y/binding is pods/binding.
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) > 0 && parts[0] == "api":
		parts = parts[min(2, len(parts)):]
	case len(parts) > 0 && parts[0] == "apis":
		parts = parts[min(3, len(parts)):]
	default:
		return path
	}
	if len(parts) >= 2 && parts[0] == "namespaces" && len(parts) > 2 {
		parts = parts[2:]
	}
	switch len(parts) {
	case 0:
		return path
	case 1, 2:
		return parts[0]
	}
	return parts[0] + "/" + parts[2]
}

// ownCluster starts a cluster for one test, kproxy's identity granted:
// the controllers a test runs there change cluster-wide state (aggregated
// ClusterRoles, every namespace's ServiceAccount and root CA ConfigMap,
// Nodes) that other tests must not see, and the shared cluster's broken
// APIService fixture would keep a namespace from being deleted.
func ownCluster(t *testing.T) *localcluster.Cluster {
	t.Helper()
	ctx := context.Background()
	c, err := localcluster.Start(ctx, localcluster.Options{Log: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	if err := localcluster.GrantKproxy(ctx, adminClientFor(c), "kproxy"); err != nil {
		t.Fatal(err)
	}
	return c
}
