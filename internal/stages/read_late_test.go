package stages

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/authentication/user"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kproxy/kproxy/internal/record"
)

// TestAuthorizedLate: an authorization verdict read after kproxy saw RBAC
// change, which the apiserver's answer contradicts, is unknown; a verdict
// the answer agrees with, or one read with no change since the request
// arrived, stands.
func TestAuthorizedLate(t *testing.T) {
	arrival := time.Date(2026, 12, 4, 7, 0, 0, 0, time.UTC)
	forbidden := &metav1.Status{Code: 403, Reason: metav1.StatusReasonForbidden,
		Message: `configmaps is forbidden: User "bob" cannot list resource "configmaps" in API group "" in the namespace "team-a"`}
	admission := &metav1.Status{Code: 403, Reason: metav1.StatusReasonForbidden,
		Message: `pods "debug" is forbidden: violates PodSecurity "restricted:latest": privileged`}
	for _, tc := range []struct {
		name     string
		changed  time.Duration // when RBAC last changed, from arrival
		allowed  bool
		answered int
		refusal  *metav1.Status
		want     string // contains; "" keeps the verdict
	}{
		{"denied now, answered 200 after a change", time.Millisecond, false, 200, nil, "the apiserver's authorizer allowed the request (it answered 200"},
		{"denied now, answered 404 after a change", time.Millisecond, false, 404, nil, "it answered 404"},
		{"denied now, answered 422 after a change", time.Millisecond, false, 422, nil, "it answered 422"},
		{"denied now, answered 403", time.Millisecond, false, 403, forbidden, ""},
		{"denied now, answered 429 (APF, before authorization)", time.Millisecond, false, 429, nil, ""},
		{"denied now, answered 401", time.Millisecond, false, 401, nil, ""},
		{"denied now, answered 200, no change since arrival", -time.Millisecond, false, 200, nil, ""},
		{"allowed now, the authorizer refused after a change", time.Millisecond, true, 403, forbidden, "the apiserver's authorizer refused the request, and the replay's allows it"},
		{"allowed now, admission refused", time.Millisecond, true, 403, admission, ""},
		{"allowed now, a 403 without a Status", time.Millisecond, true, 403, nil, ""},
		{"allowed now, the authorizer refused, no change since", -time.Millisecond, true, 403, forbidden, ""},
		{"allowed now, answered 200", time.Millisecond, true, 200, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &changeClock{clock: clocktesting.NewFakePassiveClock(arrival)}
			c.last.Store(arrival.Add(tc.changed).UnixNano())
			a := &authorization{m: &machinery{authzChanges: authzChanges{rbac: c}}}
			req := &Request{Arrival: arrival, Actual: func(context.Context) (Answer, bool) {
				return Answer{Status: tc.answered, Refusal: tc.refusal}, true
			}}
			why := a.authorizedLate(context.Background(), req, tc.allowed)
			if (tc.want == "") != (why == "") || !strings.Contains(why, tc.want) {
				t.Errorf("authorizedLate = %q, want %q", why, tc.want)
			}
		})
	}
	// A watch gives its status as its answer begins: it is checked as any
	// request (a probe: watches allowed across an RBAC change were
	// predicted 403).
	c := &changeClock{clock: clocktesting.NewFakePassiveClock(arrival)}
	c.last.Store(arrival.Add(time.Millisecond).UnixNano())
	watch := &Request{Arrival: arrival, HTTP: httptest.NewRequest(http.MethodGet, "/api/v1/pods?watch=true", nil),
		Info:   &apirequest.RequestInfo{IsResourceRequest: true, Verb: "watch", APIVersion: "v1", Resource: "pods"},
		Actual: func(context.Context) (Answer, bool) { return Answer{Status: 200}, true }}
	if why := (&authorization{m: &machinery{authzChanges: authzChanges{rbac: c}}}).authorizedLate(context.Background(), watch, false); !strings.Contains(why, "kproxy saw RBAC change") {
		t.Errorf("a watch allowed, denied by the replay after RBAC changed: %q, want unknown", why)
	}
	// Without an RBAC authorizer, or a live request, nothing is late.
	a := &authorization{m: &machinery{}}
	if why := a.authorizedLate(context.Background(), &Request{Arrival: arrival, Actual: func(context.Context) (Answer, bool) { return Answer{Status: 200}, true }}, false); why != "" {
		t.Errorf("no RBAC authorizer: %q", why)
	}
}

