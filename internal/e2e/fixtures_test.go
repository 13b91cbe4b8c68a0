package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	jose "gopkg.in/go-jose/go-jose.v2"
	"gopkg.in/go-jose/go-jose.v2/jwt"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/pki"
)

// corpusNS holds the conformance corpus's objects.
const corpusNS = "corpus"

// fixtures is the cluster state the auth corpus runs against: RBAC of
// every shape, service accounts and their tokens, bootstrap tokens, a
// node with a pod, and certificates.
type fixtures struct {
	tokens map[string]string           // "sa:ns/name", "bootstrap:valid", ...
	certs  map[string]*tls.Certificate // "cert:dave", ...
}

func rule(groups, resources, verbs []string, names ...string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{APIGroups: groups, Resources: resources, Verbs: verbs, ResourceNames: names}
}

func s(v ...string) []string { return v }

func subject(kind, name string) rbacv1.Subject {
	switch kind {
	case rbacv1.ServiceAccountKind:
		ns, n, _ := strings.Cut(name, "/")
		return rbacv1.Subject{Kind: kind, Namespace: ns, Name: n}
	}
	return rbacv1.Subject{Kind: kind, APIGroup: rbacv1.GroupName, Name: name}
}

// setupFixtures builds the fixtures once per test binary: the tokens it
// mints (legacy service-account tokens included) must match the objects
// it created the first time.
func setupFixtures(t *testing.T) *fixtures {
	t.Helper()
	fixtureCache.Lock()
	defer fixtureCache.Unlock()
	if fixtureCache.f == nil {
		fixtureCache.f = buildFixtures(t)
	}
	return fixtureCache.f
}

var fixtureCache struct {
	sync.Mutex
	f *fixtures
}

