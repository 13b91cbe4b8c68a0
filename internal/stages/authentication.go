package stages

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/endpoints/filters"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"

	"github.com/kproxy/kproxy/internal/credential"
	"github.com/kproxy/kproxy/internal/record"
)

// authentication replays the authentication stage: the apiserver's own
// WithAuthentication filter around the authenticator union kube-apiserver
// builds from its flags (front-proxy, x509, token file, service accounts,
// bootstrap tokens, OIDC/JWT, webhook, anonymous), so a predicted 401 is
// the apiserver's own. Before it, it runs the one filter of the
// apiserver's chain that refuses a request before authentication: the
// request deadline's parse of the timeout parameter.
type authentication struct {
	m        *machinery
	f        *filter
	deadline *filter
	// pastCache are the Rechecks of a pass by each token member behind
	// the token cache (refusedPastCache), made once.
	pastCache map[string]func(Answer) string
}

// authnTrace records what the authenticator union said for one request.
type authnTrace struct {
	resp *authenticator.Response
	ok   bool
	err  error
}

type authnTraceKey struct{}

func newAuthentication(m *machinery) Stage {
	a := &authentication{m: m, deadline: newFilter(func(next http.Handler) http.Handler {
		// The deadline it sets is the apiserver's business, not the
		// replay's (kproxy's budget bounds the replay): only whether it
		// refuses counts, so the maximum given here is never used.
		return filters.WithRequestDeadline(next, nil, nil, longRunning, statusCodecs, time.Minute)
	})}
	if m.authn == nil {
		return a
	}
	if m.tokenSuccessTTL > 0 {
		a.pastCache = map[string]func(Answer) string{}
		for member := range cachedTokenMembers {
			a.pastCache[member] = a.refusedPastCache(member)
		}
	}
	traced := authenticator.RequestFunc(func(r *http.Request) (*authenticator.Response, bool, error) {
		resp, ok, err := m.authn.AuthenticateRequest(r)
		if t, _ := r.Context().Value(authnTraceKey{}).(*authnTrace); t != nil {
			t.resp, t.ok, t.err = resp, ok, err
		}
		return resp, ok, err
	})
	a.f = newFilter(func(next http.Handler) http.Handler {
		return filters.WithAuthentication(next, traced, filters.Unauthorized(statusCodecs), m.apiAudiences, m.requestHeader)
	})
	return a
}

func (authentication) Name() string { return record.StageAuthentication }