// TestChangeClockSince: changedSince compares with the last change seen
// (the informers' events are the e2e tests': TestRBACChangedAfterRequest).
func TestChangeClockSince(t *testing.T) {
	start := time.Date(2026, 12, 4, 7, 0, 0, 0, time.UTC)
	fake := clocktesting.NewFakePassiveClock(start)
	c := &changeClock{clock: fake}
	if c.changedSince(start.Add(-time.Hour)) {
		t.Error("a clock that saw nothing says changed")
	}
	fake.SetTime(start.Add(time.Second))
	c.last.Store(c.clock.Now().UnixNano())
	if !c.changedSince(start) || c.changedSince(start.Add(time.Second)) {
		t.Error("changedSince does not compare with the last change")
	}
	var none *changeClock
	if none.changedSince(start) {
		t.Error("a nil clock says changed")
	}
	// The authorizers' clocks name what changed.
	node := &user.DefaultInfo{Name: "system:node:node1", Groups: []string{user.NodesGroup, user.AllAuthenticated}}
	old := &changeClock{clock: fake}
	old.last.Store(start.Add(-time.Second).UnixNano())
	for _, tc := range []struct {
		c    authzChanges
		want string
	}{
		{authzChanges{}, ""},
		{authzChanges{rbac: old, nodeGraph: old}, ""},
		{authzChanges{rbac: c}, "RBAC"},
		{authzChanges{rbac: old, nodeGraph: c}, "the Node authorizer's graph (pods, nodes, volumes)"},
		{authzChanges{rbac: c, nodeGraph: c}, "RBAC and the Node authorizer's graph (pods, nodes, volumes)"},
	} {
		if got := tc.c.changedSince(start, node); got != tc.want {
			t.Errorf("changedSince = %q, want %q", got, tc.want)
		}
	}
	// The Node authorizer's graph decides only for nodes.
	if got := (authzChanges{rbac: old, nodeGraph: c}).changedSince(start, &user.DefaultInfo{Name: "alice", Groups: []string{"devs"}}); got != "" {
		t.Errorf("the Node graph's change counted for alice: %q", got)
	}
}

// TestChangeClockBeforeStore: a change is marked by the time the
// informer's store (which the authorizers read) holds it, not when its
// event handlers get round to it: a replay that reads the new state is
// told it changed.
func TestChangeClockBeforeStore(t *testing.T) {
	start := time.Date(2026, 12, 7, 3, 30, 0, 0, time.UTC)
	fake := clocktesting.NewFakePassiveClock(start)
	w := watch.NewFake()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			return &rbacv1.RoleList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}}, nil
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) { return w, nil },
	}
	inf := cache.NewSharedIndexInformer(listWatchOnly{lw}, &rbacv1.Role{}, 0, cache.Indexers{})
	c := watchChanges(fake, inf)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go inf.RunWithContext(ctx)
	syncCtx, syncCancel := context.WithTimeout(ctx, 30*time.Second)
	defer syncCancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), inf.HasSynced) {
		t.Fatal("the informer did not sync")
	}
	arrival := start.Add(time.Second)
	fake.SetTime(arrival.Add(time.Second)) // the change comes after the request
	w.Add(&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "r", Namespace: "ns", ResourceVersion: "2"}})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, ok, _ := inf.GetStore().GetByKey("ns/r"); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the informer's store did not get the Role in 30s")
		}
		time.Sleep(time.Millisecond)
	}
	if !c.changedSince(arrival) {
		t.Error("the store holds the change and the clock says nothing changed since the request")
	}
}

// listWatchOnly is a ListWatch without the watch-list protocol (a fake
// watch sends no initial-events bookmark).
type listWatchOnly struct{ *cache.ListWatch }

