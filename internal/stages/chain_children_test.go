package stages

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kproxy/kproxy/internal/record"
)

// TestAuthorizerChainChildren checks what each authorizer's child says: the
// verdict, with a member's reason only where the stage's explanation does
// not give it (the stage gives the deciding member's reason, or every
// reason when none decides).
func TestAuthorizerChainChildren(t *testing.T) {
	member := func(name string, d authorizer.Decision, reason string, err error) chainMember {
		return chainMember{name: name, kind: "Test", authz: authorizer.AuthorizerFunc(func(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
			return d, reason, err
		})}
	}
	type child struct{ Name, Outcome, Explanation string }
	for _, tc := range []struct {
		name       string
		members    []chainMember
		decision   authorizer.Decision
		reason     string
		want       []child
		wantErrors bool
	}{
		{"the first allows", []chainMember{member("masters", authorizer.DecisionAllow, "", nil), member("node", authorizer.DecisionNoOpinion, "", nil), member("rbac", authorizer.DecisionAllow, "", nil)},
			authorizer.DecisionAllow, "", []child{{"masters", record.Pass, "allow"}, {"node", record.Skip, "not asked"}, {"rbac", record.Skip, "not asked"}}, false},
		{"a later one allows, with a reason", []chainMember{member("node", authorizer.DecisionNoOpinion, "node: not a node", nil), member("rbac", authorizer.DecisionAllow, `RBAC: allowed by RoleBinding "x/ns"`, nil), member("webhook", authorizer.DecisionAllow, "", nil)},
			authorizer.DecisionAllow, `RBAC: allowed by RoleBinding "x/ns"`,
			[]child{{"node", record.Skip, "no opinion: node: not a node"}, {"rbac", record.Pass, "allow"}, {"webhook", record.Skip, "not asked"}}, false},
		{"a deny with an error", []chainMember{member("webhook", authorizer.DecisionDeny, "webhook: no", errors.New("boom"))},
			authorizer.DecisionDeny, "webhook: no", []child{{"webhook", record.Reject, "deny (error: boom)"}}, true},
		{"no opinion from any: the stage gives every reason", []chainMember{member("node", authorizer.DecisionNoOpinion, "node: not a node", nil), member("rbac", authorizer.DecisionNoOpinion, "RBAC: no rule", errors.New("lister down"))},
			authorizer.DecisionNoOpinion, "node: not a node\nRBAC: no rule",
			[]child{{"node", record.Skip, "no opinion"}, {"rbac", record.Skip, "no opinion (error: lister down)"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &authorizerChain{members: tc.members, tracer: noop.NewTracerProvider().Tracer("test"), clock: clock.RealClock{}}
			// A child of an earlier call (the impersonation check) stays.
			children := []record.StageResult{{Name: "earlier", Explanation: "no opinion: kept"}}
			ctx := context.WithValue(context.Background(), childrenKey{}, &children)
			d, reason, err := c.Authorize(ctx, authorizer.AttributesRecord{User: &user.DefaultInfo{Name: "u"}, Verb: "get"})
			if d != tc.decision || reason != tc.reason || (err != nil) != tc.wantErrors {
				t.Errorf("decision %v %q %v, want %v %q (error: %v)", d, reason, err, tc.decision, tc.reason, tc.wantErrors)
			}
			if children[0].Explanation != "no opinion: kept" {
				t.Errorf("an earlier child changed: %+v", children[0])
			}
			var got []child
			for _, ch := range children[1:] {
				got = append(got, child{ch.Name, ch.Outcome, ch.Explanation})
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("children (-want +got):\n%s", d)
			}
		})
	}
}

// TestQuietAuthorizers: in the authorization stage (a quiet list in the
// context), a member with no opinion, no reason and under slowPlugin has
// no span and is named with its time; every other member has a span over
// the time it took. Elsewhere (impersonation's checks) every member asked
// has its span.
func TestQuietAuthorizers(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1e9, 0))
	member := func(name string, d authorizer.Decision, reason string, took time.Duration) chainMember {
		return chainMember{name: name, kind: "Test", authz: authorizer.AuthorizerFunc(func(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
			clk.Step(took)
			return d, reason, nil
		})}
	}
	members := []chainMember{
		member("node", authorizer.DecisionNoOpinion, "", 4*time.Microsecond),
		member("webhook", authorizer.DecisionNoOpinion, "webhook: not mine", 6*time.Microsecond),
		member("slow", authorizer.DecisionNoOpinion, "", 3*time.Millisecond),
		member("rbac", authorizer.DecisionAllow, "", 9*time.Microsecond),
	}
	for _, tc := range []struct {
		name      string
		inStage   bool
		wantQuiet quietMembers
		wantSpans []string
	}{
		{"authorization stage", true, []string{"node 4µs"}, []string{"authorizer webhook 6µs", "authorizer slow 3ms", "authorizer rbac 9µs"}},
		{"elsewhere", false, nil, []string{"authorizer node 4µs", "authorizer webhook 6µs", "authorizer slow 3ms", "authorizer rbac 9µs"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sr := tracetest.NewSpanRecorder()
			tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr)).Tracer("test")
			ctx, stage := tracer.Start(context.Background(), "authorization")
			var quiet quietMembers
			if tc.inStage {
				ctx = context.WithValue(ctx, quietAuthorizersKey{}, &quiet)
			}
			c := &authorizerChain{members: members, tracer: tracer, clock: clk}
			if d, _, _ := c.Authorize(ctx, authorizer.AttributesRecord{User: &user.DefaultInfo{Name: "u"}, Verb: "get"}); d != authorizer.DecisionAllow {
				t.Fatalf("decision %v, want allow", d)
			}
			stage.End()
			var spans []string
			for _, s := range sr.Ended() {
				if s.Name() != "authorization" {
					spans = append(spans, s.Name()+" "+s.EndTime().Sub(s.StartTime()).String())
				}
			}
			if d := cmp.Diff(tc.wantQuiet, quiet); d != "" {
				t.Errorf("quiet members (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.wantSpans, spans); d != "" {
				t.Errorf("spans (-want +got):\n%s", d)
			}
		})
	}
}

