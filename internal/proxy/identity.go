package proxy

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/net/http/httpguts"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/group"
	"k8s.io/apiserver/pkg/authentication/request/headerrequest"
	"k8s.io/apiserver/pkg/authentication/request/union"
	x509request "k8s.io/apiserver/pkg/authentication/request/x509"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/cel"
	"k8s.io/apiserver/pkg/endpoints/filters"
	"k8s.io/apiserver/pkg/endpoints/filters/impersonation"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/plugin/pkg/authorizer/webhook"
	webhookmetrics "k8s.io/apiserver/plugin/pkg/authorizer/webhook/metrics"
	authorizationv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"

	"github.com/kproxy/kproxy/internal/credential"
	"github.com/kproxy/kproxy/internal/decode"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/stages"
)

// How kproxy forwards a caller (record.Identity).
const (
	IdentityToken       = "token"
	IdentityCertificate = "certificate"
	IdentityAnonymous   = "anonymous"
	IdentityRejected    = "rejected"
)

// identity is who the caller is, as far as kproxy must know to forward.
type identity struct {
	kind string
	user user.Info // certificate callers only
	err  error     // why a rejected caller was rejected
	cred credential.Presented
	// token is the SHA-256 of a token caller's bearer token (callers.go).
	token tokenKey
}

// statusCodecs encode the Status bodies kproxy answers with itself.
var statusCodecs = decode.StatusCodecs()

// RequestHeaderOptions mirror kube-apiserver's --requestheader-* flags.
type RequestHeaderOptions struct {
	ClientCA            *x509.CertPool
	AllowedNames        []string
	UsernameHeaders     []string
	UIDHeaders          []string
	GroupHeaders        []string
	ExtraHeaderPrefixes []string
}

// NewCertAuthenticator builds the apiserver's certificate authenticators in
// kube-apiserver's order: the front-proxy (requestheader) authenticator,
// then x509 against the client CA. Either may be nil/absent.
func NewCertAuthenticator(clientCA *x509.CertPool, rh *RequestHeaderOptions) authenticator.Request {
	var auths []authenticator.Request
	if rh != nil && rh.ClientCA != nil {
		opts := x509request.DefaultVerifyOptions()
		opts.Roots = rh.ClientCA
		verify := func() (x509.VerifyOptions, bool) { return opts, true }
		auths = append(auths, headerrequest.NewDynamicVerifyOptionsSecure(verify,
			headerrequest.StaticStringSlice(rh.AllowedNames),
			headerrequest.StaticStringSlice(orDefault(rh.UsernameHeaders, "X-Remote-User")),
			headerrequest.StaticStringSlice(orDefault(rh.UIDHeaders)),
			headerrequest.StaticStringSlice(orDefault(rh.GroupHeaders, "X-Remote-Group")),
			headerrequest.StaticStringSlice(orDefault(rh.ExtraHeaderPrefixes, "X-Remote-Extra-"))))
	}
	if clientCA != nil {
		opts := x509request.DefaultVerifyOptions()
		opts.Roots = clientCA
		auths = append(auths, x509request.New(opts, x509request.CommonNameUserConversion))
	}
	if len(auths) == 0 {
		return nil
	}
	return union.New(auths...)
}

func orDefault(v []string, d ...string) []string {
	if len(v) > 0 {
		return v
	}
	return d
}

// NewImpersonationAuthorizer answers "may this caller impersonate X?" with
// SubjectAccessReviews against the upstream, using the apiserver's own
// webhook authorizer. Nothing is cached: the apiserver checks impersonation
// on every request, so a revoked permission stops at once there, and a
// cached allow would keep it working through kproxy. (A negative TTL makes
// every cache entry expired on arrival; TestImpersonationIsNotCached holds
// that.) This costs one review per impersonated attribute, only for
// certificate callers that send Impersonate-* headers themselves.
func NewImpersonationAuthorizer(client authorizationv1client.AuthorizationV1Interface) (authorizer.UnconditionalAuthorizer, error) {
	const never = -time.Nanosecond
	return webhook.NewFromInterface(client, never, never,
		wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Steps: 3},
		authorizer.DecisionDeny, webhookmetrics.NoopAuthorizerMetrics{}, cel.NewDefaultCompiler())
}

