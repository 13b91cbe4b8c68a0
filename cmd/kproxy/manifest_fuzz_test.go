package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// kubeadmManifest is a kube-apiserver static-pod manifest as kubeadm
// writes it (/etc/kubernetes/manifests/kube-apiserver.yaml).
const kubeadmManifest = `apiVersion: v1
kind: Pod
metadata:
  annotations:
    kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint: 10.0.0.1:6443
  labels: {component: kube-apiserver, tier: control-plane}
  name: kube-apiserver
  namespace: kube-system
spec:
  containers:
  - command:
    - kube-apiserver
    - --advertise-address=10.0.0.1
    - --allow-privileged=true
    - --authorization-mode=Node,RBAC
    - --client-ca-file=/etc/kubernetes/pki/ca.crt
    - --enable-admission-plugins=NodeRestriction
    - --enable-bootstrap-token-auth=true
    - --etcd-cafile=/etc/kubernetes/pki/etcd/ca.crt
    - --etcd-certfile=/etc/kubernetes/pki/apiserver-etcd-client.crt
    - --etcd-keyfile=/etc/kubernetes/pki/apiserver-etcd-client.key
    - --etcd-servers=https://127.0.0.1:2379
    - --kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname
    - --requestheader-allowed-names=front-proxy-client
    - --requestheader-client-ca-file=/etc/kubernetes/pki/front-proxy-ca.crt
    - --requestheader-extra-headers-prefix=X-Remote-Extra-
    - --requestheader-group-headers=X-Remote-Group
    - --requestheader-username-headers=X-Remote-User
    - --secure-port=6443
    - --service-account-issuer=https://kubernetes.default.svc.cluster.local
    - --service-account-key-file=/etc/kubernetes/pki/sa.pub
    - --service-account-signing-key-file=/etc/kubernetes/pki/sa.key
    - --service-cluster-ip-range=10.96.0.0/12
    - --tls-cert-file=/etc/kubernetes/pki/apiserver.crt
    image: registry.k8s.io/kube-apiserver:v1.37.2
    name: kube-apiserver
  hostNetwork: true
  priorityClassName: system-node-critical
status: {}
`

// manifestSeeds are kubeadm's manifest and the variations kproxy reads:
// flags in args, values as the next argument, a sidecar, one unnamed
// container, none.
var manifestSeeds = []string{
	kubeadmManifest,
	`{"apiVersion":"v1","kind":"Pod","spec":{"containers":[{"name":"sidecar","command":["sleep"]},{"name":"kube-apiserver","command":["kube-apiserver"],"args":["--authorization-mode","RBAC","--anonymous-auth","--token-auth-file=/t.csv","--etcd-servers","http://a:2379,http://b:2379","--max-requests-inflight=abc"]}]}}`,
	"spec:\n  containers:\n  - name: apiserver\n    args: [--service-node-port-range=30000-32767, --runtime-config=api/all=true, --enable-priority-and-fairness=false, --kubelet-port]\n",
	"spec:\n  containers:\n  - name: a\n  - name: b\n", "spec: {containers: []}\n", "kind: Pod\nspec: null\n", "", "- not a pod\n",
	"spec:\n  containers:\n  - name: kube-apiserver\n    command: [--feature-gates=AllAlpha=true, --, --=x, ---x, --authorization-mode=]\n",
}

// FuzzManifestArgs reads arbitrary bytes as the apiserver's static-pod
// manifest (--apiserver-manifest) and the command line in it as kproxy
// does. It checks that neither panics; that the command line is the
// kube-apiserver container's (or the only container's); that every flag
// kproxy does not mirror is reported as ignored and no mirrored one is;
// and that a flag given to kproxy itself wins over the manifest's.
func FuzzManifestArgs(f *testing.F) {
	for _, s := range manifestSeeds {
		f.Add([]byte(s))
	}
	// The mirrored flags: what AddFlags and AddReplayFlags add.
	mirrored := pflag.NewFlagSet("mirrored", pflag.ContinueOnError)
	mo := apiserver.NewOptions()
	mo.AddFlags(mirrored)
	mo.AddReplayFlags(mirrored)
	f.Fuzz(func(t *testing.T, manifest []byte) {
		path := filepath.Join(t.TempDir(), "kube-apiserver.yaml")
		if err := os.WriteFile(path, manifest, 0o600); err != nil {
			t.Fatal(err)
		}
		args, err := manifestArgs(path)
		if err != nil {
			if !strings.Contains(err.Error(), "--apiserver-manifest") {
				t.Fatalf("the error does not name the flag: %v", err)
			}
			return
		}
		var pod corev1.Pod
		if err := yaml.Unmarshal(manifest, &pod); err != nil {
			t.Fatalf("manifestArgs read a manifest that is not a Pod: %v", err)
		}
		i := slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == "kube-apiserver" })
		if len(pod.Spec.Containers) == 1 {
			i = 0
		}
		if i < 0 {
			t.Fatalf("manifestArgs read %q from a Pod without a kube-apiserver container", args)
		}
		if want := append(slices.Clone(pod.Spec.Containers[i].Command), pod.Spec.Containers[i].Args...); !slices.Equal(args, want) {
			t.Fatalf("manifestArgs read %q, the container runs %q", args, want)
		}

		// --feature-gates sets the process's feature gates: leave them be.
		args = slices.DeleteFunc(args, func(a string) bool { return strings.HasPrefix(a, "--feature-gates") })
		o := apiserver.NewOptions()
		fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
		o.AddFlags(fs)
		o.AddReplayFlags(fs)
		apiserver.AddOtherAPIServerFlags(fs)
		if err := fs.Parse([]string{"--authorization-mode=AlwaysAllow"}); err != nil {
			t.Fatal(err)
		}
		ignored, err := o.ParseAPIServerArgs(fs, args)
		if err != nil && !strings.HasPrefix(err.Error(), "apiserver flag --") {
			t.Fatalf("the error does not name the flag: %v", err)
		}
		for _, name := range ignored {
			if !slices.Contains(args, name) && !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, name+"=") }) {
				t.Fatalf("%s is reported as ignored; the manifest has %q", name, args)
			}
			if mirrored.Lookup(strings.TrimPrefix(name, "--")) != nil {
				t.Fatalf("the mirrored flag %s is reported as ignored", name)
			}
		}
		if got := o.Authorization.Modes; !slices.Equal(got, []string{"AlwaysAllow"}) {
			t.Fatalf("--authorization-mode given to kproxy is %q after reading the manifest %q", got, args)
		}
	})
}
