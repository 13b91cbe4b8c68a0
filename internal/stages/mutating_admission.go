package stages

import (
	"context"
	"fmt"
	"strings"

	"github.com/kproxy/kproxy/internal/record"
)

// mutatingAdmission reports the admission chain's mutating phase of the
// write path's run: each plugin with its time, verdict and what it
// changed in the object (a JSON patch).
type mutatingAdmission struct{ m *machinery }

func newMutatingAdmission(m *machinery) handlerStage { return mutatingAdmission{m} }

func (mutatingAdmission) Name() string { return record.StageMutatingAdmission }

func (s mutatingAdmission) report(_ context.Context, req *Request, run *handlerRun) Result {
	return admissionPhase(req, run, phaseMutating, false)
}

// admissionPhase reports one admission phase of the run.
func admissionPhase(req *Request, run *handlerRun, phase int, validating bool) Result {
	run, none := handlerRunOf(req, run)
	if run == nil {
		return none
	}
	var children []record.StageResult
	var spans []childSpan
	var changed []string
	for _, c := range run.plugins {
		if c.Validating != validating {
			continue
		}
		ch := childFor(c)
		children = append(children, ch)
		sp := childSpan{Name: "admission " + c.Name, Start: c.Start, End: c.End, Outcome: ch.Outcome}
		if c.Err != nil {
			sp.Err = c.Err.Error()
		}
		spans = append(spans, sp)
		if c.Patch != "" {
			changed = append(changed, c.Name)
		}
	}
	start, end, reached := run.phaseTimes(phase)
	var res Result
	switch {
	case !reached:
		res = Skip(notReached(run))
	case run.decided == phaseStage[phase]:
		who := "the admission chain"
		if run.pluginErrName != "" {
			who = "admission plugin " + run.pluginErrName
		}
		msg := who + " refuses: " + statusMessage(run.status)
		if run.pluginErrDetail != "" {
			msg += " [" + run.pluginErrDetail + "]"
		}
		res = Reject(run.status, msg)
	default:
		msg := fmt.Sprintf("%d plugins admitted the request", len(children))
		if len(changed) > 0 {
			msg += "; changed by " + strings.Join(changed, ", ")
		}
		res = Pass(msg)
	}
	res.Children, res.Spans, res.Began, res.Ended = children, spans, start, end
	return res
}

// notReached explains a write-path stage the run never got to.
func notReached(run *handlerRun) string {
	if run.decided == "" {
		return "not reached"
	}
	return "not reached: " + run.decided + " refuses first (" + statusMessage(run.status) + ")"
}
