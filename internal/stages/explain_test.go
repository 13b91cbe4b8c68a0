package stages

import (
	"encoding/base64"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
)

func jwtWith(claims string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(claims)) + ".c2ln"
}

func TestDescribeToken(t *testing.T) {
	m := &machinery{apiAudiences: authenticator.Audiences{"https://kubernetes.default.svc"}, saIssuers: []string{"https://kubernetes.default.svc"}}
	now := time.Unix(2000, 0)
	for _, tc := range []struct {
		name, token string
		want        []string
		not         []string
	}{
		{"no token", "", nil, nil},
		{"opaque token", "abc", []string{"not a JWT"}, nil},
		{"bootstrap token", "abcdef.0123456789abcdef", []string{`bootstrap-token form (id "abcdef")`, "kube-system/bootstrap-token-abcdef"}, []string{"0123456789abcdef"}},
		{"expired service-account token", jwtWith(`{"iss":"https://kubernetes.default.svc","sub":"system:serviceaccount:a:b","aud":["https://kubernetes.default.svc"],"exp":1000}`),
			[]string{`issuer "https://kubernetes.default.svc"`, "expired at 1970-01-01T00:16:40Z"}, []string{"no longer exists"}},
		{"wrong audience", jwtWith(`{"iss":"https://kubernetes.default.svc","sub":"system:serviceaccount:a:b","aud":"other","exp":3000}`),
			[]string{"none of its audiences"}, nil},
		{"foreign issuer", jwtWith(`{"iss":"https://evil.example","sub":"system:serviceaccount:a:b","aud":["https://kubernetes.default.svc"],"exp":3000}`),
			[]string{"not one of --service-account-issuer"}, nil},
		{"valid-looking service-account token", jwtWith(`{"iss":"https://kubernetes.default.svc","sub":"system:serviceaccount:a:b","aud":["https://kubernetes.default.svc"],"exp":3000}`),
			[]string{"no longer exists"}, nil},
		{"legacy token (no audience, its own issuer)", jwtWith(`{"iss":"kubernetes/serviceaccount","sub":"system:serviceaccount:a:default","kubernetes.io/serviceaccount/secret.name":"t"}`),
			[]string{"legacy token", "kubernetes.io/legacy-token-invalid-since"}, []string{"none of its audiences", "--service-account-issuer"}},
		{"not yet valid", jwtWith(`{"iss":"x","sub":"u","nbf":3000}`), []string{"not valid before"}, nil},
		{"garbage claims", "a.!!!.c", []string{"not base64url"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/api", nil)
			if tc.token != "" {
				r.Header.Set("Authorization", "Bearer "+tc.token)
			}
			got := m.describeToken(r, now)
			if len(tc.want) == 0 && got != "" {
				t.Fatalf("got %q, want nothing", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("%q lacks %q", got, w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(got, n) {
					t.Errorf("%q must not contain %q", got, n)
				}
			}
		})
	}
}

func TestRuleMisses(t *testing.T) {
	res := func(verb, group, resource, sub, name string) authorizer.Attributes {
		return authorizer.AttributesRecord{User: &user.DefaultInfo{Name: "u"}, Verb: verb, APIGroup: group, Resource: resource,
			Subresource: sub, Name: name, Namespace: "ns", ResourceRequest: true}
	}
	nonres := authorizer.AttributesRecord{User: &user.DefaultInfo{Name: "u"}, Verb: "get", Path: "/metrics"}
	podsRead := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}}
	for _, tc := range []struct {
		name string
		a    authorizer.Attributes
		rule rbacv1.PolicyRule
		want string
	}{
		{"allows", res("get", "", "pods", "", "p"), podsRead, ""},
		{"verb", res("delete", "", "pods", "", "p"), podsRead, `verb "delete"`},
		{"group", res("get", "apps", "pods", "", "p"), podsRead, `apiGroup "apps"`},
		{"subresource", res("get", "", "pods", "log", "p"), podsRead, `subresource "pods/log"`},
		{"resource", res("get", "", "secrets", "", "s"), podsRead, `resource "secrets"`},
		{"resourceName", res("get", "", "pods", "", "q"), rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}, ResourceNames: []string{"p"}}, `resourceName "q"`},
		{"list with names", res("list", "", "pods", "", ""), rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}, ResourceNames: []string{"p"}}, "list names none"},
		{"wildcards", res("delete", "apps", "deployments", "scale", "d"), rbacv1.PolicyRule{APIGroups: []string{"*"}, Resources: []string{"*/scale"}, Verbs: []string{"*"}}, ""},
		{"non-resource rule for a resource", res("get", "", "pods", "", "p"), rbacv1.PolicyRule{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}, "non-resource URLs only"},
		{"non-resource allowed", nonres, rbacv1.PolicyRule{NonResourceURLs: []string{"/metr*"}, Verbs: []string{"get"}}, ""},
		{"resource rule for a non-resource URL", nonres, podsRead, "for resources only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := strings.Join(ruleMisses(tc.a, tc.rule), ", ")
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("misses %q, want %q", got, tc.want)
			}
		})
	}
}

func TestSmallestGrant(t *testing.T) {
	a := authorizer.AttributesRecord{Verb: "get", Resource: "secrets", Name: "s1", Namespace: "prod", ResourceRequest: true}
	got := smallestGrant(&user.DefaultInfo{Name: "system:serviceaccount:ci:deployer"}, a)
	for _, w := range []string{"kind: Role\n", "namespace: prod", "- s1", "kind: ServiceAccount", "name: deployer", "namespace: ci"} {
		if !strings.Contains(got, w) {
			t.Errorf("grant lacks %q:\n%s", w, got)
		}
	}
	if strings.Contains(got, "creationTimestamp") {
		t.Errorf("grant carries creationTimestamp noise:\n%s", got)
	}
	cluster := smallestGrant(&user.DefaultInfo{Name: "alice"}, authorizer.AttributesRecord{Verb: "list", Resource: "nodes", ResourceRequest: true})
	if !strings.Contains(cluster, "kind: ClusterRole\n") || !strings.Contains(cluster, "kind: ClusterRoleBinding") {
		t.Errorf("cluster-scoped grant:\n%s", cluster)
	}
	if g := smallestGrant(&user.DefaultInfo{Name: user.Anonymous}, a); g != "" {
		t.Errorf("never suggest granting anonymous access:\n%s", g)
	}
}

func TestImpersonationForm(t *testing.T) {
	for msg, want := range map[string]string{
		`users "frank" is forbidden: User "dave" cannot impersonate resource "users" in API group "" at the cluster scope`:                         "classic impersonation",
		`configmaps "c1" is forbidden: User "gina" cannot impersonate-on:user-info:get resource "configmaps" in API group "" in the namespace "x"`: "constrained impersonation, mode user-info: the impersonate-on check",
		`users.authentication.k8s.io "erin" is forbidden: User "gina" cannot impersonate:user-info resource "users"`:                               "constrained impersonation, mode user-info: the check on the impersonated identity",
		`requested &user.DefaultInfo{Name:""} without impersonating a user name`:                                                                   "malformed headers",
	} {
		if got := impersonationForm(msg); !strings.Contains(got, want) {
			t.Errorf("%q: %q, want %q", msg, got, want)
		}
	}
}
