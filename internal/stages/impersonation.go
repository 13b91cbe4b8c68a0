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

	"github.com/kproxy/kproxy/internal/record"
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

func (impersonationStage) Name() string { return record.StageImpersonation }

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
		res := Pass(fmt.Sprintf("%s may impersonate; the request continues as %s", describeUser(caller), describeUser(u)))
		if late := accessLate(ctx, s.m.authzChanges, req, true, "impersonation", impersonationRefusal, impersonationSuccessTTL); late != "" {
			req.User = nil
			return unknownNow(res, late)
		}
		return res
	}
	st := out.status()
	if st.Code == http.StatusBadRequest {
		// Headers the filter cannot read (a group or a uid without a
		// user): refused before any authorizer is asked, so no change of
		// permissions bears on it (a probe: such a 400 was said unknown,
		// "the apiserver's impersonation allowed the request").
		return Reject(st, fmt.Sprintf("the apiserver's impersonation filter refuses the Impersonate-* headers before asking the authorizer: %s", st.Message))
	}
	res := Reject(st, fmt.Sprintf("%s may not impersonate what the headers ask for (%s): %s", describeUser(caller), impersonationForm(st.Message), st.Message))
	if late := accessLate(ctx, s.m.authzChanges, req, false, "impersonation", impersonationRefusal, impersonationSuccessTTL); late != "" {
		req.User = nil
		return unknownNow(res, late)
	}
	return res
}

// impersonationForm says which check refused, from the verb the
// apiserver's message names: the classic "impersonate" on users, groups,
// uids, userextras or serviceaccounts, or a constrained-impersonation mode.
func impersonationForm(msg string) string {
	switch {
	case strings.Contains(msg, "cannot impersonate-on:"):
		mode := strings.SplitN(strings.SplitN(msg, "cannot impersonate-on:", 2)[1], ":", 2)[0]
		return "constrained impersonation, mode " + mode + ": the impersonate-on check for this request's verb and resource failed"
	case strings.Contains(msg, "cannot impersonate:"):
		mode := strings.Fields(strings.SplitN(msg, "cannot impersonate:", 2)[1])[0]
		return "constrained impersonation, mode " + mode + ": the check on the impersonated identity failed"
	case strings.Contains(msg, "cannot impersonate resource"):
		return "classic impersonation: the impersonate verb on the named attribute failed"
	case strings.Contains(msg, "without impersonating a user name"):
		return "malformed headers: Impersonate-Group, -Uid or -Extra need Impersonate-User"
	}
	return "impersonation refused"
}

func hasImpersonateHeaders(h http.Header) bool {
	for k := range h {
		if strings.HasPrefix(k, "Impersonate-") {
			return true
		}
	}
	return false
}
