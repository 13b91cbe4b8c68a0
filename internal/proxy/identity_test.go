package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/endpoints/filters/impersonation"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
	authorizationv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
)

// TestImpersonationIsNotCached: every impersonation check asks the
// apiserver, so a permission revoked there stops at once here too (the
// e2e TestRevokedImpersonationStopsAtOnce checks the same against the real
// apiserver; this guards the authorizer's configuration on its own).
func TestImpersonationIsNotCached(t *testing.T) {
	var reviews, allowed atomic.Int32
	allowed.Store(1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reviews.Add(1)
		var sar authorizationv1.SubjectAccessReview
		if err := json.NewDecoder(r.Body).Decode(&sar); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		sar.Status.Allowed = allowed.Load() == 1
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&sar)
	}))
	defer srv.Close()
	client, err := authorizationv1client.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	authz, err := NewImpersonationAuthorizer(client)
	if err != nil {
		t.Fatal(err)
	}
	attrs := authorizer.AttributesRecord{User: &user.DefaultInfo{Name: "dave"}, Verb: "impersonate", Resource: "users", Name: "erin", ResourceRequest: true}
	want := []authorizer.Decision{authorizer.DecisionAllow, authorizer.DecisionAllow, authorizer.DecisionNoOpinion, authorizer.DecisionNoOpinion, authorizer.DecisionAllow}
	for i, w := range want {
		if i == 2 {
			allowed.Store(0) // revoked
		}
		if i == 4 {
			allowed.Store(1) // granted again
		}
		d, _, err := authz.Authorize(context.Background(), attrs)
		if d != w {
			t.Errorf("check %d: decision %v (%v), want %v", i, d, err, w)
		}
	}
	if n := reviews.Load(); n != int32(len(want)) {
		t.Errorf("%d SubjectAccessReviews for %d checks: a decision was served from a cache", n, len(want))
	}
}

// TestImpersonationIsExact: the headers kproxy forwards a certificate
// caller with, read by the apiserver's own impersonation filter (every
// mode allowed), give the user the apiserver gives that caller when it
// authenticates it itself: its groups with system:authenticated added, no
// more (found by a probe: a certificate named like a service account got
// the service account's groups, one named like a node could get
// system:nodes, each a grant the caller does not have directly).
func TestImpersonationIsExact(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   *user.DefaultInfo
		want *user.DefaultInfo
	}{
		{"a user", &user.DefaultInfo{Name: "dave", Groups: []string{"devs"}}, &user.DefaultInfo{Name: "dave", Groups: []string{"devs", user.AllAuthenticated}}},
		{"no groups", &user.DefaultInfo{Name: "dave"}, &user.DefaultInfo{Name: "dave", Groups: []string{user.AllAuthenticated}}},
		{"named like a service account", &user.DefaultInfo{Name: "system:serviceaccount:default:ghost"},
			&user.DefaultInfo{Name: "system:serviceaccount:default:ghost", Groups: []string{user.AllAuthenticated}}},
		{"named like a node, not in system:nodes", &user.DefaultInfo{Name: "system:node:n9"}, &user.DefaultInfo{Name: "system:node:n9", Groups: []string{user.AllAuthenticated}}},
		{"a node", &user.DefaultInfo{Name: "system:node:n1", Groups: []string{user.NodesGroup}}, &user.DefaultInfo{Name: "system:node:n1", Groups: []string{user.NodesGroup, user.AllAuthenticated}}},
		{"unauthenticated", &user.DefaultInfo{Name: "eve", Groups: []string{user.AllUnauthenticated}}, &user.DefaultInfo{Name: "eve", Groups: []string{user.AllUnauthenticated}}},
		{"system:anonymous in system:unauthenticated", &user.DefaultInfo{Name: user.Anonymous, Groups: []string{user.AllUnauthenticated}},
			&user.DefaultInfo{Name: user.Anonymous, Groups: []string{user.AllUnauthenticated}}},
		{"padded", &user.DefaultInfo{Name: " dave", Groups: []string{" system:masters"}}, &user.DefaultInfo{Name: " dave", Groups: []string{" system:masters", user.AllAuthenticated}}},
		{"uid and extras, keys with separators", &user.DefaultInfo{Name: "frank", UID: "u-1", Extra: map[string][]string{"example.com/team:x@y": {"blue", "b l"}, "100%": {"v"}}},
			&user.DefaultInfo{Name: "frank", UID: "u-1", Groups: []string{user.AllAuthenticated}, Extra: map[string][]string{"example.com/team:x@y": {"blue", "b l"}, "100%": {"v"}}}},
		// The apiserver lowercases a header's name before it unescapes
		// the key: capitals are sent escaped (found by a probe: a policy
		// refusing extra "Abc" admitted a certificate caller through
		// kproxy, who arrived as "abc"; "K" and "k" arrived merged).
		{"extras with capitals", &user.DefaultInfo{Name: "frank", Extra: map[string][]string{"Abc": {"v"}, "K": {"2"}, "k": {"1"}, "Example.COM/Team": {"x"}}},
			&user.DefaultInfo{Name: "frank", Groups: []string{user.AllAuthenticated}, Extra: map[string][]string{"Abc": {"v"}, "K": {"2"}, "k": {"1"}, "Example.COM/Team": {"x"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, why := forwardable(tc.in, false); why != "" {
				t.Fatalf("forwardable: %s", why)
			}
			h := http.Header{}
			setImpersonation(h, tc.in)
			got, err := impersonatedBy(h)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("impersonated user (-want +got):\n%s", diff)
			}
		})
	}
}

