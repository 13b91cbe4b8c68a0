package stages

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/internal/credential"

	"github.com/kproxy/kproxy/internal/record"
)

// The access stages read the cluster's state from informers, in the
// apiserver as in the replay, and the replay reads it after the request:
// a replay behind a queue meets the state as it is since. Two changes make
// it meet another state than the request did, and the apiserver's answer
// shows when they did:
//   - The authorizers' state: RBAC (a user deleting the RoleBinding that
//     lets them delete it, a request refused just before its caller was
//     granted it), the Node authorizer's graph (a kubelet reading a
//     secret of a pod deleted right after). When kproxy has seen it
//     change since the request arrived and the answer shows the
//     apiserver's authorizer (or impersonation, which asks it) decided
//     otherwise than the replay's, the verdict says nothing about the
//     request.
//   - The objects a service-account token is bound to: a pod's last
//     requests before it is deleted; and a token the apiserver's token
//     cache holds (a success is not checked again for 10 s, whoever sent
//     it), used right after its service account was deleted. When the replay's authenticator
//     refuses the token because its service account, secret, pod or node
//     is gone (or replaced), and the apiserver authenticated the request,
//     the authentication verdict says nothing about it either.
// The stage then says unknown, with what it read now.

// unknownNow is an unknown verdict that says why, and what the stage
// found as the cluster is now.
func unknownNow(now Result, why string) Result {
	return withChildren(now.Children, Unknown(why+"; read now: "+now.Explanation))
}

// answerAwaited reports a request whose answer the access stages may
// wait for: a live one (not a test case's). A long-running one (a watch,
// a log followed, an exec) gives its status as soon as its answer begins,
// not when its stream ends (found by a probe: watches and logs refused or
// allowed across an RBAC change were predicted the other way, never
// checked against the answer).
func answerAwaited(req *Request) bool { return req.Actual != nil }

// changeClock is when kproxy last saw one of some informers' objects
// added, changed or deleted.
type changeClock struct {
	clock clock.PassiveClock
	last  atomic.Int64 // unix nanoseconds
}

// watchChanges starts a changeClock over the informers (before they run:
// their first list counts as a change, before any request it matters for).
//
// It marks a change as the informer queues it, in a transform (none of
// these informers has another), before the informer's store, which the
// authorizers read, holds it: an event handler runs after the store is
// updated, at its own goroutine's pace, and in between a replay read the
// new state while the clock said nothing had changed (a probe: a CSR
// approval allowed, predicted 403 by the replay's CertificateApproval,
// with RBAC changed 12 ms after the request and no word of it). The
// handlers stay for an informer already started.
func watchChanges(clk clock.PassiveClock, informers ...cache.SharedIndexInformer) *changeClock {
	c := &changeClock{clock: clk}
	mark := func() { c.last.Store(c.clock.Now().UnixNano()) }
	for _, inf := range informers {
		_ = inf.SetTransform(func(obj any) (any, error) {
			mark()
			return obj, nil
		})
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { mark() },
			UpdateFunc: func(any, any) { mark() },
			DeleteFunc: func(any) { mark() },
		})
	}
	return c
}

// changedSince reports a change seen after t.
func (c *changeClock) changedSince(t time.Time) bool {
	return c != nil && c.last.Load() > t.UnixNano()
}

// authzChanges are the change clocks of the state the authorizers read
// (nil for an authorizer not in the chain).
type authzChanges struct {
	rbac, nodeGraph *changeClock
}

// changedSince names the state seen to change after t that can decide
// for u, or "". The Node authorizer has an opinion only for nodes, and its
// graph (pods above all) changes all the time: other callers' verdicts do
// not wait for their answers on its account.
func (c authzChanges) changedSince(t time.Time, u user.Info) string {
	var what []string
	if c.rbac.changedSince(t) {
		what = append(what, "RBAC")
	}
	if u != nil && slices.Contains(u.GetGroups(), user.NodesGroup) && c.nodeGraph.changedSince(t) {
		what = append(what, "the Node authorizer's graph (pods, nodes, volumes)")
	}
	return strings.Join(what, " and ")
}

// authorizedLate says why the replay's authorization verdict (allowed or
// not), read after RBAC changed, is not the request's, or "".
func (a *authorization) authorizedLate(ctx context.Context, req *Request, allowed bool) string {
	return accessLate(ctx, a.m.authzChanges, req, allowed, "authorizer", authorizerRefusal, 0)
}

