package stages

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/internal/record"
)

// authorizerChain is the apiserver's authorizer union, with each member
// observable: every member is the real authorizer kube-apiserver builds
// (Node with its graph, RBAC, Webhook, ABAC, AlwaysAllow/Deny, each made
// by authorizer.Config.New for that one entry of the authorization
// configuration), asked in the configured order behind the
// system:masters authorizer, with union.Authorize's own semantics: the
// first allow or deny decides; otherwise no opinion with every reason and
// error. Each member reports a child result and has a span (see
// member_trace.go), except in the authorization stage a quiet one: no
// opinion, no reason, no error, quickly (Node, for anyone not a node).
type authorizerChain struct {
	members []chainMember
	tracer  trace.Tracer
	clock   clock.PassiveClock
}

// quietAuthorizersKey carries the authorization stage's *quietMembers.
type quietAuthorizersKey struct{}

// quietAuthorizersAttr is the authorization stage span's attribute that
// names them.
const quietAuthorizersAttr = "kproxy.authorizers.no_opinion"

var errUnknownCaller = errors.New("the caller is not known (authentication was not replayed)")

type chainMember struct {
	name, kind string
	authz      authorizer.Authorizer
}

// privilegedGroup is the member kube-apiserver puts first.
func privilegedGroup() chainMember {
	return chainMember{name: "kubernetes.io/system-privileged-group", kind: "SystemPrivilegedGroup",
		authz: authorizerfactory.NewPrivilegedGroups(user.SystemPrivilegedGroup)}
}

// childrenKey carries a *[]record.StageResult for the members' verdicts.
type childrenKey struct{}

// verdicts name the decisions in spans and children.
var verdicts = map[authorizer.Decision]string{authorizer.DecisionAllow: "allow", authorizer.DecisionDeny: "deny", authorizer.DecisionNoOpinion: "no opinion"}

func (c *authorizerChain) Authorize(ctx context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	if a.GetUser() == nil {
		// The handler's own checks (an unsafe delete's) run in a replay
		// whose authentication was not: the apiserver never authorizes
		// without a user, and its authorizers assume one.
		return authorizer.DecisionNoOpinion, "", errUnknownCaller
	}
	var errs []error
	var reasons []string
	children, _ := ctx.Value(childrenKey{}).(*[]record.StageResult)
	// The children of the members with no opinion but a reason, and the
	// reason: it is added to them once a later member decides (the
	// deciding member's reason is the stage's explanation, so its child
	// says only the verdict). When none decides, the stage's explanation
	// gives every reason, and the children stay verdicts.
	type noOpinion struct {
		at     int
		reason string
	}
	var why []noOpinion
	quiet, _ := ctx.Value(quietAuthorizersKey{}).(*quietMembers)
	recording := trace.SpanFromContext(ctx).IsRecording()
	for i, m := range c.members {
		start := c.clock.Now()
		d, reason, err := m.authz.Authorize(ctx, a)
		took := c.clock.Since(start)
		verdict := verdicts[d]
		switch {
		case !recording:
		case quiet != nil && d == authorizer.DecisionNoOpinion && reason == "" && err == nil && quiet.fold(m.name, took):
		default:
			memberSpan(ctx, c.tracer, "authorizer "+m.name, start, took,
				attribute.String("kproxy.authorizer.type", m.kind), attribute.String("kproxy.authorizer.decision", verdict), attribute.String("kproxy.authorizer.reason", reason))
		}
		if children != nil {
			res := record.StageResult{Name: m.name, Outcome: record.Pass, Explanation: verdict, DurationNs: took.Nanoseconds()}
			switch d {
			case authorizer.DecisionDeny:
				res.Outcome = record.Reject
			case authorizer.DecisionNoOpinion:
				res.Outcome = record.Skip
			}
			if err != nil {
				res.Explanation += fmt.Sprintf(" (error: %v)", err)
			}
			if reason != "" && d == authorizer.DecisionNoOpinion {
				why = append(why, noOpinion{len(*children), reason})
			}
			*children = append(*children, res)
			if d != authorizer.DecisionNoOpinion {
				for _, w := range why {
					ch := &(*children)[w.at]
					ch.Explanation = verdicts[authorizer.DecisionNoOpinion] + ": " + w.reason + strings.TrimPrefix(ch.Explanation, verdicts[authorizer.DecisionNoOpinion])
				}
				for _, rest := range c.members[i+1:] {
					*children = append(*children, record.StageResult{Name: rest.name, Outcome: record.Skip, Explanation: notAskedChild})
				}
			}
		}
		if err != nil {
			errs = append(errs, err)
		}
		if reason != "" {
			// Each member is itself the union Config.New builds, which
			// already prefixes a no-opinion reason with the member's name,
			// as the apiserver's single union does.
			reasons = append(reasons, reason)
		}
		if d == authorizer.DecisionAllow || d == authorizer.DecisionDeny {
			return d, reason, err
		}
	}
	return authorizer.DecisionNoOpinion, strings.Join(reasons, "\n"), utilerrors.Flatten(utilerrors.NewAggregate(errs))
}

func (c *authorizerChain) ConditionsAwareAuthorize(ctx context.Context, a authorizer.Attributes) authorizer.ConditionsAwareDecision {
	return authorizer.ConditionsAwareDecisionFromParts(c.Authorize(ctx, a))
}

func (c *authorizerChain) EvaluateConditions(context.Context, authorizer.ConditionsAwareDecision, authorizer.ConditionsData) (authorizer.Decision, string, error) {
	return authorizer.DecisionDeny, "", authorizer.ErrorConditionEvaluationNotSupported
}
