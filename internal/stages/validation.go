package stages

import (
	"context"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// validation reports the registry strategy's part of the write path's
// run: PrepareForCreate/Update, Validate/ValidateUpdate, the object's own
// rules, with the apiserver's field error list when it refuses.
type validation struct{ m *machinery }

func newValidation(m *machinery) handlerStage { return validation{m} }

func (validation) Name() string { return record.StageValidation }

func (validation) report(_ context.Context, req *Request, run *apiserver.Run) Result {
	run, none := handlerRunOf(record.StageValidation, req, run)
	if run == nil {
		return none
	}
	start, end, reached := run.PhaseTimes(apiserver.PhaseValidation)
	var res Result
	switch {
	case run.Decided == record.StageValidation:
		res = Reject(run.Status, "the "+req.Info.Resource+" strategy refuses the object: "+fieldErrors(run.Status))
	case !reached, run.Decided == record.StageAuthorization:
		// The registries' own authorization checks (RBAC's escalation
		// check, the pods registry's create check) refuse before the
		// strategy runs, though after mutating admission.
		res = Skip(notReached(run))
	default:
		res = Pass("the " + req.Info.Resource + " strategy accepts the object")
	}
	res.Began, res.Ended = start, end
	return res
}

// fieldErrors lists a 422's causes, one per field.
func fieldErrors(st *metav1.Status) string {
	if st.Details == nil || len(st.Details.Causes) == 0 {
		return st.Message
	}
	var b []string
	for _, c := range st.Details.Causes {
		b = append(b, c.Field+": "+c.Message+" ("+string(c.Type)+")")
	}
	return strings.Join(b, "; ")
}