// impersonationSuccessTTL is how long the apiserver's constrained
// impersonation keeps a success (impersonationCache: for each
// constrained mode, by requestor and wanted user, and with the request's
// attributes): an impersonation allowed once is allowed again for 10 s
// without asking the authorizer, whatever RBAC says since. Legacy
// impersonation keeps nothing; either may have allowed the request.
const impersonationSuccessTTL = 10 * time.Second

// accessLate says why a verdict of check (the authorizer, or
// impersonation asking it), read after kproxy saw the authorizers' state
// change since the request arrived, is not the request's: the answer
// shows the apiserver's check decided otherwise (refusedBy recognises its
// refusal). A check that keeps its successes for a while (cached: the
// apiserver's, not asking again) may have allowed the request for a
// state changed up to cached before it arrived. "" otherwise.
func accessLate(ctx context.Context, changes authzChanges, req *Request, allowed bool, check string, refusedBy func(*metav1.Status) bool, cached time.Duration) string {
	if !answerAwaited(req) || req.Arrival.IsZero() {
		return ""
	}
	when := "after this request arrived"
	changed := changes.changedSince(req.Arrival, req.User)
	if changed == "" && !allowed && cached > 0 {
		changed = changes.changedSince(req.Arrival.Add(-cached), req.User)
		when = fmt.Sprintf("in the %s before this request arrived (the apiserver's constrained impersonation keeps a success %s without asking the authorizer again)", cached, cached)
	}
	if changed == "" {
		return ""
	}
	aw, ok := req.Actual(ctx)
	if !ok {
		return ""
	}
	switch {
	case !allowed && answeredAfterAuthorization(aw.Status):
		return fmt.Sprintf("the apiserver's %s allowed the request (it answered %d, which only a request past authorization gets), "+
			"and the replay's denies it: kproxy saw %s change %s, so the permissions it met are not known", check, aw.Status, changed, when)
	case !allowed && check == "impersonation" && passedImpersonation(aw):
		// Impersonation comes before flow control and authorization: their
		// refusals say it let the request through.
		return fmt.Sprintf("the apiserver's impersonation allowed the request (it answered %d %q, which only a request past impersonation gets), "+
			"and the replay's denies it: kproxy saw %s change %s, so the permissions it met are not known", aw.Status, refusalMessage(aw), changed, when)
	case allowed && aw.Status == http.StatusForbidden && refusedBy(aw.Refusal):
		return fmt.Sprintf("the apiserver's %s refused the request, and the replay's allows it: "+
			"kproxy saw %s change after this request arrived, so the permissions it met are not known", check, changed)
	}
	return ""
}

// passedImpersonation reports an answer only a request past impersonation
// gets, besides answeredAfterAuthorization's: flow control's 429, or the
// authorizer's 403 of the impersonated user (not impersonation's own).
func passedImpersonation(aw Answer) bool {
	return aw.Status == http.StatusTooManyRequests ||
		(aw.Status == http.StatusForbidden && authorizerRefusal(aw.Refusal) && !impersonationRefusal(aw.Refusal))
}

func refusalMessage(aw Answer) string {
	if aw.Refusal == nil {
		return ""
	}
	return aw.Refusal.Message
}

// answeredAfterAuthorization reports a status only a request the
// authorizer allowed gets: a success, or a refusal of the handler's (the
// filters before authorization answer 401, 403 and 429 only).
func answeredAfterAuthorization(status int) bool {
	switch {
	case status >= 200 && status < 400:
		return true
	}
	switch status {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusNotAcceptable, http.StatusConflict,
		http.StatusGone, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity:
		return true
	}
	return false
}

// authorizerRefusal reports the apiserver's authorization 403: `... is
// forbidden: User "u" cannot verb ...`.
func authorizerRefusal(st *metav1.Status) bool {
	return st != nil && st.Reason == metav1.StatusReasonForbidden &&
		strings.Contains(st.Message, `forbidden: User "`) && strings.Contains(st.Message, `" cannot `)
}

// impersonationRefusal reports the apiserver's impersonation 403: `...
// is forbidden: User "u" cannot impersonate ...` (or a constrained
// impersonation's impersonate-on: verb).
func impersonationRefusal(st *metav1.Status) bool {
	return authorizerRefusal(st) && strings.Contains(st.Message, `" cannot impersonate`)
}

