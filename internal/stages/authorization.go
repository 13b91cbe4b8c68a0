package stages

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	"k8s.io/apiserver/pkg/authorization/authorizer"
	genericapifilters "k8s.io/apiserver/pkg/endpoints/filters"

	"github.com/kproxy/kproxy/internal/record"
)

// authorization replays the authorizer chain (Node, RBAC, Webhook, ...,
// with system:masters first) through the apiserver's own WithAuthorization
// filter, so a predicted 403 is byte for byte the apiserver's.
type authorization struct {
	m *machinery
	f *filter
}

// authzTrace records the chain's decision for one request.
type authzTrace struct {
	decision authorizer.Decision
	reason   string
	err      error
	attrs    authorizer.Attributes
}

type authzTraceKey struct{}

func newAuthorization(m *machinery) Stage {
	a := &authorization{m: m}
	if m.authz == nil {
		return a
	}
	traced := authorizer.AuthorizerFunc(func(ctx context.Context, attrs authorizer.Attributes) (authorizer.Decision, string, error) {
		d, reason, err := m.authz.Authorize(ctx, attrs)
		if t, _ := ctx.Value(authzTraceKey{}).(*authzTrace); t != nil {
			t.decision, t.reason, t.err, t.attrs = d, reason, err, attrs
		}
		return d, reason, err
	})
	a.f = newFilter(func(next http.Handler) http.Handler {
		return genericapifilters.WithAuthorization(next, traced, statusCodecs)
	})
	return a
}

func (authorization) Name() string { return record.StageAuthorization }

func (a *authorization) Run(ctx context.Context, req *Request) Result {
	if a.m.authzErr != nil {
		return Unknown(a.m.authzErr.Error())
	}
	if !a.m.state.Synced() {
		return Unknown("the cluster state (RBAC, the Node graph) has not synced yet")
	}
	if req.User == nil {
		return Unknown("the caller is not known (authentication was not replayed)")
	}
	if why := a.m.authzConfig.why(); why != "" {
		return Unknown(why)
	}
	tr := &authzTrace{}
	var children []record.StageResult
	var quiet quietMembers
	out := a.f.run(readOnlyRequestFor(context.WithValue(context.WithValue(context.WithValue(ctx,
		childrenKey{}, &children), quietAuthorizersKey{}, &quiet), authzTraceKey{}, tr), req, req.User))
	quiet.annotate(ctx, quietAuthorizersAttr)
	if out.passed {
		// The identity is the record's request.user and groups, unless
		// the request impersonates: then it is said here.
		who := ""
		if impersonates(req) {
			who = " for " + describeUser(req.User)
		}
		why := ": " + tr.reason
		if tr.reason == "" {
			why = ": an authorizer allowed it"
			if m := passedChild(children); m != "" {
				why = " by " + m
			}
		}
		res := withChildren(children, Pass("allowed"+who+why+rbacExplainer{a.m.state}.explainAllow(tr.reason, tr.attrs)))
		if late := a.authorizedLate(ctx, req, true); late != "" {
			return unknownNow(res, late)
		}
		res.Recheck = a.webhookCacheRecheck(children, true)
		return res
	}
	st := out.status()
	why := firstNonEmpty(tr.reason, "no authorizer in the chain allowed it")
	if tr.err != nil {
		why += fmt.Sprintf(" (authorizer error: %v)", tr.err)
	}
	res := withChildren(children, Reject(st, fmt.Sprintf("denied for %s: %s%s", describeUser(req.User), why,
		rbacExplainer{a.m.state}.explainDeny(req.User, tr.attrs))))
	if late := a.authorizedLate(ctx, req, false); late != "" {
		return unknownNow(res, late)
	}
	res.Recheck = a.webhookCacheRecheck(children, false)
	return res
}

// webhookCacheRecheck is the Recheck of a verdict (allowed, or not) that
// asked a webhook authorizer, or nil when none was asked. The apiserver
// keeps a webhook's verdicts (its authorizedTTL and unauthorizedTTL)
// from its own calls, which kproxy's calls do not share: a request sent
// past kproxy, to another replica, or before kproxy started filled it,
// and the webhook may answer otherwise by the replay's call (found by a
// probe: a webhook that changed its mind, the apiserver answering from
// its cache for 40 s: predicted 403 for 200, and 200 for 403 for 20 s).
// An answer that contradicts the replay's verdict is unknown.
func (a *authorization) webhookCacheRecheck(children []record.StageResult, allowed bool) func(Answer) string {
	var asked []string
	for _, c := range children {
		if a.m.webhookAuthorizers[c.Name] && c.Explanation != notAskedChild {
			asked = append(asked, fmt.Sprintf("%q", c.Name))
		}
	}
	if len(asked) == 0 {
		return nil
	}
	return func(aw Answer) string {
		var theirs, ours string
		switch {
		case allowed && aw.Status == http.StatusForbidden && authorizerRefusal(aw.Refusal) && !impersonationRefusal(aw.Refusal):
			theirs, ours = "refused", "allows"
		case !allowed && answeredAfterAuthorization(aw.Status):
			theirs, ours = "allowed", "denies"
		default:
			return ""
		}
		return fmt.Sprintf("the apiserver's authorization %s the request (it answered %d), and the replay's %s it, having asked the webhook authorizer %s: "+
			"the apiserver keeps a webhook's verdicts from its own calls (its authorizedTTL and unauthorizedTTL), which kproxy's calls do not share, "+
			"and the webhook may answer otherwise now, so the verdict on arrival is not known", theirs, aw.Status, ours, strings.Join(asked, ", "))
	}
}

// impersonates reports a request that runs as another identity than its
// authenticated caller's.
func impersonates(req *Request) bool {
	if req.Caller == nil || req.User == nil {
		return false
	}
	return req.Caller.GetName() != req.User.GetName() || req.Caller.GetUID() != req.User.GetUID() ||
		!slices.Equal(req.Caller.GetGroups(), req.User.GetGroups()) || !maps.EqualFunc(req.Caller.GetExtra(), req.User.GetExtra(), slices.Equal)
}

// withChildren attaches each authorizer's verdict to the stage's result.
func withChildren(children []record.StageResult, r Result) Result {
	r.Children = children
	return r
}