func buildFixtures(t *testing.T) *fixtures {
	t.Helper()
	ctx := context.Background()
	cs := adminClient()
	must := func(err error) {
		t.Helper()
		if err != nil && !strings.Contains(err.Error(), "already exists") {
			t.Fatal(err)
		}
	}
	_, err := cs.CoreV1().Namespaces().Create(ctx, namespace(corpusNS), createOpts)
	must(err)
	must(localcluster.EnsureDefaultServiceAccount(ctx, cs, corpusNS))
	for _, sa := range []string{"builder", "ghost", "podbound"} {
		_, err := cs.CoreV1().ServiceAccounts(corpusNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, createOpts)
		must(err)
	}
	_, err = cs.CoreV1().ServiceAccounts("kube-system").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "sysbot"}}, createOpts)
	must(err)
	must(localcluster.EnsureDefaultServiceAccount(ctx, cs, "kube-system"))

	roles := []any{
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "pod-reader", Namespace: corpusNS},
			Rules: []rbacv1.PolicyRule{rule(s(""), s("pods"), s("get", "list", "watch"))}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "alice-pod-reader", Namespace: corpusNS},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pod-reader"}, Subjects: []rbacv1.Subject{subject(rbacv1.UserKind, "alice")}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "oidc-pod-reader", Namespace: corpusNS},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pod-reader"}, Subjects: []rbacv1.Subject{subject(rbacv1.GroupKind, "oidc:devs")}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "corpus-cm-editor"},
			Rules: []rbacv1.PolicyRule{rule(s(""), s("configmaps"), s("*"))}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "qa-cm-editor", Namespace: corpusNS},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "corpus-cm-editor"}, Subjects: []rbacv1.Subject{subject(rbacv1.GroupKind, "qa")}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "one-secret", Namespace: corpusNS},
			Rules: []rbacv1.PolicyRule{rule(s(""), s("secrets"), s("get"), "s1")}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "carol-one-secret", Namespace: corpusNS},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "one-secret"}, Subjects: []rbacv1.Subject{subject(rbacv1.UserKind, "carol")}},
		// carol may get, not create, pods/exec, attach and portforward: a
		// WebSocket upgrade (a GET) passes the filter, and the pods
		// registry asks again for create.
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "connect-get", Namespace: corpusNS},
			Rules: []rbacv1.PolicyRule{rule(s(""), s("pods/exec", "pods/attach", "pods/portforward"), s("get"))}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "carol-connect-get", Namespace: corpusNS},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "connect-get"}, Subjects: []rbacv1.Subject{subject(rbacv1.UserKind, "carol")}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "corpus-log-reader"},
			Rules: []rbacv1.PolicyRule{rule(s(""), s("pods/log"), s("get")), rule(s(""), s("*/status"), s("get"))}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "ops-log-reader"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "corpus-log-reader"}, Subjects: []rbacv1.Subject{subject(rbacv1.GroupKind, "ops")}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "corpus-metrics"},
			Rules: []rbacv1.PolicyRule{{NonResourceURLs: s("/metrics", "/debug/*"), Verbs: s("get")}}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "carol-metrics"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "corpus-metrics"}, Subjects: []rbacv1.Subject{subject(rbacv1.UserKind, "carol")}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "corpus-apps-all"},
			Rules: []rbacv1.PolicyRule{rule(s("apps"), s("*"), s("*"))}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "builder-apps", Namespace: corpusNS},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "corpus-apps-all"}, Subjects: []rbacv1.Subject{subject(rbacv1.ServiceAccountKind, corpusNS+"/builder")}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "dangling", Namespace: corpusNS},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "does-not-exist"}, Subjects: []rbacv1.Subject{subject(rbacv1.UserKind, "dave")}},
		// Impersonation, classic: dave may impersonate erin, group devs,
		// a uid, one extra, and the builder service account.
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "corpus-impersonator"},
			Rules: []rbacv1.PolicyRule{
				rule(s(""), s("users"), s("impersonate"), "erin"),
				rule(s(""), s("groups"), s("impersonate"), "devs"),
				rule(s(""), s("serviceaccounts"), s("impersonate"), "builder"),
				rule(s("authentication.k8s.io"), s("uids"), s("impersonate"), "uid-erin"),
				rule(s("authentication.k8s.io"), s("userextras/scopes"), s("impersonate"), "view"),
			}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "dave-impersonator"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "corpus-impersonator"}, Subjects: []rbacv1.Subject{subject(rbacv1.UserKind, "dave")}},
		// Constrained impersonation: gina may impersonate frank, but only
		// to list configmaps.
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "corpus-constrained"},
			Rules: []rbacv1.PolicyRule{
				rule(s("authentication.k8s.io"), s("users"), s("impersonate:user-info"), "frank"),
				rule(s(""), s("configmaps"), s("impersonate-on:user-info:list")),
			}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "gina-constrained"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "corpus-constrained"}, Subjects: []rbacv1.Subject{subject(rbacv1.UserKind, "gina")}},
		// An aggregated ClusterRole: its rules are filled by the
		// clusterrole-aggregation controller (kube-controller-manager),
		// which does not run here, so it grants nothing, in the apiserver
		// and in the replay alike.
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "corpus-aggregated"},
			AggregationRule: &rbacv1.AggregationRule{ClusterRoleSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{"kproxy.test/aggregate-to-corpus": "true"}}}}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "corpus-aggregated-part", Labels: map[string]string{"kproxy.test/aggregate-to-corpus": "true"}},
			Rules: []rbacv1.PolicyRule{rule(s(""), s("configmaps"), s("get"))}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "henry-aggregated"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "corpus-aggregated"}, Subjects: []rbacv1.Subject{subject(rbacv1.UserKind, "henry")}},
		// erin can read configmaps, so impersonating her shows in results.
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "erin-cm", Namespace: corpusNS},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "corpus-cm-editor"}, Subjects: []rbacv1.Subject{subject(rbacv1.UserKind, "erin")}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "frank-cm", Namespace: corpusNS},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "corpus-cm-editor"}, Subjects: []rbacv1.Subject{subject(rbacv1.UserKind, "frank")}},
	}
	for _, r := range roles {
		must(localcluster.Apply(ctx, cs, r))
	}

	// A node with a pod that references secret s1 and configmap c1.
	for _, name := range []string{"s1", "s2"} {
		_, err := cs.CoreV1().Secrets(corpusNS).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: map[string]string{"k": "v"}}, createOpts)
		must(err)
	}
	_, err = cs.CoreV1().ConfigMaps(corpusNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c1"}}, createOpts)
	must(err)
	_, err = cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1"}}, createOpts)
	must(err)
	noToken := false
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p1"}, Spec: corev1.PodSpec{NodeName: "node1", AutomountServiceAccountToken: &noToken,
		Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
			EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "s1"}}},
				{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "c1"}}}}}}}}
	_, err = cs.CoreV1().Pods(corpusNS).Create(ctx, pod, createOpts)
	must(err)
	bound := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bound"}, Spec: corev1.PodSpec{ServiceAccountName: "podbound", AutomountServiceAccountToken: &noToken,
		Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
	boundPod, err := cs.CoreV1().Pods(corpusNS).Create(ctx, bound, createOpts)
	must(err)

	f := &fixtures{tokens: map[string]string{}, certs: map[string]*tls.Certificate{}}
	f.tokens["sa:corpus/builder"] = saToken(t, cs, corpusNS, "builder", nil, nil)
	f.tokens["sa:corpus/default"] = saToken(t, cs, corpusNS, "default", nil, nil)
	f.tokens["sa:kube-system/sysbot"] = saToken(t, cs, "kube-system", "sysbot", nil, nil)
	f.tokens["sa:corpus/builder@other-audience"] = saToken(t, cs, corpusNS, "builder", []string{"https://other.example"}, nil)
	f.tokens["sa:corpus/ghost-deleted"] = saToken(t, cs, corpusNS, "ghost", nil, nil)
	if err := cs.CoreV1().ServiceAccounts(corpusNS).Delete(ctx, "ghost", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if boundPod != nil {
		f.tokens["sa:corpus/podbound@pod"] = saToken(t, cs, corpusNS, "podbound", nil,
			&authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: "bound", UID: boundPod.UID})
		zero := int64(0)
		if err := cs.CoreV1().Pods(corpusNS).Delete(ctx, "bound", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
	}

	// Legacy secret-based service-account tokens.
	f.tokens["sa-legacy:corpus/builder"] = legacyToken(t, cs, corpusNS, "builder", "builder-legacy", "")
	f.tokens["sa-legacy:no-secret"] = legacyToken(t, cs, corpusNS, "builder", "builder-legacy-gone", "-")
	f.tokens["sa-legacy:other-token-in-secret"] = legacyToken(t, cs, corpusNS, "builder", "builder-legacy-other", "some-other-token")

	// Bootstrap tokens (kube-system secrets the apiserver reads).
	for name, spec := range map[string]struct {
		id, secret, expires, authUsage string
	}{
		"valid":    {"abcdef", "0123456789abcdef", "", "true"},
		"expired":  {"bcdefg", "0123456789abcdef", time.Now().Add(-time.Hour).UTC().Format(time.RFC3339), "true"},
		"no-usage": {"cdefgh", "0123456789abcdef", "", "false"},
	} {
		data := map[string]string{"token-id": spec.id, "token-secret": spec.secret, "usage-bootstrap-authentication": spec.authUsage,
			"auth-extra-groups": "system:bootstrappers:corpus"}
		if spec.expires != "" {
			data["expiration"] = spec.expires
		}
		_, err := cs.CoreV1().Secrets("kube-system").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + spec.id},
			Type: corev1.SecretTypeBootstrapToken, StringData: data}, createOpts)
		must(err)
		f.tokens["bootstrap:"+name] = spec.id + "." + spec.secret
	}
	f.tokens["bootstrap:wrong-secret"] = "abcdef.ffffffffffffffff"

	stranger, err := pki.NewCA("corpus-stranger-ca")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	f.certs["cert:dave"] = issue(t, cluster.CA, pki.Leaf{CommonName: "dave", Organization: []string{"devs"}})
	f.certs["cert:gina"] = issue(t, cluster.CA, pki.Leaf{CommonName: "gina"})
	f.certs["cert:admin"] = issue(t, cluster.CA, pki.Leaf{CommonName: "root", Organization: []string{"system:masters"}})
	f.certs["cert:expired"] = issue(t, cluster.CA, pki.Leaf{CommonName: "dave", NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-24 * time.Hour)})
	f.certs["cert:not-yet-valid"] = issue(t, cluster.CA, pki.Leaf{CommonName: "dave", NotBefore: now.Add(24 * time.Hour), NotAfter: now.Add(48 * time.Hour)})
	f.certs["cert:stranger"] = issue(t, stranger, pki.Leaf{CommonName: "dave"})
	f.certs["cert:node1"] = issue(t, cluster.CA, pki.Leaf{CommonName: "system:node:node1", Organization: []string{"system:nodes"}})
	f.certs["cert:node2"] = issue(t, cluster.CA, pki.Leaf{CommonName: "system:node:node2", Organization: []string{"system:nodes"}})
	fp, err := cluster.FrontProxyClient()
	if err != nil {
		t.Fatal(err)
	}
	f.certs["frontproxy"] = &fp
	f.certs["frontproxy:wrong-cn"] = issue(t, cluster.FrontProxy, pki.Leaf{CommonName: "not-allowed"})
	return f
}

