package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
)

// TestControllerSession puts the real kube-controller-manager (built by
// make tools from the same release) behind kproxy, as a cluster's
// controller manager talks to its apiserver: a client certificate for
// system:kube-controller-manager, each controller with its own service
// account's token (--use-service-account-credentials, the tokens asked
// for with TokenRequest), leader election, informers for every resource.
// A Deployment is created, scaled and deleted, a Service gets its
// EndpointSlices, and the namespace is deleted, which its controller
// empties resource by resource. Every record's prediction must be the
// apiserver's answer or an honest unknown; a confident wrong prediction
// fails the test. It runs on a cluster of its own (ownCluster).
func TestControllerSession(t *testing.T) {
	ctx := context.Background()
	c := ownCluster(t)
	cs := adminClientFor(c)
	stream := record.NewStream()
	recs, dropped, cancel := stream.Subscribe(1 << 16)
	defer cancel()
	// A queue long enough that no replay is shed in the controllers'
	// bursts: the test is about what the replay predicts.
	k := startKproxy(t, kproxyOptions{stream: stream, cluster: c, set: func(o *serve.Options) { o.ReplayQueue = 1 << 14 }})
	run := fmt.Sprintf("kcm-%d", time.Now().UnixNano()%1e6)
	kcm := startComponent(t, "kube-controller-manager", c, k, "system:kube-controller-manager",
		"--secure-port=0", "--use-service-account-credentials=true", "--leader-elect=true", "--leader-elect-resource-name=kcm-"+run,
		"--controllers=*,-nodeipam,-nodelifecycle,-persistentvolume-binder,-attachdetach,-persistentvolume-expander,-ttl,-csrsigning",
		"--concurrent-gc-syncs=5", "--v=1")

	ns := run
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, createOpts); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "web"}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: appsv1.DeploymentSpec{
		Replicas: new(int32(3)), Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}}}
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, dep, createOpts); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.ServiceSpec{Selector: labels,
		Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}}
	if _, err := cs.CoreV1().Services(ns).Create(ctx, svc, createOpts); err != nil {
		t.Fatal(err)
	}
	pods := func(n int) {
		t.Helper()
		got := -1
		err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
			l, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			got = 0
			for _, p := range l.Items {
				if p.DeletionTimestamp == nil {
					got++
				}
			}
			return got == n, nil
		})
		if err != nil {
			t.Fatalf("the controllers made %d pods, want %d: %v", got, n, err)
		}
	}
	pods(3)
	// The deployment controller writes the Deployment's status meanwhile:
	// a conflict is tried again, as kubectl scale does.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		scale, err := cs.AppsV1().Deployments(ns).GetScale(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		scale.Spec.Replicas = 1
		_, err = cs.AppsV1().Deployments(ns).UpdateScale(ctx, "web", scale, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	pods(1)
	// The namespace controller empties the namespace (a deletecollection
	// of every resource) and the garbage collector the Deployment's
	// dependents; pods without a kubelet are deleted at once only with a
	// grace period of 0, which the namespace controller does not use.
	if err := cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, p := range l.Items {
			if p.DeletionTimestamp != nil {
				_ = cs.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
			}
		}
		_, err = cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("the namespace controller did not empty and remove namespace %s: %v", ns, err)
	}
	time.Sleep(2 * time.Second)
	kcm.end()
	judgeComponent(t, "controller", quietRecords(t, recs, dropped, 10*time.Second, 5*time.Second), true)
}
