package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/pki"
	"github.com/kproxy/kproxy/internal/record"
)

// kubeletNS is where TestKubeletSession's pods are.
const kubeletNS = "kubelet"

// TestKubeletSession sends a kubelet's traffic through kproxy to an
// apiserver that runs the Node authorizer and NodeRestriction, as kubeadm
// configures them. No kubelet can run here, so the test plays one with
// client-go, as the kubelet does: a client certificate for
// system:node:NAME, protobuf, HTTP/2. It registers its Node, reports its
// status, renews its Lease, lists its pods, reads the secret and
// configmap its pod mounts, asks for the pod's token, reports the pod's
// status, records an event, asks for a serving certificate, creates,
// updates and deletes a mirror pod, finishes a pod's deletion; then what
// NodeRestriction refuses it (another node's pod, a reserved label, a
// mirror pod that mounts a secret); then its Node deleted and registered
// again (a new uid) and a mirror pod owned by the new Node. Every record's
// prediction must be the apiserver's answer or an honest unknown of a
// replay that ran late.
func TestKubeletSession(t *testing.T) {
	ctx := context.Background()
	c := ownCluster(t)
	admin := adminClientFor(c)
	const node = "node-k"
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kubeletNS}}, createOpts))
	must(admin.CoreV1().ServiceAccounts(kubeletNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, createOpts))
	must(admin.CoreV1().ConfigMaps(kubeletNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "app-config"}, Data: map[string]string{"k": "v"}}, createOpts))
	for _, s := range []string{"app-secret", "unrelated"} {
		must(admin.CoreV1().Secrets(kubeletNS).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: s}, StringData: map[string]string{"k": "v"}}, createOpts))
	}
	noToken := false
	pod := func(name, nodeName string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{NodeName: nodeName, AutomountServiceAccountToken: &noToken,
			Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
			Volumes: []corev1.Volume{
				{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "app-config"}}}},
				{Name: "secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "app-secret"}}},
				{Name: "token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
					{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "vault", ExpirationSeconds: new(int64(3600)), Path: "token"}}}}}},
			}}}
	}
	app, err := admin.CoreV1().Pods(kubeletNS).Create(ctx, pod("app", node), createOpts)
	must(app, err)
	must(admin.CoreV1().Pods(kubeletNS).Create(ctx, pod("elsewhere", "node-other"), createOpts))

	stream := record.NewStream()
	recs, dropped, cancel := stream.Subscribe(1 << 14)
	defer cancel()
	k := startKproxy(t, kproxyOptions{stream: stream, cluster: c})
	kubelet := kubeletClient(t, c, k, node)
	nodes, pods := kubelet.CoreV1().Nodes(), kubelet.CoreV1().Pods(kubeletNS)

	// Registration: the Node read (not there yet), created, its status
	// reported; the Lease read, created and renewed.
	if _, err := nodes.Get(ctx, node, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the kubelet's first read of its Node: %v, want NotFound", err)
	}
	n := registerNode(ctx, t, kubelet, node)
	leases := kubelet.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	if _, err := leases.Get(ctx, node, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the kubelet's first read of its Lease: %v, want NotFound", err)
	}
	dur := int32(40)
	lease, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: node,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: n.UID}}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: new(node), LeaseDurationSeconds: &dur, RenewTime: &metav1.MicroTime{Time: time.Now()}}}, createOpts)
	must(lease, err)
	for range 3 {
		lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
		lease, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
		must(lease, err)
	}

	// The pods bound to it, and what its pod mounts.
	onNode := metav1.ListOptions{FieldSelector: "spec.nodeName=" + node}
	must(kubelet.CoreV1().Pods("").List(ctx, onNode))
	w, err := kubelet.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{FieldSelector: onNode.FieldSelector, TimeoutSeconds: new(int64(1))})
	must(w, err)
	for range w.ResultChan() {
	}
	must(nodes.List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + node}))
	must(kubelet.CoreV1().Secrets(kubeletNS).Get(ctx, "app-secret", metav1.GetOptions{}))
	must(kubelet.CoreV1().ConfigMaps(kubeletNS).Get(ctx, "app-config", metav1.GetOptions{}))
	expectRefused(t, "a secret no pod of the node mounts", func() error {
		_, err := kubelet.CoreV1().Secrets(kubeletNS).Get(ctx, "unrelated", metav1.GetOptions{})
		return err
	})
	exp := int64(3600)
	must(kubelet.CoreV1().ServiceAccounts(kubeletNS).CreateToken(ctx, "default", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences: []string{"vault"}, ExpirationSeconds: &exp, BoundObjectRef: &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: "app", UID: app.UID}}}, createOpts))
	running := []byte(`{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}`)
	must(pods.Patch(ctx, "app", types.StrategicMergePatchType, running, metav1.PatchOptions{}, "status"))
	must(kubelet.CoreV1().Events(kubeletNS).Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "app."},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: kubeletNS, Name: "app", UID: app.UID}, Reason: "Started", Message: "Started container c",
		Type: corev1.EventTypeNormal, Source: corev1.EventSource{Component: "kubelet", Host: node}}, createOpts))
	must(kubelet.CertificatesV1().CertificateSigningRequests().Create(ctx, servingCSR(t, node), createOpts))

	// A static pod's mirror: created owned by the Node, its status
	// reported, deleted.
	mirror := mirrorPod("static-"+node, node, n.UID)
	must(pods.Create(ctx, mirror, createOpts))
	must(pods.Patch(ctx, mirror.Name, types.StrategicMergePatchType, running, metav1.PatchOptions{}, "status"))
	must(nil, pods.Delete(ctx, mirror.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}))

	// What NodeRestriction refuses it.
	expectRefused(t, "the status of another node's pod", func() error {
		_, err := pods.Patch(ctx, "elsewhere", types.StrategicMergePatchType, running, metav1.PatchOptions{}, "status")
		return err
	})
	expectRefused(t, "a label reserved to the cluster", func() error {
		_, err := nodes.Patch(ctx, node, types.StrategicMergePatchType, []byte(`{"metadata":{"labels":{"node-restriction.kubernetes.io/pool":"a"}}}`), metav1.PatchOptions{})
		return err
	})
	expectRefused(t, "a mirror pod that mounts a secret", func() error {
		m := mirrorPod("static-secret", node, n.UID)
		m.Spec.Volumes = []corev1.Volume{{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "app-secret"}}}}
		_, err := pods.Create(ctx, m, createOpts)
		return err
	})
	expectRefused(t, "deleting another node's pod", func() error {
		return pods.Delete(ctx, "elsewhere", metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})
	})

	// The pod deleted gracefully by its owner; the kubelet reports it
	// stopped and removes it for good (uid precondition, grace 0).
	if err := admin.CoreV1().Pods(kubeletNS).Delete(ctx, "app", metav1.DeleteOptions{GracePeriodSeconds: new(int64(30))}); err != nil {
		t.Fatal(err)
	}
	must(pods.Patch(ctx, "app", types.StrategicMergePatchType, []byte(`{"status":{"phase":"Succeeded"}}`), metav1.PatchOptions{}, "status"))
	must(nil, pods.Delete(ctx, "app", metav1.DeleteOptions{GracePeriodSeconds: new(int64(0)), Preconditions: &metav1.Preconditions{UID: &app.UID}}))

	// The Node deleted and registered again: a new uid, and a mirror pod
	// owned by the new Node.
	if err := admin.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	n2 := registerNode(ctx, t, kubelet, node)
	if n2.UID == n.UID {
		t.Fatal("the Node registered again has the same uid")
	}
	must(pods.Create(ctx, mirrorPod("static-again", node, n2.UID), createOpts))

	all := quietRecords(t, recs, dropped, 5*time.Second, 3*time.Second)
	kinds := judgeComponent(t, "kubelet", all, false)
	// A pod's delete is replayed once the apiserver may have deleted it:
	// NodeRestriction reads the pod as the request met it, not gone.
	for _, r := range all {
		if r.Request.Method == "DELETE" && r.Request.Resource == "pods" && r.Actual.Status == 200 && r.Predicted.Status != 200 {
			t.Errorf("the kubelet's delete of %s: predicted %d at %s (%s), want 200", r.Request.Name, r.Predicted.Status, r.Predicted.Stage, r.Predicted.Message)
		}
	}
	for k, want := range map[string]int{"POST nodes": 2, "PATCH nodes/status": 2, "PUT leases": 3, "POST pods": 3, "PATCH pods/status": 4, "DELETE pods": 3,
		"POST serviceaccounts/token": 1, "POST certificatesigningrequests": 1} {
		if kinds[k] < want {
			t.Errorf("%d %s recorded, want %d", kinds[k], k, want)
		}
	}
}