// impersonatedBy is the user the apiserver's own impersonation filter
// (every mode allowed) makes of the impersonation headers h, sent by an
// identity that may impersonate anyone.
func impersonatedBy(h http.Header) (user.Info, error) {
	var got user.Info
	allow := authorizer.AuthorizerFunc(func(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
		return authorizer.DecisionAllow, "", nil
	})
	filter := impersonation.WithConstrainedImpersonation(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		got, _ = apirequest.UserFrom(r.Context())
	}), allow, statusCodecs)
	r := httptest.NewRequest("GET", "/api/v1/namespaces/default/pods", nil)
	r.Header = h.Clone()
	ctx := apirequest.WithRequestInfo(r.Context(), &apirequest.RequestInfo{IsResourceRequest: true, Verb: "list", APIVersion: "v1", Namespace: "default", Resource: "pods"})
	ctx = apirequest.WithUser(ctx, &user.DefaultInfo{Name: "kproxy", Groups: []string{user.SystemPrivilegedGroup, user.AllAuthenticated}})
	w := httptest.NewRecorder()
	filter.ServeHTTP(w, r.WithContext(ctx))
	if got == nil {
		return nil, fmt.Errorf("the impersonation filter refused %v: %d %s", h, w.Code, w.Body)
	}
	return got, nil
}

// TestUnforwardable: what no impersonation carries exactly, kproxy refuses
// to forward rather than forward as someone else (found by a probe:
// system:anonymous got system:unauthenticated, a group " system:masters"
// became system:masters over HTTP/1.1, a control character made a 502).
func TestUnforwardable(t *testing.T) {
	for _, tc := range []struct {
		name    string
		u       *user.DefaultInfo
		upgrade bool
		want    string
	}{
		{"system:anonymous without groups", &user.DefaultInfo{Name: user.Anonymous}, false, "adds the group system:unauthenticated to an impersonated system:anonymous"},
		{"system:anonymous in another group", &user.DefaultInfo{Name: user.Anonymous, Groups: []string{"devs"}}, false, `(groups ["devs"]) is not in it`},
		{"a control character in the name", &user.DefaultInfo{Name: "eve\x7f"}, false, "with a character no HTTP header can carry"},
		{"a newline in a group", &user.DefaultInfo{Name: "eve", Groups: []string{"x\nsystem:masters"}}, false, "no HTTP header can carry"},
		{"a control character in an extra", &user.DefaultInfo{Name: "eve", Extra: map[string][]string{"k": {"a\x00"}}}, false, "no HTTP header can carry"},
		{"padded, on an upgrade", &user.DefaultInfo{Name: "eve", Groups: []string{"system:masters "}}, true, `"system:masters ", with spaces around it`},
		{"padded, not an upgrade: over HTTP/2", &user.DefaultInfo{Name: "eve", Groups: []string{"system:masters "}}, false, ""},
		{"a tab inside", &user.DefaultInfo{Name: "e\tve"}, true, ""},
		{"an empty name", &user.DefaultInfo{}, false, "user name is empty"},
		{"a plain user", &user.DefaultInfo{Name: "dave", Groups: []string{"devs"}}, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, got := forwardable(tc.u, tc.upgrade)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("forwardable = %q, want %q", got, tc.want)
			}
		})
	}
	if !paddedImpersonation(http.Header{"Impersonate-Group": {"devs", " system:masters"}}) || paddedImpersonation(http.Header{"Impersonate-User": {"a b"}, "X-Other": {" x"}}) {
		t.Error("paddedImpersonation: want a padded Impersonate-* value found, and nothing else")
	}
}

// TestImpersonateHeadersRecorded: the record's request.impersonate names
// an extra's key as the apiserver reads it: lowercased, then unescaped
// (a probe found "%41bc" recorded for the apiserver's "Abc").
func TestImpersonateHeadersRecorded(t *testing.T) {
	h := http.Header{}
	h.Set("Impersonate-User", "u")
	h.Add("Impersonate-Extra-%41bc", "v")
	h.Add("Impersonate-Extra-K", "1")
	h.Add("Impersonate-Extra-%4B", "2")
	h.Add("Impersonate-Extra-Bad%zz", "3")
	got := impersonateHeaders(h)
	want := map[string][]string{"Abc": {"v"}, "k": {"1"}, "K": {"2"}, "bad%zz": {"3"}}
	if got == nil || !cmp.Equal(got.Extra, want) {
		t.Errorf("request.impersonate.extra = %v, want %v", got, want)
	}
}
