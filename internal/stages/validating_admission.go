package stages

import (
	"context"

	"github.com/kproxy/kproxy/internal/record"
)

// validatingAdmission reports the admission chain's validating phase of
// the write path's run (ResourceQuota, PodSecurity, LimitRanger's checks,
// ValidatingAdmissionPolicy, validating webhooks): each plugin with its
// time and verdict.
type validatingAdmission struct{ m *machinery }

func newValidatingAdmission(m *machinery) Stage { return validatingAdmission{m} }

func (validatingAdmission) Name() string { return record.StageValidatingAdmission }

func (validatingAdmission) recorded() {}

func (validatingAdmission) Run(_ context.Context, req *Request) Result {
	return admissionPhase(req, phaseValidating, true)
}