// authenticatedLate says why the replay's refusal of a credential (err,
// the authenticators'), read after the token's bound objects changed, is
// not the request's, or "".
func (a *authentication) authenticatedLate(ctx context.Context, req *Request, err error, children []record.StageResult) string {
	serviceAccount := err != nil && boundObjectGone(err)
	bootstrap := bootstrapTokenRE.FindStringSubmatch(credential.Inspect(req.HTTP).Token)
	cached := refusingCachedMembers(children)
	if (!serviceAccount && bootstrap == nil && cached == nil) || !answerAwaited(req) {
		return ""
	}
	aw, ok := req.Actual(ctx)
	if !ok || aw.Status == 0 || aw.Status == http.StatusUnauthorized || aw.Status >= 500 {
		return ""
	}
	if !serviceAccount && bootstrap == nil {
		// A token webhook's or a JWT issuer's verdict, which the
		// apiserver keeps from its own check (found by a probe: a
		// webhook token used directly, then revoked or the webhook down,
		// answered 200 from the apiserver's cache, predicted 401).
		return fmt.Sprintf("the apiserver authenticated the request (it answered %d, which only an authenticated request gets), "+
			"and the replay's %s refuse its token (%v): the apiserver keeps a token's success from its own check of it "+
			"(a token webhook's for --authentication-token-webhook-cache-ttl, 2m by default; any token's for --token-success-cache-ttl, 10 s), "+
			"which kproxy's checks do not share (a request sent past kproxy, another replica, a restart), and the webhook or issuer "+
			"may answer otherwise now, so the state on arrival is not known", aw.Status, strings.Join(cached, " and "), err)
	}
	if !serviceAccount {
		// A bootstrap token's Secret, read from an informer (found by a
		// probe: the Secret deleted seconds after a request through
		// another path, then the token sent through kproxy, 200 there).
		return fmt.Sprintf("the apiserver authenticated the request (it answered %d, which only an authenticated request gets), "+
			"and the replay's bootstrap-token authenticator refuses its token: its Secret kube-system/bootstrap-token-%s was deleted, "+
			"expired or changed after the request, before the replay read it, or shortly before the request, within the apiserver's "+
			"token cache (a token it authenticated in the last 10 s, for any client, is not checked again), so the state on arrival is not known", aw.Status, bootstrap[1])
	}
	return fmt.Sprintf("the apiserver authenticated the request (it answered %d, which only an authenticated request gets), "+
		"and the replay's service-account authenticator refuses its token (%v): the object the token is bound to "+
		"(its service account, secret, pod or node) was deleted or replaced after the request (a legacy token's Secret: or labelled invalid), before the replay read it, "+
		"or shortly before the request, within the apiserver's token cache (a token it authenticated in the last 10 s, "+
		"for any client, is not checked again), so the state on arrival is not known", aw.Status, err)
}

// refusingCachedMembers names the authenticators among children that
// refused the request's token and whose verdicts the apiserver caches
// from calls of its own (a token webhook, a JWT issuer), or nil.
func refusingCachedMembers(children []record.StageResult) []string {
	var out []string
	for _, c := range children {
		if c.Outcome == record.Reject && (c.Name == "token-webhook" || c.Name == "jwt") {
			out = append(out, c.Name+" authenticator")
		}
	}
	return out
}

// boundObjectGone reports the service-account token validators' refusal
// of a token whose service account, secret, pod or node is gone, being
// deleted, or another object of the same name; or, for a legacy token (a
// Secret's), whose Secret now holds another token or is labelled
// kubernetes.io/legacy-token-invalid-since (the legacy-token cleaner's
// mark). The bound validator says "service account", the legacy one
// "ServiceAccount" and "Token has been invalidated" (found by a probe: a
// legacy token used directly, its Secret then labelled invalid or deleted,
// then sent through kproxy, answered from the apiserver's token cache,
// predicted 401).
func boundObjectGone(err error) bool {
	s := strings.ToLower(err.Error())
	return strings.Contains(s, "token has been invalidated") ||
		((strings.Contains(s, "service account ") || strings.Contains(s, "serviceaccount ")) && strings.Contains(s, " has been deleted")) ||
		strings.Contains(s, "service account uid (") || strings.Contains(s, "serviceaccount uid (") ||
		strings.Contains(s, "does not match service account") || strings.Contains(s, "token does not match server's copy") ||
		(strings.Contains(s, "the token in secret ") && strings.Contains(s, " has been marked invalid")) ||
		serviceAccountNotFound.MatchString(s)
}

// serviceAccountNotFound is the validator's lookup of a token's service
// account that found none (the lister's, or the live read's, NotFound).
var serviceAccountNotFound = regexp.MustCompile(`serviceaccounts? "[^"]*" not found`)