func (a *authentication) Run(ctx context.Context, req *Request) Result {
	if r, refused := a.refusedTimeout(ctx, req); refused {
		return r
	}
	if req.Given != nil {
		// A test case names its identity: there is no credential to
		// check, and the apiserver's union adds system:authenticated.
		u := withAuthenticatedGroup(req.Given)
		req.User, req.Caller = u, u
		return Pass(fmt.Sprintf("the test case gives the identity %s (authentication is not replayed: there is no credential to check)", describeUser(u)))
	}
	if a.m.authnErr != nil {
		return Unknown(a.m.authnErr.Error())
	}
	if !a.m.state.Synced() {
		return Unknown("the cluster state (service accounts, pods, nodes) has not synced yet")
	}
	if a.m.bootstrapTokens && !a.m.state.SecretsSynced() && bootstrapTokenLike(req.HTTP) {
		why := "the bootstrap-token Secrets in kube-system have not synced yet, and the request's bearer token has a bootstrap token's form"
		if err := a.m.state.SecretsErr(); err != nil {
			why += fmt.Sprintf(" (kproxy's list of them fails: %v)", err)
		}
		return Unknown(why)
	}
	tr := &authnTrace{}
	ch := &authnChildren{tracer: a.m.tracer, clock: a.m.clock}
	out := a.f.run(requestFor(context.WithValue(context.WithValue(ctx, authnChildrenKey{}, ch), authnTraceKey{}, tr), req, nil))
	ch.quiet.annotate(ctx, noOpinionAttr)
	children := a.notAsked(ch.results)
	if out.passed {
		u, _ := apirequest.UserFrom(out.req.Context())
		req.User, req.Caller = u, u
		// The front-proxy authenticator consumes its headers.
		viaFrontProxy := a.m.requestHeader != nil && req.HTTP.Header.Get("X-Remote-User") != "" && out.req.Header.Get("X-Remote-User") == ""
		// Described before the token's subprotocol goes (a probe: a
		// WebSocket's bearer protocol was "a request without
		// credentials").
		sent := credentialKind(req.HTTP)
		tokenProtocolOut(req, out.req)
		member := passedChild(children)
		if changed := a.m.authnConfig.why(); changed != "" && (member == "jwt" || member == "anonymous") {
			// The file holds the JWT authenticators and the anonymous
			// rules: other members' verdicts do not depend on it.
			return withChildren(children, Unknown(changed))
		}
		res := Pass(fmt.Sprintf("%s authenticated %s as %s", acceptedBy(u, req.HTTP, viaFrontProxy, member), sent, describeUser(u)))
		res.Children = children
		res.Recheck = a.pastCache[member]
		return res
	}
	if changed := a.m.authnConfig.why(); changed != "" {
		// A JWT authenticator (or the anonymous rules) of the file as the
		// apiserver has it now may accept what the one kproxy read refuses.
		return withChildren(children, Unknown(changed))
	}
	why := "no authenticator accepted the request's credentials"
	if tr.err != nil {
		why = tr.err.Error()
	} else if tr.ok && tr.resp != nil {
		why = fmt.Sprintf("the credentials are valid for audiences %v, but the apiserver accepts %v", tr.resp.Audiences, a.m.apiAudiences)
	}
	if t := a.m.describeToken(req.HTTP, req.Arrival); t != "" {
		why += "\n" + t
	}
	res := Reject(out.status(), fmt.Sprintf("%s rejected: %s", credentialKind(req.HTTP), why))
	res.Children = children
	if late := a.authenticatedLate(ctx, req, tr.err, children); late != "" {
		return unknownNow(res, late)
	}
	return res
}

// tokenProtocolOut hands the stages after authentication the request
// without the WebSocket subprotocol that carried its token, as the
// apiserver's WebSocket authenticator leaves it (filtered, the
// authentication filter's copy of the request, once it accepted the
// token): the handshake is offered the others (found by a probe: a
// browser's watch, "base64.binary.k8s.io" and the token's subprotocol,
// answered 101 and predicted 400 for two subprotocols). The replay's own
// copy is replaced, never the request kproxy forwards.
func tokenProtocolOut(req *Request, filtered *http.Request) {
	const protocol = "Sec-Websocket-Protocol"
	kept := filtered.Header.Values(protocol)
	if slices.Equal(kept, req.HTTP.Header.Values(protocol)) {
		return
	}
	r := req.HTTP.Clone(req.HTTP.Context())
	r.Header[protocol] = kept
	req.HTTP = r
}

// cachedTokenMembers are the authenticators whose verdicts kube-apiserver
// keeps in its token cache (--token-success-cache-ttl, 10 s by default),
// and whose verdict on a token can change meanwhile: its objects (a
// service account, Secret, pod or node), a webhook's mind. The replay's
// members keep a cache of their own alike. (A --token-auth-file token's
// verdict does not change while both run.)
var cachedTokenMembers = map[string]bool{"service-account": true, "bootstrap-token": true, "jwt": true, "token-webhook": true}

// refusedPastCache is the Recheck of a token member accepted: the
// apiserver refused the token (401) that the replay's member accepted.
// Each caches a token's success from its own first check of it, the
// replay's after the apiserver's, so the replay's can still hold a token
// the apiserver has checked afresh and refused (found by a probe: a
// legacy token labelled invalid, sent again as the apiserver's cached
// success lapsed; the replay's, a few ms younger, predicted 200).
func (a *authentication) refusedPastCache(member string) func(Answer) string {
	return func(aw Answer) string {
		if aw.Status != http.StatusUnauthorized {
			return ""
		}
		return fmt.Sprintf("the apiserver refused the request's token (it answered 401), and the replay's %s authenticator accepts it: "+
			"each caches a token's success (for %v) from its own check of it, the replay's after the apiserver's, so the replay's may still hold "+
			"a token the apiserver checked again and refused (its service account, Secret, pod or node changed, or a legacy token's Secret was "+
			"labelled invalid, since the first check), so the state on arrival is not known", member, a.m.tokenSuccessTTL)
	}
}