func (listWatchOnly) IsWatchListSemanticsUnSupported() bool { return true }

// TestAuthenticatedLate: a token the replay refuses because what it is
// bound to is gone, which the apiserver authenticated, is unknown; any
// other refusal, or one the apiserver shares, stands.
func TestAuthenticatedLate(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error
		answered int
		want     string // contains; "" keeps the verdict
		children []record.StageResult
	}{
		{"pod deleted, answered 403", errors.New("service account token has been invalidated"), 403, "the apiserver authenticated the request (it answered 403", nil},
		{"service account deleted, answered 200", errors.New("[invalid bearer token, service account ns/worker has been deleted]"), 200, "was deleted or replaced after the request", nil},
		{"service account gone, answered 201 (the apiserver's token cache)", errors.New(`[invalid bearer token, serviceaccounts "tok-sa" not found]`), 201, "within the apiserver's token cache", nil},
		{"service account gone, answered 401", errors.New(`[invalid bearer token, serviceaccounts "tok-sa" not found]`), 401, "", nil},
		{"service account replaced", errors.New("service account UID (a) does not match claim (b)"), 200, "deleted or replaced", nil},
		{"pod replaced", errors.New("pod UID (a) does not match service account pod ref claim (b)"), 404, "it answered 404", nil},
		{"pod deleted, answered 401", errors.New("service account token has been invalidated"), 401, "", nil},
		{"pod deleted, kproxy's 502", errors.New("service account token has been invalidated"), 502, "", nil},
		// A legacy token (a Secret's): its validator's own words.
		{"legacy token's Secret deleted, answered 200", errors.New("[invalid bearer token, Token has been invalidated]"), 200, "within the apiserver's token cache", nil},
		{"legacy token's service account deleted", errors.New("[invalid bearer token, ServiceAccount legacy/default has been deleted]"), 403, "it answered 403", nil},
		{"legacy token's service account replaced", errors.New("ServiceAccount UID (a) does not match claim (b)"), 200, "deleted or replaced", nil},
		{"legacy token's Secret holds another token", errors.New("Token does not match server's copy"), 200, "deleted or replaced", nil},
		{"legacy token labelled invalid, answered 403", errors.New("[invalid bearer token, the token in secret legacy/t for service account legacy/default has been marked invalid. Use tokens from the TokenRequest API or manually created secret-based tokens, or remove the 'kubernetes.io/legacy-token-invalid-since' label from the secret to temporarily allow use of this token]"), 403, "labelled invalid", nil},
		{"legacy token labelled invalid, answered 401", errors.New("the token in secret legacy/t for service account legacy/default has been marked invalid."), 401, "", nil},
		// A token webhook's or JWT issuer's refusal, the apiserver's
		// answer from its cache.
		{"token webhook refused, answered 200", errors.New("invalid bearer token"), 200, "the replay's token-webhook authenticator refuse its token",
			[]record.StageResult{{Name: "token-webhook", Outcome: record.Reject, Explanation: "rejected: invalid bearer token"}}},
		{"token webhook failing, answered 403", errors.New(`an error on the server ("unknown")`), 403, "--authentication-token-webhook-cache-ttl",
			[]record.StageResult{{Name: "token-file", Outcome: record.Reject}, {Name: "token-webhook", Outcome: record.Reject}}},
		{"JWT refused, answered 200", errors.New("token is expired"), 200, "the replay's jwt authenticator refuse",
			[]record.StageResult{{Name: "jwt", Outcome: record.Reject}}},
		{"token webhook refused, answered 401", errors.New("invalid bearer token"), 401, "",
			[]record.StageResult{{Name: "token-webhook", Outcome: record.Reject}}},
		{"token file refused, answered 200", errors.New("invalid bearer token"), 200, "",
			[]record.StageResult{{Name: "token-file", Outcome: record.Reject}}},
		{"expired, answered 200", errors.New("service account token has expired"), 200, "", nil},
		{"a bad token", errors.New("invalid bearer token"), 200, "", nil},
		{"no error", nil, 200, "", nil},
		// A bootstrap token (its form is the credential's), whose Secret
		// the replay's authenticator did not find: no error of its own.
		{"bootstrap token refused, answered 200", nil, 200, "bootstrap-token-abc006 was deleted", nil},
		{"bootstrap token refused, answered 401", nil, 401, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &authentication{}
			hr := httptest.NewRequest(http.MethodGet, "/api", nil)
			if strings.HasPrefix(tc.name, "bootstrap") {
				hr.Header.Set("Authorization", "Bearer abc006.0123456789abcdef")
			}
			req := &Request{HTTP: hr, Actual: func(context.Context) (Answer, bool) { return Answer{Status: tc.answered}, true }}
			why := a.authenticatedLate(context.Background(), req, tc.err, tc.children)
			if (tc.want == "") != (why == "") || !strings.Contains(why, tc.want) {
				t.Errorf("authenticatedLate = %q, want %q", why, tc.want)
			}
		})
	}
}

