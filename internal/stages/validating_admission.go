package stages

import (
	"context"

	"github.com/kproxy/kproxy/internal/record"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// validatingAdmission reports the admission chain's validating phase of
// the write path's run (ResourceQuota, PodSecurity, LimitRanger's checks,
// ValidatingAdmissionPolicy, validating webhooks): each plugin with its
// time and verdict.
type validatingAdmission struct{ m *machinery }

func newValidatingAdmission(m *machinery) handlerStage { return validatingAdmission{m} }

func (validatingAdmission) Name() string { return record.StageValidatingAdmission }

func (validatingAdmission) report(_ context.Context, req *Request, run *apiserver.Run) Result {
	return admissionPhase(req, run, apiserver.PhaseValidating, true)
}
