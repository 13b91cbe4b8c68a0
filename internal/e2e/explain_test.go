package e2e

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"

	"github.com/kproxy/kproxy/internal/record"
)

// TestAuthorizationExplanations checks what a denied request's record
// tells a person: the subject's bindings, the nearest rules and what they
// miss, bindings that almost apply, and a Role and RoleBinding that, once
// applied, really make the apiserver allow the request.
func TestAuthorizationExplanations(t *testing.T) {
	f, recs, k := corpusHarness(t, kproxyOptions{})
	r := reverseH2Route(k)
	cases := []struct {
		name, as, method, path string
		want                   []string
	}{
		{"verb missing", "alice", "DELETE", "/api/v1/namespaces/corpus/pods/p1", []string{
			"bindings of alice in scope:", "RoleBinding corpus/alice-pod-reader -> Role pod-reader",
			`Role pod-reader via RoleBinding corpus/alice-pod-reader: {apiGroups [""] resources [pods] verbs [get list watch]} misses verb "delete"`,
			"kind: Role", "- delete", "kind: RoleBinding", "name: alice"}},
		{"other namespace", "bob", "GET", "/api/v1/namespaces/default/configmaps", []string{
			`almost: RoleBinding corpus/qa-cm-editor grants this in namespace "corpus", not "default"`}},
		{"list with resourceNames", "carol", "GET", "/api/v1/namespaces/corpus/secrets", []string{
			`Role one-secret via RoleBinding corpus/carol-one-secret: {apiGroups [""] resources [secrets] resourceNames [s1] verbs [get]} misses verb "list", a name: it is limited to resourceNames [s1], and list names none`}},
		{"another subject's binding", "alice", "GET", "/api/v1/namespaces/corpus/secrets/s1", []string{
			"almost: RoleBinding corpus/carol-one-secret grants this to User carol, and alice is none of them"}},
		{"missing role", "cert:dave", "GET", "/api/v1/namespaces/corpus/pods", []string{
			"RoleBinding corpus/dangling -> Role does-not-exist (Role corpus/does-not-exist not found)"}},
		{"subresource", "alice", "GET", "/api/v1/namespaces/corpus/pods/p1/log", []string{
			`misses subresource "pods/log"`}},
		{"non-resource URL", "alice", "GET", "/metrics", []string{
			`misses verb "get", nonResourceURL "/metrics"`, "kind: ClusterRole", "- /metrics"}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			token, cert := f.credentials(t, c.as)
			id := "explain-" + string(rune('a'+i))
			h := http.Header{"Audit-Id": {id}}
			if token != "" {
				h.Set("Authorization", "Bearer "+token)
			}
			ex := do(t, r.client(cert), r.base, request{method: c.method, path: c.path, header: h})
			if ex.status != 403 {
				t.Fatalf("status %d, want 403", ex.status)
			}
			rec := waitRecord(t, recs, id)
			authz := stageNamed(rec, record.StageAuthorization)
			for _, w := range c.want {
				if !strings.Contains(authz.Explanation, w) {
					t.Errorf("explanation lacks %q:\n%s", w, authz.Explanation)
				}
			}
			if c.name != "verb missing" && c.name != "non-resource URL" {
				return
			}
			// Apply the suggested grant and see the apiserver allow it.
			applyYAML(t, authz.Explanation[strings.Index(authz.Explanation, "---\n"):])
			deadline := time.Now().Add(20 * time.Second)
			for {
				h.Set("Audit-Id", id+"-after")
				ex := do(t, r.client(cert), r.base, request{method: c.method, path: c.path, header: h})
				if ex.status != 403 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("still 403 after applying the suggested grant:\n%s", authz.Explanation)
				}
				time.Sleep(200 * time.Millisecond)
			}
		})
	}
}

func waitRecord(t *testing.T, recs <-chan *record.Record, auditID string) *record.Record {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case rec := <-recs:
			if rec.Actual.AuditID == auditID {
				return rec
			}
		case <-timeout:
			t.Fatalf("no record %s", auditID)
		}
	}
}

func stageNamed(rec *record.Record, name string) record.StageResult {
	for _, s := range rec.Stages {
		if s.Name == name {
			return s
		}
	}
	return record.StageResult{}
}