// TestImpersonatedLate: impersonation asks the authorizer too; a refusal
// of the apiserver's impersonation is told from its authorizer's (of the
// impersonated user), which says impersonation let the request through.
func TestImpersonatedLate(t *testing.T) {
	arrival := time.Date(2026, 12, 4, 7, 0, 0, 0, time.UTC)
	c := &changeClock{clock: clocktesting.NewFakePassiveClock(arrival)}
	c.last.Store(arrival.Add(time.Millisecond).UnixNano())
	impersonate := &metav1.Status{Code: 403, Reason: metav1.StatusReasonForbidden,
		Message: `users "erin" is forbidden: User "alice" cannot impersonate resource "users" in API group "" at the cluster scope`}
	asErin := &metav1.Status{Code: 403, Reason: metav1.StatusReasonForbidden,
		Message: `secrets is forbidden: User "erin" cannot list resource "secrets" in API group "" in the namespace "default"`}
	for _, tc := range []struct {
		name     string
		allowed  bool
		answered int
		refusal  *metav1.Status
		want     string
		changed  time.Duration // RBAC's last change after the arrival (negative: before it); 1ms if 0
	}{
		{"allowed now, the apiserver's impersonation refused", true, 403, impersonate, "the apiserver's impersonation refused the request", 0},
		{"allowed now, the impersonated user refused by the authorizer", true, 403, asErin, "", 0},
		{"refused now, answered 200", false, 200, nil, "the apiserver's impersonation allowed the request (it answered 200", 0},
		{"refused now, the impersonated user refused by the authorizer", false, 403, asErin, "(it answered 403 \"secrets is forbidden: User \\\"erin\\\" cannot list", 0},
		{"refused now, the apiserver's impersonation refused too", false, 403, impersonate, "", 0},
		{"refused now, answered 429 by flow control", false, 429, &metav1.Status{Code: 429, Reason: metav1.StatusReasonTooManyRequests}, "which only a request past impersonation gets", 0},
		{"refused now, answered 401", false, 401, nil, "", 0},
		// The apiserver's constrained impersonation keeps a success 10 s.
		{"refused now, answered 201, RBAC changed 4s before", false, 201, nil, "change in the 10s before this request arrived (the apiserver's constrained impersonation keeps a success", -4 * time.Second},
		{"refused now, answered 201, RBAC changed 11s before", false, 201, nil, "", -11 * time.Second},
		{"allowed now, refused, RBAC changed 4s before", true, 403, impersonate, "", -4 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c.last.Store(arrival.Add(cmp.Or(tc.changed, time.Millisecond)).UnixNano())
			req := &Request{Arrival: arrival, Actual: func(context.Context) (Answer, bool) { return Answer{Status: tc.answered, Refusal: tc.refusal}, true }}
			why := accessLate(context.Background(), authzChanges{rbac: c}, req, tc.allowed, "impersonation", impersonationRefusal, impersonationSuccessTTL)
			if (tc.want == "") != (why == "") || !strings.Contains(why, tc.want) {
				t.Errorf("accessLate = %q, want %q", why, tc.want)
			}
		})
	}
}
