package stages

import (
	"context"
	"fmt"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/apimachinery/pkg/util/wait"
	apiserverconfig "k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/request/anonymous"
	"k8s.io/apiserver/pkg/authentication/request/union"
	kubeauthenticator "k8s.io/kubernetes/pkg/kubeapiserver/authenticator"
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/internal/record"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// authenticatorMember is one kind of authenticator kube-apiserver unions,
// built by kubeauthenticator.Config.New from a config holding only that
// kind, so the replay can watch each one answer.
type authenticatorMember struct {
	name  string
	authn authenticator.Request
}

// buildAuthenticatorChain assembles kube-apiserver's authenticator as a
// union of per-kind members, in Config.New's order (front proxy, x509,
// token file, service accounts, bootstrap tokens, JWT, token webhook),
// with anonymous behind union.NewFailOnError as there. Config.New puts all
// token authenticators behind one bearer-token reader; one per kind gives
// the same verdict (the first authenticator that accepts wins; a credential
// none accepts is an error, so 401; none at all is anonymous), and each
// kind's own answer becomes visible.
func buildAuthenticatorChain(ctx context.Context, ac kubeauthenticator.Config) (authenticator.Request, []authenticatorMember, error) {
	shared := func() kubeauthenticator.Config {
		return kubeauthenticator.Config{
			APIAudiences:         ac.APIAudiences,
			TokenSuccessCacheTTL: ac.TokenSuccessCacheTTL,
			TokenFailureCacheTTL: ac.TokenFailureCacheTTL,
			APIServerID:          ac.APIServerID,
			CustomDial:           ac.CustomDial,
			EgressLookup:         ac.EgressLookup,
		}
	}
	kinds := []struct {
		name    string
		present bool
		only    func(c *kubeauthenticator.Config)
	}{
		{"front-proxy", ac.RequestHeaderConfig != nil, func(c *kubeauthenticator.Config) { c.RequestHeaderConfig = ac.RequestHeaderConfig }},
		{"x509", ac.ClientCAContentProvider != nil, func(c *kubeauthenticator.Config) { c.ClientCAContentProvider = ac.ClientCAContentProvider }},
		{"token-file", ac.TokenAuthFile != "", func(c *kubeauthenticator.Config) { c.TokenAuthFile = ac.TokenAuthFile }},
		{"service-account", ac.ServiceAccountPublicKeysGetter != nil, func(c *kubeauthenticator.Config) {
			c.ServiceAccountPublicKeysGetter, c.ServiceAccountIssuers = ac.ServiceAccountPublicKeysGetter, ac.ServiceAccountIssuers
			c.ServiceAccountLookup, c.ServiceAccountTokenGetter, c.SecretsWriter = ac.ServiceAccountLookup, ac.ServiceAccountTokenGetter, ac.SecretsWriter
		}},
		{"bootstrap-token", ac.BootstrapToken && ac.BootstrapTokenAuthenticator != nil, func(c *kubeauthenticator.Config) {
			c.BootstrapToken, c.BootstrapTokenAuthenticator = true, ac.BootstrapTokenAuthenticator
		}},
		{"jwt", ac.AuthenticationConfig != nil && len(ac.AuthenticationConfig.JWT) > 0, func(c *kubeauthenticator.Config) {
			jwtOnly := &apiserverconfig.AuthenticationConfiguration{JWT: ac.AuthenticationConfig.JWT}
			c.AuthenticationConfig, c.AuthenticationConfigData, c.OIDCSigningAlgs = jwtOnly, ac.AuthenticationConfigData, ac.OIDCSigningAlgs
			// The JWT authenticator refuses the service-account issuers.
			c.ServiceAccountIssuers = ac.ServiceAccountIssuers
		}},
		{"token-webhook", ac.WebhookTokenAuthnConfigFile != "", func(c *kubeauthenticator.Config) {
			c.WebhookTokenAuthnConfigFile, c.WebhookTokenAuthnVersion = ac.WebhookTokenAuthnConfigFile, ac.WebhookTokenAuthnVersion
			c.WebhookTokenAuthnCacheTTL, c.WebhookRetryBackoff = ac.WebhookTokenAuthnCacheTTL, onceBackoff(ac.WebhookRetryBackoff)
		}},
	}
	var members []authenticatorMember
	for _, k := range kinds {
		if !k.present {
			continue
		}
		c := shared()
		k.only(&c)
		a, _, _, _, err := c.New(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("build the apiserver's %s authenticator: %w", k.name, err)
		}
		if a != nil {
			members = append(members, authenticatorMember{name: k.name, authn: a})
		}
	}
	if len(members) == 0 {
		if ac.Anonymous.Enabled {
			return anonymous.NewAuthenticator(ac.Anonymous.Conditions), members, nil
		}
		return nil, nil, nil
	}
	reqs := make([]authenticator.Request, len(members))
	for i := range members {
		reqs[i] = tracedAuthenticator{members[i]}
	}
	a := union.New(reqs...)
	if ac.Anonymous.Enabled {
		a = union.NewFailOnError(a, tracedAuthenticator{authenticatorMember{name: "anonymous", authn: anonymous.NewAuthenticator(ac.Anonymous.Conditions)}})
	}
	return a, members, nil
}

// onceBackoff is b with a single try. The apiserver retries a failing
// token webhook (five tries over a few seconds by default); the replay,
// calling it again for a request the apiserver has judged, tries once
// (found by a probe: with the webhook down, the apiserver answered from
// its cache and called it 0 times, while kproxy's replays called it about
// 85 times for 40 requests, 4.4 s each, and shed others). A failed call
// refuses the token, and when the apiserver authenticated it the record
// says unknown (authenticatedLate).
func onceBackoff(b *wait.Backoff) *wait.Backoff {
	if b == nil {
		return nil
	}
	once := *b
	once.Steps = 1
	return &once
}

// authnChildrenKey carries the per-authenticator results of one request.
type authnChildrenKey struct{}

type authnChildren struct {
	tracer  trace.Tracer
	clock   clock.PassiveClock
	results []record.StageResult
	// quiet are the authenticators that found no credential they read,
	// quickly: no span of their own (see member_trace.go).
	quiet quietMembers
}

// authnAccepted is the child of the authenticator that accepted the
// request: the stage's explanation names the identity.
const authnAccepted = "accepted"

// noCredentialChild explains the child of an authenticator that found no
// credential it reads in the request.
const noCredentialChild = "no credential it reads"

// noOpinionAttr is the authentication stage span's attribute that names
// the quiet authenticators.
const noOpinionAttr = "kproxy.authenticators.no_opinion"

// tracedAuthenticator runs one member and records what it said: a child
// in the record and, unless it found no credential it reads (quiet, see
// member_trace.go), a span.
type tracedAuthenticator struct{ m authenticatorMember }

func (t tracedAuthenticator) AuthenticateRequest(r *http.Request) (*authenticator.Response, bool, error) {
	ch, _ := r.Context().Value(authnChildrenKey{}).(*authnChildren)
	if ch == nil {
		return t.m.authn.AuthenticateRequest(r)
	}
	start := ch.clock.Now()
	resp, ok, err := t.m.authn.AuthenticateRequest(r)
	took := ch.clock.Since(start)
	// The record's child is short where the stage says the rest: the
	// stage names the identity an authenticator accepted. The span keeps
	// the whole sentence (made only when the trace is recorded).
	res := record.StageResult{Name: t.m.name, DurationNs: took.Nanoseconds()}
	switch {
	case ok && err == nil:
		res.Outcome, res.Explanation = record.Pass, authnAccepted
	case err != nil:
		res.Outcome, res.Explanation = record.Reject, "rejected: "+err.Error()
	default:
		res.Outcome, res.Explanation = record.Skip, noCredentialChild
	}
	ch.results = append(ch.results, res)
	if !trace.SpanFromContext(r.Context()).IsRecording() {
		return resp, ok, err
	}
	if res.Outcome == record.Skip && ch.quiet.fold(t.m.name, took) {
		return resp, ok, err
	}
	detail := res.Explanation
	switch res.Outcome {
	case record.Pass:
		detail = "accepted: " + describeUser(resp.User)
	case record.Skip:
		detail = "no opinion: the request carries no credential it reads"
	}
	memberSpan(r.Context(), ch.tracer, "authenticator "+t.m.name, start, took,
		attribute.String("kproxy.authenticator.outcome", res.Outcome), attribute.String("kproxy.authenticator.explanation", detail))
	return resp, ok, err
}

// APIServerAuthenticator is kube-apiserver's request authenticator exactly
// as Config.New builds it from the mirrored flags (one union, anonymous
// behind it), for the authenticators that need no cluster state:
// front-proxy, x509, token file, token webhook and JWT. Tests hold kproxy's
// own forwarding decisions against it. Service-account and bootstrap
// tokens need the cluster's state and are left out.
func APIServerAuthenticator(ctx context.Context, o *apiserver.Options) (authenticator.Request, error) {
	ac, err := o.Authentication.ToAuthenticationConfig()
	if err != nil {
		return nil, fmt.Errorf("authentication flags: %w", err)
	}
	ac.ServiceAccountPublicKeysGetter, ac.BootstrapToken = nil, false
	ac.APIServerID = apiserver.ServerID
	a, _, _, _, err := ac.New(ctx)
	return a, err
}
