package stages

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"k8s.io/apiserver/pkg/endpoints/filters/impersonation"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
	genericfeatures "k8s.io/apiserver/pkg/features"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
)

// impersonationStage replays Impersonate-* headers with the apiserver's own
// filter: constrained impersonation (with its legacy fallback) when the
// ConstrainedImpersonation feature is on, as it is by default in v1.37,
// else the classic filter, both asking the replay's authorizer. The filter
// is built once: it remembers per user which impersonation mode last
// succeeded, and that shapes later error messages as in the apiserver.
type impersonationStage struct {
	m *machinery
	f *filter
}

func newImpersonation(m *machinery) Stage {
	s := &impersonationStage{m: m}
	if m.authz == nil {
		return s
	}
	s.f = newFilter(func(next http.Handler) http.Handler {
		if utilfeature.DefaultFeatureGate.Enabled(genericfeatures.ConstrainedImpersonation) {
			return impersonation.WithConstrainedImpersonation(next, m.authz, statusCodecs)
		}
		return impersonation.WithImpersonation(next, m.authz, statusCodecs)
	})
	return s
}

func (impersonationStage) Name() string { return "impersonation" }

func (s *impersonationStage) Run(ctx context.Context, req *Request) Result {
	if !hasImpersonateHeaders(req.HTTP.Header) {
		return Pass("no Impersonate-* headers")
	}
	if s.m.authzErr != nil {
		return Unknown("impersonation is authorized by the apiserver's authorizer: " + s.m.authzErr.Error())
	}
	if req.User == nil {
		return Unknown("the caller is not known (authentication was not replayed)")
	}
	caller := req.User
	out := s.f.run(requestFor(ctx, req, caller))
	if out.passed {
		u, _ := apirequest.UserFrom(out.req.Context())
		req.User = u
		return Pass(fmt.Sprintf("%s may impersonate; the request continues as %s", describeUser(caller), describeUser(u)))
	}
	st := out.status()
	return Reject(st, fmt.Sprintf("%s may not impersonate what the headers ask for: %s", describeUser(caller), st.Message))
}

func hasImpersonateHeaders(h http.Header) bool {
	for k := range h {
		if strings.HasPrefix(k, "Impersonate-") {
			return true
		}
	}
	return false
}