// identify works out how to forward the caller, following the apiserver's
// authenticator union: certificate authenticators first (first success
// wins), then the token authenticators; only a request with no credential
// at all is anonymous. A rejected certificate may be dropped only when the
// token authenticators will decide the request upstream (a token the
// apiserver reads, package credential): an Authorization header the
// apiserver ignores (Basic, junk, an empty Bearer) does not make a
// credential, and forwarding such a request without the certificate would
// turn the apiserver's 401 into system:anonymous.
func (p *Proxy) identify(r *http.Request) identity {
	cred := credential.Inspect(r)
	var certErr error
	if cred.HasCertificate() {
		if p.certAuth == nil {
			certErr = errors.New("the client presented a certificate but kproxy has no --client-ca-file to verify it with (start kproxy with the apiserver's --client-ca-file)")
		} else {
			resp, ok, err := p.certAuth.AuthenticateRequest(r)
			if ok && err == nil {
				return identity{kind: IdentityCertificate, user: resp.User}
			}
			certErr = err
			if certErr == nil {
				certErr = errors.New("the client certificate was not accepted by any certificate authenticator")
			}
		}
	}
	switch {
	case cred.HasTokenCredential():
		return identity{kind: IdentityToken, token: keyOfToken(cred.Token)}
	case cred.HasCertificate():
		return identity{kind: IdentityRejected, err: certErr, cred: cred}
	}
	return identity{kind: IdentityAnonymous}
}

// authenticatedGroups are a certificate caller's groups as the
// apiserver's authentication resolves them, for the record: kproxy
// verifies the certificate with the x509 authenticator alone, and the
// apiserver's chain then adds system:authenticated (its
// AuthenticatedGroupAdder, run here; probe R: a flow filter on
// ~g system:authenticated missed every certificate caller). The caller
// kproxy forwards as keeps the groups its certificate names.
func authenticatedGroups(u user.Info) []string {
	resp, ok, err := group.NewAuthenticatedGroupAdder(authenticator.RequestFunc(func(*http.Request) (*authenticator.Response, bool, error) {
		return &authenticator.Response{User: u}, true, nil
	})).AuthenticateRequest(nil)
	if !ok || err != nil {
		return u.GetGroups()
	}
	return resp.User.GetGroups()
}

// authenticated is u as the apiserver's authentication hands it to the
// filters after it, impersonation's included: with system:authenticated
// (its AuthenticatedGroupAdder). The impersonation filter asks the
// authorizer with these groups (found by a probe: a grant of impersonate
// to system:authenticated was refused to a certificate caller through
// kproxy, allowed directly).
func authenticated(u user.Info) user.Info {
	return &user.DefaultInfo{Name: u.GetName(), UID: u.GetUID(), Groups: authenticatedGroups(u), Extra: u.GetExtra()}
}

// unauthorized answers a rejected certificate exactly as the apiserver's
// authentication filter does.
func unauthorized(w http.ResponseWriter, r *http.Request, info *apirequest.RequestInfo) {
	r = r.WithContext(apirequest.WithRequestInfo(r.Context(), info))
	filters.Unauthorized(statusCodecs).ServeHTTP(w, r)
}

// impersonationNext carries the per-request continuation through the
// long-lived impersonation filter.
type impersonationNext struct{}

// newImpersonationFilter builds the apiserver's impersonation filter once.
// It must live as long as kproxy: the filter remembers, per user, which
// impersonation mode (constrained or legacy) last succeeded and tries it
// first, and that choice shapes the message of a later 403 exactly as it
// does in the apiserver.
func newImpersonationFilter(authz authorizer.UnconditionalAuthorizer) http.Handler {
	return impersonation.WithConstrainedImpersonation(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, _ := apirequest.UserFrom(r.Context())
		next := r.Context().Value(impersonationNext{}).(func(http.ResponseWriter, *http.Request, user.Info))
		next(w, r, u)
	}), authz, statusCodecs)
}

// The apiserver's constrained impersonation keeps a success 10 s (for
// each mode, by caller and wanted user): a caller allowed once is allowed
// again, without asking the authorizer, for 10 s, whatever RBAC says
// since. kproxy decides a certificate caller's impersonation itself (the
// apiserver sees kproxy impersonating whom the caller may act as), and
// its long-lived filter kept successes alike: a caller whose right to
// impersonate was revoked was refused directly (the apiserver's cache
// held nothing for it) and allowed through kproxy for 10 s more (found by
// a probe). So what the long-lived filter allows is asked again of a
// filter with nothing cached, which is final: kproxy never allows on a
// success it remembers. The long-lived filter is kept for its refusals'
// words (the mode it tries first is the one that last let the caller
// through, as in the apiserver).