// TestAuthenticatorChildren checks each authenticator's child: the one
// that accepted says so (the stage names the identity), the others why
// they had nothing to say; a rejection keeps its error. In the trace, an
// authenticator that found no credential it reads in under slowPlugin
// has no span and is named, with its time, in the stage's
// noOpinionAttr; the others have a span over the time they took.
func TestAuthenticatorChildren(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1e9, 0))
	authn := func(ok bool, err error, took time.Duration) authenticator.Request {
		return authenticator.RequestFunc(func(*http.Request) (*authenticator.Response, bool, error) {
			clk.Step(took)
			if !ok {
				return nil, false, err
			}
			return &authenticator.Response{User: &user.DefaultInfo{Name: "alice", Groups: []string{"devs"}}}, true, nil
		})
	}
	sr := tracetest.NewSpanRecorder()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr)).Tracer("test")
	ctx, stage := tracer.Start(context.Background(), "authentication")
	ch := &authnChildren{tracer: tracer, clock: clk}
	r := httptest.NewRequest("GET", "/api", nil)
	r = r.WithContext(context.WithValue(ctx, authnChildrenKey{}, ch))
	for _, m := range []authenticatorMember{
		{"front-proxy", authn(false, nil, 3*time.Microsecond)},
		{"x509", authn(false, nil, 2*time.Millisecond)},
		{"token-webhook", authn(false, errors.New("unknown token"), 5*time.Microsecond)},
		{"token-file", authn(true, nil, 7*time.Microsecond)},
	} {
		_, _, _ = tracedAuthenticator{m}.AuthenticateRequest(r)
	}
	stage.End()
	// Each child has the time its authenticator took (a probe: all 0s in
	// the record, the real times only in the trace).
	want := []record.StageResult{
		{Name: "front-proxy", Outcome: record.Skip, DurationNs: 3000, Explanation: "no credential it reads"},
		{Name: "x509", Outcome: record.Skip, DurationNs: 2000000, Explanation: "no credential it reads"},
		{Name: "token-webhook", Outcome: record.Reject, DurationNs: 5000, Explanation: "rejected: unknown token"},
		{Name: "token-file", Outcome: record.Pass, DurationNs: 7000, Explanation: "accepted"},
	}
	if d := cmp.Diff(want, ch.results); d != "" {
		t.Errorf("children (-want +got):\n%s", d)
	}
	if got := passedChild(ch.results); got != "token-file" {
		t.Errorf("passedChild: %q", got)
	}
	if d := cmp.Diff(quietMembers{"front-proxy 3µs"}, ch.quiet); d != "" {
		t.Errorf("quiet authenticators (-want +got):\n%s", d)
	}
	type span struct {
		Name, Explanation string
		Took              time.Duration
	}
	var spans []span
	for _, s := range sr.Ended() {
		if s.Name() == "authentication" {
			continue
		}
		var expl string
		for _, kv := range s.Attributes() {
			if kv.Key == "kproxy.authenticator.explanation" {
				expl = kv.Value.AsString()
			}
		}
		if s.Parent().SpanID() != stage.SpanContext().SpanID() {
			t.Errorf("span %s is not the stage's child", s.Name())
		}
		spans = append(spans, span{s.Name(), expl, s.EndTime().Sub(s.StartTime())})
	}
	wantSpans := []span{
		{"authenticator x509", "no opinion: the request carries no credential it reads", 2 * time.Millisecond},
		{"authenticator token-webhook", "rejected: unknown token", 5 * time.Microsecond},
		{"authenticator token-file", `accepted: user "alice" in groups [devs]`, 7 * time.Microsecond},
	}
	if d := cmp.Diff(wantSpans, spans); d != "" {
		t.Errorf("authenticator spans (-want +got):\n%s", d)
	}
}