// refusedTimeout runs kube-apiserver's WithRequestDeadline, which sits
// outside WithAuthentication in its handler chain: a request that is not
// long-running, whose timeout parameter time.ParseDuration refuses
// ("10", "1x"), is answered 400 before anyone asks who sent it, whatever
// its credentials, path or verb. A request with no timeout parameter
// passes it untouched, as does one that is a duration (client-go sends
// ?timeout=32s on every request): only the others run it.
func (a *authentication) refusedTimeout(ctx context.Context, req *Request) (Result, bool) {
	if req.Info == nil || req.HTTP == nil || !strings.Contains(req.HTTP.URL.RawQuery, "timeout") {
		return Result{}, false
	}
	if v := req.HTTP.URL.Query().Get("timeout"); v == "" {
		return Result{}, false
	} else if _, err := time.ParseDuration(v); err == nil {
		return Result{}, false
	}
	r := requestFor(ctx, req, nil)
	// The filter logs the URI it refuses: the path only, never a query
	// that may carry an access_token.
	r.RequestURI = r.URL.Path
	out := a.deadline.run(r)
	if out.passed {
		return Result{}, false
	}
	st := out.status()
	return Reject(st, "before authentication, the apiserver's request-deadline filter (WithRequestDeadline) refuses the timeout parameter, "+
		"which must be a duration such as 30s or 1m: "+st.Message), true
}

// withAuthenticatedGroup adds system:authenticated, as the apiserver's
// authenticator union does for every identity but anonymous.
func withAuthenticatedGroup(u user.Info) user.Info {
	if u.GetName() == user.Anonymous || slices.Contains(u.GetGroups(), user.AllAuthenticated) {
		return u
	}
	return &user.DefaultInfo{Name: u.GetName(), UID: u.GetUID(), Extra: u.GetExtra(),
		Groups: append(slices.Clone(u.GetGroups()), user.AllAuthenticated)}
}

// credentialKind names what the request presented, never its value.
func credentialKind(r *http.Request) string { return credential.Inspect(r).Describe() }

// describeUser renders an identity for explanations: name, uid, groups,
// extras (extras such as credential ids are hashes, not secrets).
func describeUser(u user.Info) string {
	if u == nil {
		return "nobody"
	}
	s := fmt.Sprintf("user %q", u.GetName())
	if uid := u.GetUID(); uid != "" {
		s += fmt.Sprintf(" (uid %q)", uid)
	}
	s += fmt.Sprintf(" in groups %v", u.GetGroups())
	if ex := u.GetExtra(); len(ex) > 0 {
		keys := make([]string, 0, len(ex))
		for k := range ex {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var parts []string
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s=%v", k, ex[k]))
		}
		s += " with extras " + strings.Join(parts, ", ")
	}
	return s
}

// notAskedChild explains the child of a member a chain did not ask: one
// before it decided (its own child says so).
const notAskedChild = "not asked"

// passedChild names the first child that passed (the authenticator that
// accepted the request, the authorizer that allowed it), or "".
func passedChild(children []record.StageResult) string {
	for _, c := range children {
		if c.Outcome == record.Pass {
			return c.Name
		}
	}
	return ""
}

// notAsked completes the per-authenticator results with the members the
// union did not ask, because an earlier one accepted the request.
func (a *authentication) notAsked(results []record.StageResult) []record.StageResult {
	asked := map[string]bool{}
	for _, r := range results {
		asked[r.Name] = true
	}
	for _, m := range a.m.authnMembers {
		if !asked[m.name] {
			results = append(results, record.StageResult{Name: m.name, Outcome: record.Skip, Explanation: notAskedChild})
		}
	}
	return results
}

// bootstrapTokenLike says whether the request's bearer token has the form
// of a bootstrap token, the only tokens the bootstrap-token authenticator
// looks up.
func bootstrapTokenLike(r *http.Request) bool {
	if r == nil {
		return false
	}
	// As the apiserver's bearer-token authenticator reads the header.
	parts := strings.SplitN(strings.TrimSpace(r.Header.Get("Authorization")), " ", 3)
	return len(parts) >= 2 && strings.EqualFold(parts[0], "bearer") && bootstrapTokenRE.MatchString(parts[1])
}