// withCallerImpersonation runs the apiserver's impersonation filter for a
// certificate caller that sent Impersonate-* headers itself. next is called
// with the user the caller may act as; otherwise the filter has already
// answered (403, or 400 for malformed headers).
func (p *Proxy) withCallerImpersonation(w http.ResponseWriter, r *http.Request, info *apirequest.RequestInfo, caller user.Info, next func(w http.ResponseWriter, r *http.Request, u user.Info)) {
	if p.impersonationFilter == nil {
		// Without an authorizer kproxy cannot check the caller's right to
		// impersonate, so it refuses rather than widen access.
		err := apierrors.NewForbidden(schema.GroupResource{Resource: "users"}, r.Header.Get(authenticationv1.ImpersonateUserHeader),
			errors.New("kproxy cannot authorize Impersonate-* headers from a certificate caller without upstream credentials to ask SubjectAccessReviews with (give kproxy --upstream-kubeconfig)"))
		responsewriters.ErrorNegotiated(err, statusCodecs, schema.GroupVersion{Group: info.APIGroup, Version: info.APIVersion}, w, r)
		return
	}
	ctx := apirequest.WithRequestInfo(r.Context(), info)
	ctx = apirequest.WithUser(ctx, caller)
	// The filter takes the Impersonate-* headers off the request: keep
	// them to ask again.
	sent := r.Header.Clone()
	confirm := func(w http.ResponseWriter, _ *http.Request, _ user.Info) {
		again := r.WithContext(context.WithValue(ctx, impersonationNext{}, next))
		again.Header = sent // a shallow copy's own header: r's is not touched
		newImpersonationFilter(p.impersonationAuthz).ServeHTTP(w, again)
	}
	p.impersonationFilter.ServeHTTP(w, r.WithContext(context.WithValue(ctx, impersonationNext{}, confirm)))
}

// forwardAs forwards r by impersonating u, the certificate caller or whom
// it may act as, unless no impersonation makes the apiserver see u
// exactly: then kproxy refuses it (403) rather than forward it as someone
// else, who may be granted more.
func (p *Proxy) forwardAs(w http.ResponseWriter, r *http.Request, ex *exchange, u user.Info) {
	padded, why := forwardable(u, r.Header.Get("Upgrade") != "")
	if why == "" {
		ex.actAs, ex.padded = u, padded
		p.forward(w, r, ex)
		return
	}
	if r.Body != nil {
		// The replay says what the apiserver would have answered: it
		// needs the body the apiserver would have read.
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, stages.MaxBodyBytes+1))
	}
	ex.answeredHere(w, record.ErrorUnforwardable+why)
	p.perRequestLog.Warn("caller refused: kproxy cannot forward its identity exactly", "id", ex.rec.ID, "user", u.GetName(), "reason", why)
	err := &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden,
		Message: "kproxy cannot forward this request as its caller: " + why + "; kproxy forwards a client certificate's caller by impersonation, and " +
			"refuses rather than forward it as someone else: send it to the apiserver directly"}}
	responsewriters.ErrorNegotiated(err, statusCodecs, schema.GroupVersion{Group: ex.info.APIGroup, Version: ex.info.APIVersion}, w, r)
}

// hasImpersonation reports client-sent Impersonate-* headers.
func hasImpersonation(h http.Header) bool {
	for k := range h {
		if strings.HasPrefix(k, "Impersonate-") {
			return true
		}
	}
	return false
}

// setImpersonation replaces any Impersonate-* and front-proxy headers with
// the headers that make the apiserver see u exactly, as it sees the caller
// when it authenticates it itself. Every group is sent, system:authenticated
// too (directGroups): an impersonation that names no group gets the
// apiserver's defaults for the name, which are not the authenticator's (a
// service account's groups for a name shaped like one, system:nodes for a
// node's). forwardable says beforehand what no header can carry.
func setImpersonation(h http.Header, u user.Info) {
	for k := range h {
		if strings.HasPrefix(k, "Impersonate-") || strings.HasPrefix(k, "X-Remote-") {
			delete(h, k)
		}
	}
	h.Del("Authorization")
	h.Set(authenticationv1.ImpersonateUserHeader, u.GetName())
	if uid := u.GetUID(); uid != "" {
		h.Set(authenticationv1.ImpersonateUIDHeader, uid)
	}
	for _, g := range directGroups(u) {
		h.Add(authenticationv1.ImpersonateGroupHeader, g)
	}
	for k, vs := range u.GetExtra() {
		name := authenticationv1.ImpersonateUserExtraHeaderPrefix + extraKeyEscape(k)
		for _, v := range vs {
			h.Add(name, v)
		}
	}
}