func saToken(t *testing.T, cs kubernetes.Interface, ns, name string, audiences []string, bound *authenticationv1.BoundObjectReference) string {
	t.Helper()
	exp := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: &exp, BoundObjectRef: bound}}, createOpts)
	if err != nil {
		t.Fatalf("token for %s/%s: %v", ns, name, err)
	}
	return tr.Status.Token
}

// credentials resolves a corpus identity ("alice", "token:x", "sa:ns/n",
// "bootstrap:valid", "cert:dave", "frontproxy", "none").
func (f *fixtures) credentials(t *testing.T, as string) (token string, cert *tls.Certificate) {
	t.Helper()
	switch {
	case as == "" || as == "none":
		return "", nil
	case strings.HasPrefix(as, "token:"):
		return strings.TrimPrefix(as, "token:"), nil
	case strings.HasPrefix(as, "oidc:"):
		tok, err := idp.token(as)
		if err != nil {
			t.Fatal(err)
		}
		return tok, nil
	case strings.HasPrefix(as, "sa:"), strings.HasPrefix(as, "sa-legacy:"), strings.HasPrefix(as, "bootstrap:"):
		tok, ok := f.tokens[as]
		if !ok {
			t.Fatalf("corpus: no token %q", as)
		}
		return tok, nil
	case strings.HasPrefix(as, "cert:"), strings.HasPrefix(as, "frontproxy"):
		base, tokUser, _ := strings.Cut(as, "+") // "cert:dave+alice": certificate and token
		c, ok := f.certs[base]
		if !ok {
			t.Fatalf("corpus: no certificate %q", base)
		}
		if tokUser != "" {
			token = tokenOf(tokUser)
		}
		return token, c
	}
	for _, u := range localcluster.Users {
		if u.Name == as {
			return u.Token, nil
		}
	}
	t.Fatalf("corpus: unknown identity %q", as)
	return "", nil
}