// kubeletClient is a client of kproxy k as node's kubelet: a certificate
// of c's CA for system:node:NAME in system:nodes, protobuf.
func kubeletClient(t *testing.T, c *localcluster.Cluster, k *kproxy, node string) kubernetes.Interface {
	t.Helper()
	cert, err := c.CA.Issue(pki.Leaf{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := pki.KeyPEM(cert.Key)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &rest.Config{Host: "https://" + k.addr, TLSClientConfig: rest.TLSClientConfig{CAData: k.caPEM, CertData: pki.CertPEM(cert.Cert), KeyData: keyPEM}}
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.UserAgent = "kubelet/v1.37.2 (linux/amd64) kubernetes/kproxy-e2e"
	cfg.QPS, cfg.Burst = 1000, 1000
	return kubernetes.NewForConfigOrDie(cfg)
}

// registerNode creates the kubelet's Node and reports it ready, as the
// kubelet's first status update does (a strategic merge patch of
// nodes/status).
func registerNode(ctx context.Context, t *testing.T, kubelet kubernetes.Interface, node string) *corev1.Node {
	t.Helper()
	_, err := kubelet.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node,
		Labels: map[string]string{"kubernetes.io/hostname": node, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}}}, createOpts)
	if err != nil {
		t.Fatal(err)
	}
	capacity := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi"), corev1.ResourcePods: resource.MustParse("110")}
	status := fmt.Sprintf(`{"status":{"capacity":%s,"allocatable":%s,"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"kubelet is posting ready status","lastHeartbeatTime":%q,"lastTransitionTime":%q}],"nodeInfo":{"kubeletVersion":"v1.37.2","operatingSystem":"linux","architecture":"amd64"}}}`,
		mustJSON(t, capacity), mustJSON(t, capacity), time.Now().UTC().Format(time.RFC3339), time.Now().UTC().Format(time.RFC3339))
	n, err := kubelet.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(status), metav1.PatchOptions{}, "status")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// mirrorPod is the mirror of a static pod on node, owned by its Node.
func mirrorPod(name, node string, uid types.UID) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "hash-" + name},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: uid, Controller: new(true)}}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
}

// servingCSR is the kubelet's request for a serving certificate.
func servingCSR(t *testing.T, node string) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}, DNSNames: []string{node}}, key)
	if err != nil {
		t.Fatal(err)
	}
	req := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	return &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{GenerateName: "csr-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{Request: req, SignerName: certificatesv1.KubeletServingSignerName,
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}}}
}

// expectRefused fails the test unless do is refused 403.
func expectRefused(t *testing.T, what string, do func() error) {
	t.Helper()
	if err := do(); !apierrors.IsForbidden(err) {
		t.Fatalf("%s: %v, want 403 Forbidden", what, err)
	}
}