// applyYAML creates every object of a multi-document manifest as admin.
func applyYAML(t *testing.T, manifest string) {
	t.Helper()
	dc := dynamic.NewForConfigOrDie(cluster.UserConfig("admin"))
	d := yaml.NewYAMLOrJSONDecoder(bytes.NewReader([]byte(manifest)), 4096)
	for {
		var u unstructured.Unstructured
		if err := d.Decode(&u.Object); err == io.EOF {
			return
		} else if err != nil {
			t.Fatalf("suggested grant is not YAML: %v\n%s", err, manifest)
		}
		if len(u.Object) == 0 {
			continue
		}
		gvk := u.GroupVersionKind()
		res := map[string]string{"Role": "roles", "RoleBinding": "rolebindings", "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings"}[gvk.Kind]
		gvr := gvk.GroupVersion().WithResource(res)
		ri := dynamic.ResourceInterface(dc.Resource(gvr))
		if ns := u.GetNamespace(); ns != "" {
			ri = dc.Resource(gvr).Namespace(ns)
		}
		if _, err := ri.Create(context.Background(), &u, createOpts); err != nil {
			t.Fatalf("apply suggested %s: %v\n%s", gvk.Kind, err, manifest)
		}
		// Other tests share the cluster: take the grant back.
		name := u.GetName()
		t.Cleanup(func() { _ = ri.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}
}

// TestAuthenticationExplanations checks that the authentication stage
// names the authenticator that accepted the caller, and says what is
// wrong with a rejected credential.
func TestAuthenticationExplanations(t *testing.T) {
	f, recs, k := corpusHarness(t, kproxyOptions{})
	r := reverseH2Route(k)
	cases := []struct {
		as      string
		headers map[string]string
		want    []string
	}{
		{"alice", nil, []string{"a token authenticator", `user "alice"`}},
		{"cert:dave", nil, []string{"the x509 client-certificate authenticator", `CN="dave"`}},
		{"sa:corpus/builder", nil, []string{"the service-account token authenticator", "system:serviceaccount:corpus:builder"}},
		{"bootstrap:valid", nil, []string{"the bootstrap-token authenticator", "system:bootstrap:abcdef"}},
		{"frontproxy", map[string]string{"X-Remote-User": "alice"}, []string{"the front-proxy (requestheader) authenticator"}},
		{"none", nil, []string{"the anonymous authenticator"}},
		{"sa:corpus/builder@other-audience", nil, []string{"is a JWT from issuer", "none of its audiences is one the apiserver accepts"}},
		{"sa:corpus/ghost-deleted", nil, []string{"no longer exists"}},
		{"bootstrap:expired", nil, []string{"bootstrap-token form (id \"bcdefg\")", "kube-system/bootstrap-token-bcdefg"}},
		{"token:not-a-token", nil, []string{"unknown token" /* the token webhook's answer */, "not a JWT"}},
		{"cert:expired", nil, []string{"certificate has expired"}},
	}
	for i, c := range cases {
		t.Run(c.as, func(t *testing.T) {
			token, cert := f.credentials(t, c.as)
			id := "authn-explain-" + string(rune('a'+i))
			h := http.Header{"Audit-Id": {id}}
			for k, v := range c.headers {
				h.Set(k, v)
			}
			if token != "" {
				h.Set("Authorization", "Bearer "+token)
			}
			do(t, r.client(cert), r.base, request{method: "GET", path: "/api/v1/namespaces/corpus/pods", header: h})
			rec := waitRecord(t, recs, id)
			authn := stageNamed(rec, record.StageAuthentication)
			if c.as == "alice" {
				// alice may list pods in corpus: the allow names the rule.
				authz := stageNamed(rec, record.StageAuthorization).Explanation
				for _, w := range []string{`RBAC: allowed by RoleBinding "alice-pod-reader/corpus"`,
					`Role pod-reader via RoleBinding corpus/alice-pod-reader: {apiGroups [""] resources [pods] verbs [get list watch]}`} {
					if !strings.Contains(authz, w) {
						t.Errorf("authorization explanation lacks %q:\n%s", w, authz)
					}
				}
			}
			for _, w := range c.want {
				if !strings.Contains(authn.Explanation, w) {
					t.Errorf("authentication explanation lacks %q:\n%s", w, authn.Explanation)
				}
			}
			if token != "" && strings.Contains(authn.Explanation, token) {
				t.Errorf("the explanation contains the token")
			}
		})
	}
}