// TestAcceptedBy checks that the stage names the token authenticator that
// accepted an opaque token when the chain says which.
func TestAcceptedBy(t *testing.T) {
	r := httptest.NewRequest("GET", "/api", nil)
	r.Header.Set("Authorization", "Bearer opaque")
	u := &user.DefaultInfo{Name: "alice"}
	for member, want := range map[string]string{
		"token-file":    "a token authenticator (--token-auth-file)",
		"token-webhook": "a token authenticator (the token webhook)",
		"":              "a token authenticator (--token-auth-file, or the token webhook)",
	} {
		if got := acceptedBy(u, r, false, member); got != want {
			t.Errorf("member %q: %q, want %q", member, got, want)
		}
	}
	if got := acceptedBy(&user.DefaultInfo{Name: user.Anonymous}, r, false, "anonymous"); !strings.HasPrefix(got, "the anonymous authenticator") {
		t.Errorf("anonymous: %q", got)
	}
}

func TestImpersonates(t *testing.T) {
	alice := &user.DefaultInfo{Name: "alice", Groups: []string{"devs", "system:authenticated"}}
	for _, tc := range []struct {
		name         string
		caller, user user.Info
		want         bool
	}{
		{"the caller itself", alice, alice, false},
		{"an equal copy", alice, &user.DefaultInfo{Name: "alice", Groups: []string{"devs", "system:authenticated"}}, false},
		{"another user", alice, &user.DefaultInfo{Name: "bob"}, true},
		{"other groups", alice, &user.DefaultInfo{Name: "alice", Groups: []string{"admins"}}, true},
		{"extras", alice, &user.DefaultInfo{Name: "alice", Groups: alice.Groups, Extra: map[string][]string{"scope": {"x"}}}, true},
		{"no caller (a test case's identity)", nil, alice, false},
	} {
		if got := impersonates(&Request{Caller: tc.caller, User: tc.user}); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
