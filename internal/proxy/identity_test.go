package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
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