// directGroups are u's groups as the apiserver's authenticator union gives
// them to a caller it authenticates itself (AuthenticatedGroupAdder):
// system:authenticated is added for every user but system:anonymous,
// unless a group says authenticated or unauthenticated already. For a user
// that came out of the impersonation filter, they are its groups.
func directGroups(u user.Info) []string {
	groups := u.GetGroups()
	if u.GetName() == user.Anonymous || slices.Contains(groups, user.AllAuthenticated) || slices.Contains(groups, user.AllUnauthenticated) {
		return groups
	}
	return append(slices.Clip(groups), user.AllAuthenticated)
}

// forwardable says why no impersonation makes the apiserver see u
// exactly as it would see the caller directly, or "", and whether a value
// of u has spaces around it. kproxy refuses what it cannot forward (403)
// rather than forward it as someone else: an identity changed on the way
// can be granted what the caller is not (a padded " system:masters"
// group, trimmed, is system:masters).
//   - An impersonated system:anonymous always gets system:unauthenticated,
//     which a certificate for system:anonymous does not carry unless it
//     names it.
//   - A header value cannot carry control characters.
//   - HTTP/1.1 trims the spaces around a header's value (HTTP/2 does not:
//     such a request goes upstream over HTTP/2, exchange.padded); an
//     upgrade (exec, attach, port-forward) only goes over HTTP/1.1.
func forwardable(u user.Info, upgrade bool) (padded bool, why string) {
	name := u.GetName()
	if name == "" {
		return false, "the caller's user name is empty, and an impersonation without a user name is refused"
	}
	if name == user.Anonymous && !slices.Contains(u.GetGroups(), user.AllUnauthenticated) {
		return false, fmt.Sprintf("the apiserver adds the group %s to an impersonated %s, and this caller (groups %q) is not in it", user.AllUnauthenticated, user.Anonymous, u.GetGroups())
	}
	check := func(v string) string {
		switch {
		case !httpguts.ValidHeaderFieldValue(v):
			return fmt.Sprintf("the caller's identity has %q, with a character no HTTP header can carry", v)
		case isPadded(v) && upgrade:
			return fmt.Sprintf("the caller's identity has %q, with spaces around it, which an upgrade's request (HTTP/1.1) does not carry", v)
		}
		padded = padded || isPadded(v)
		return ""
	}
	if why := check(name); why != "" {
		return false, why
	}
	if why := check(u.GetUID()); why != "" {
		return false, why
	}
	for _, g := range u.GetGroups() {
		if why := check(g); why != "" {
			return false, why
		}
	}
	for k, vs := range u.GetExtra() {
		if why := check(k); why != "" {
			return false, why
		}
		for _, v := range vs {
			if why := check(v); why != "" {
				return false, why
			}
		}
	}
	return padded, ""
}

// isPadded reports a value with spaces or tabs around it.
func isPadded(v string) bool {
	return v != "" && (isSpace(v[0]) || isSpace(v[len(v)-1]))
}

func isSpace(b byte) bool { return b == ' ' || b == '\t' }

// paddedImpersonation reports an Impersonate-* header with spaces around a
// value: HTTP/1.1 would trim them on the way to the apiserver (a client
// sends them over HTTP/2 only), so the request goes over HTTP/2
// (exchange.padded).
func paddedImpersonation(h http.Header) bool {
	for k, vs := range h {
		if strings.HasPrefix(k, "Impersonate-") && slices.ContainsFunc(vs, isPadded) {
			return true
		}
	}
	return false
}

// extraKeyEscape escapes an extra's key for an Impersonate-Extra- header
// name: every byte that is not a token character, %, and every capital
// letter, as %XX. The apiserver lowercases the header's name, then
// unescapes the key with url.PathUnescape, so a capital sent as is
// arrives lowercased (client-go sends them so: a key "Abc" arrives
// "abc", and "K" merges with "k"; a certificate caller's own key must
// arrive as the caller's).
func extraKeyEscape(k string) string {
	var b strings.Builder
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c < utf8.RuneSelf && c != '%' && (c < 'A' || c > 'Z') && httpguts.IsTokenRune(rune(c)) {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}