// legacyToken forges a legacy (secret-based) service-account token, as
// the token controller (not run here) would, signed with the cluster's
// service-account key, and creates its Secret unless secretToken is "-".
func legacyToken(t *testing.T, cs kubernetes.Interface, ns, sa, secretName, secretToken string) string {
	t.Helper()
	ctx := context.Background()
	acct, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, sa, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(cluster.Dir, "sa.key"))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(keyPEM)
	key, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, (&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(signer).Claims(map[string]any{
		"iss":                                    "kubernetes/serviceaccount",
		"sub":                                    "system:serviceaccount:" + ns + ":" + sa,
		"kubernetes.io/serviceaccount/namespace": ns,
		"kubernetes.io/serviceaccount/secret.name":          secretName,
		"kubernetes.io/serviceaccount/service-account.name": sa,
		"kubernetes.io/serviceaccount/service-account.uid":  string(acct.UID),
	}).CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	if secretToken == "-" {
		return tok
	}
	if secretToken == "" {
		secretToken = tok
	}
	_, err = cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secretName, Annotations: map[string]string{
			corev1.ServiceAccountNameKey: sa, corev1.ServiceAccountUIDKey: string(acct.UID)}},
		Type: corev1.SecretTypeServiceAccountToken, Data: map[string][]byte{"token": []byte(secretToken)}}, createOpts)
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	return tok
}
