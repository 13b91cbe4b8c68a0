package kubeconfig

import (
	"bytes"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"unicode/utf8"

	"k8s.io/client-go/tools/clientcmd"
)

// kubeconfigSeeds are kubeconfigs as kubectl and kubeadm write them, and
// edge cases of the shape ThroughKproxy reads.
var kubeconfigSeeds = []string{
	`apiVersion: v1
kind: Config
current-context: prod
clusters:
- name: prod
  cluster:
    server: https://10.0.0.1:6443
    certificate-authority-data: Q0xVU1RFUi1DQQ==
    tls-server-name: api
- name: dev
  cluster:
    server: https://10.0.0.2:6443
    certificate-authority: /etc/kubernetes/pki/ca.crt
    proxy-url: http://corp-proxy:3128
contexts:
- name: prod
  context: {cluster: prod, user: me, namespace: web}
- name: dev
  context: {cluster: dev, user: exec-user}
users:
- name: me
  user:
    token: tok
    as: someone
    as-groups: [devs]
- name: exec-user
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: get-token
      args: [--cluster, dev]
      interactiveMode: Never
`,
	`apiVersion: v1
kind: Config
current-context: kind
clusters: [{name: kind, cluster: {server: "https://127.0.0.1:40000", insecure-skip-tls-verify: true}}]
contexts: [{name: kind, context: {cluster: kind, user: admin}}]
users: [{name: admin, user: {client-certificate-data: Q0VSVA==, client-key-data: S0VZ}}]
`,
	`{"apiVersion":"v1","kind":"Config","current-context":"x","contexts":[{"name":"x","context":{"cluster":"missing"}}]}`,
	`current-context: x
contexts: [{name: x, context: {cluster: c, user: nobody}}]
clusters: [{name: c, cluster: {server: "unix:///run/k.sock", extensions: [{name: e, extension: {a: b}}]}}]
`,
	"", "apiVersion: v1\nkind: Config\n", "contexts: [{name: x, context: null}]\ncurrent-context: x\n", "clusters: [{name: '', cluster: {}}]\ncontexts: [{name: '', context: {}}]\n",
}

// FuzzThroughKproxy reads arbitrary bytes as a kubeconfig, as kproxy
// kubeconfig --from does, and routes one of its contexts through kproxy.
// It checks that ThroughKproxy never panics and never changes its input;
// that what it returns holds only that context, its user unchanged, and
// its cluster pointed at kproxy (reverse: kproxy's address and CA only;
// forward: kproxy as the proxy, both CAs trusted); and that the result
// survives being written and read again.
func FuzzThroughKproxy(f *testing.F) {
	for _, s := range kubeconfigSeeds {
		for _, mode := range []string{"reverse", "forward"} {
			f.Add([]byte(s), "", "https://127.0.0.1:8443", mode)
		}
	}
	f.Add([]byte(kubeconfigSeeds[0]), "dev", "https://[::1]:8443/path?q", "forward")
	f.Add([]byte(kubeconfigSeeds[0]), "nope", "not a url", "sideways")
	f.Fuzz(func(t *testing.T, raw []byte, context, server, mode string) {
		if !utf8.ValidString(context) || !utf8.ValidString(server) {
			t.Skip("flags are text")
		}
		in, err := clientcmd.Load(raw)
		if err != nil {
			return
		}
		// A CA file is read in forward mode: point every one at a file of
		// the test's (never at a path from the input).
		caFile := filepath.Join(t.TempDir(), "ca.crt")
		if err := os.WriteFile(caFile, []byte("FILE-CA"), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, c := range in.Clusters {
			if c != nil && c.CertificateAuthority != "" {
				c.CertificateAuthority = caFile
			}
		}
		before := in.DeepCopy()
		kproxyCA := []byte("KPROXY-CA")
		out, err := ThroughKproxy(in, Options{Context: context, Server: server, Mode: mode, KproxyCA: kproxyCA})
		if !reflect.DeepEqual(in, before) {
			t.Fatalf("ThroughKproxy changed its input")
		}
		if err != nil {
			return
		}
		name := context
		if name == "" {
			name = in.CurrentContext
		}
		ctx := in.Contexts[name]
		host := mustHost(t, server)
		if len(out.Contexts) != 1 || out.CurrentContext != name || !reflect.DeepEqual(out.Contexts[name], ctx) {
			t.Fatalf("the result does not hold exactly context %q, unchanged: %+v", name, out.Contexts)
		}
		if len(out.AuthInfos) > 1 || !reflect.DeepEqual(out.AuthInfos[ctx.AuthInfo], in.AuthInfos[ctx.AuthInfo]) {
			t.Fatalf("the result's user differs from %q's: %+v", ctx.AuthInfo, out.AuthInfos)
		}
		c, orig := out.Clusters[ctx.Cluster], in.Clusters[ctx.Cluster]
		if len(out.Clusters) != 1 || c == nil {
			t.Fatalf("the result does not hold exactly cluster %q: %+v", ctx.Cluster, out.Clusters)
		}
		switch mode {
		case "reverse", "":
			if c.Server != "https://"+host || !bytes.Equal(c.CertificateAuthorityData, kproxyCA) || c.CertificateAuthority != "" ||
				c.InsecureSkipTLSVerify || c.TLSServerName != "" || c.ProxyURL != "" {
				t.Fatalf("reverse mode: cluster %+v does not go to kproxy at %s trusting only its CA", c, host)
			}
		case "forward":
			ca := orig.CertificateAuthorityData
			if len(ca) == 0 && orig.CertificateAuthority != "" {
				ca = []byte("FILE-CA")
			}
			if c.Server != orig.Server || c.ProxyURL != "http://"+host || c.CertificateAuthority != "" ||
				!bytes.HasSuffix(c.CertificateAuthorityData, kproxyCA) || !bytes.Contains(c.CertificateAuthorityData, bytes.TrimSpace(ca)) {
				t.Fatalf("forward mode: cluster %+v does not go through kproxy at %s trusting both CAs", c, host)
			}
		default:
			t.Fatalf("mode %q accepted", mode)
		}
		written, err := clientcmd.Write(*out)
		if err != nil {
			t.Fatalf("the result does not write: %v", err)
		}
		again, err := clientcmd.Load(written)
		if err != nil {
			t.Fatalf("the result does not read back: %v\n%s", err, written)
		}
		rewritten, err := clientcmd.Write(*again)
		if err != nil || !bytes.Equal(written, rewritten) {
			t.Fatalf("the result reads back as another kubeconfig (%v):\n%s\nthen\n%s", err, written, rewritten)
		}
		if a := again.Clusters[ctx.Cluster]; a == nil || a.Server != c.Server || a.ProxyURL != c.ProxyURL || again.CurrentContext != name {
			t.Fatalf("the result reads back routed elsewhere:\n%s", written)
		}
	})
}

func mustHost(t *testing.T, server string) string {
	t.Helper()
	u, err := url.Parse(server)
	if err != nil || u.Host == "" {
		t.Fatalf("ThroughKproxy accepted --server=%q", server)
	}
	return u.Host
}
