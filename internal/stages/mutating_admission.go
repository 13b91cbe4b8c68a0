package stages

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// mutatingAdmission reports the admission chain's mutating phase of the
// write path's run: each plugin with its time, verdict and what it
// changed in the object (a JSON patch).
type mutatingAdmission struct{ m *machinery }

func newMutatingAdmission(m *machinery) handlerStage { return mutatingAdmission{m} }

func (mutatingAdmission) Name() string { return record.StageMutatingAdmission }

func (s mutatingAdmission) report(_ context.Context, req *Request, run *apiserver.Run) Result {
	return admissionPhase(req, run, apiserver.PhaseMutating, false)
}

// admissionPhase reports one admission phase of the run.
func admissionPhase(req *Request, run *apiserver.Run, phase int, validating bool) Result {
	run, none := handlerRunOf(apiserver.PhaseStage[phase], req, run)
	if run == nil {
		return none
	}
	n := 0
	for _, c := range run.Plugins {
		if c.Validating == validating {
			n++
		}
	}
	// Sized once: a write's phase has a dozen or more plugin calls, and
	// growing these slices was a tenth of what a create's replay allocated.
	children, spans, quiet := make([]record.StageResult, 0, n), make([]childSpan, 0, n), make([]bool, 0, n)
	var changed []string
	for _, c := range run.Plugins {
		if c.Validating != validating {
			continue
		}
		ch := childFor(c)
		children = append(children, ch)
		sp := childSpan{Name: "admission " + c.Name, Start: c.Start, End: c.End, Outcome: ch.Outcome}
		if c.Err != nil {
			sp.Err = c.Err.Error()
		}
		spans, quiet = append(spans, sp), append(quiet, unremarkable(ch))
		if c.Patch != "" {
			changed = append(changed, c.Name)
		}
	}
	spans = foldSpans(spans, quiet)
	plugins := len(children)
	children, folded := summarizeUnchanged(children)
	start, end, reached := run.PhaseTimes(phase)
	var res Result
	switch {
	case !reached:
		res = Skip(notReached(run))
	case run.Decided == apiserver.PhaseStage[phase]:
		who := "the admission chain"
		if run.PluginErrName != "" {
			who = "admission plugin " + run.PluginErrName
		}
		msg := who + " refuses: " + apiserver.StatusMessage(run.Status)
		if run.PluginErrDetail != "" {
			msg += " [" + run.PluginErrDetail + "]"
		}
		res = Reject(run.Status, msg)
	default:
		var msg string
		msg, children = admitted(plugins, changed, children, folded)
		res = Pass(msg)
	}
	res.Children, res.Spans, res.Began, res.Ended = children, spans, start, end
	return res
}

// admitted explains a phase whose plugins all admitted the request, and
// returns the children worth keeping: when every plugin was folded into
// one child (summarizeUnchanged), the explanation says what it would.
func admitted(plugins int, changed []string, children []record.StageResult, folded int) (string, []record.StageResult) {
	if folded == plugins && plugins > 1 {
		return fmt.Sprintf("%d plugins admitted the request without change, each in under %s", plugins, slowPlugin), nil
	}
	msg := fmt.Sprintf("%d plugins admitted the request", plugins)
	if len(changed) > 0 {
		msg += "; changed by " + strings.Join(changed, ", ")
	}
	return msg, children
}

// notReached explains a write-path stage the run never got to.
func notReached(run *apiserver.Run) string {
	if run.Decided == "" && run.Verb == "deletecollection" {
		// The registry admits each object it deletes, after listing them.
		return "not reached: a deletecollection admits each object it deletes, and its list matched none"
	}
	if run.Decided == "" {
		return "not reached"
	}
	if run.Unknown != "" && run.UnknownAt() == run.Decided {
		// The refusal is the unknown's doing (a read that failed, which
		// a delete makes before admission): there was no refusal to
		// name (a probe found "storage refuses first (500 ...)" where
		// the apiserver answered 404 and storage said unknown).
		return "not replayed (see " + run.Decided + ")"
	}
	return "not reached: " + run.Decided + " refuses first (" + apiserver.StatusMessage(run.Status) + ")"
}

// admittedUnchanged is a plugin child that admitted without a change.
const admittedUnchanged = "admitted, no change"

// slowPlugin is how long a plugin may take and still be summarised.
const slowPlugin = time.Millisecond

// summarizeUnchanged keeps the plugins that explain the verdict or the
// time (those that refused, changed the object, or took a millisecond or
// more) and folds the rest into one child that counts them (it does not
// name them: they are the apiserver's enabled plugins, the same in every
// record, and folded in the trace too, where foldSpans names them). folded is how
// many were folded; with fewer than two the children are kept as they are
// (folded is 0).
func summarizeUnchanged(children []record.StageResult) (_ []record.StageResult, folded int) {
	var kept []record.StageResult
	var summary record.StageResult
	for _, ch := range children {
		if !unremarkable(ch) {
			kept = append(kept, ch)
			continue
		}
		if folded == 0 {
			summary.OffsetNs = ch.OffsetNs
		}
		folded++
		summary.DurationNs += ch.DurationNs
	}
	if folded < 2 {
		return children, 0
	}
	summary.Name = fmt.Sprintf("%d more plugins", folded)
	summary.Outcome = record.Pass
	summary.Explanation = "admitted without change, each in under " + slowPlugin.String()
	return append(kept, summary), folded
}

// unremarkable is a plugin that admitted without change in under
// slowPlugin: the same in every request, folded in the record and in the
// trace.
func unremarkable(ch record.StageResult) bool {
	return ch.Outcome == record.Pass && ch.Explanation == admittedUnchanged && ch.DurationNs < slowPlugin.Nanoseconds()
}

// foldSpans makes each run of two or more unremarkable plugins (quiet[i]
// for spans[i], in the order they ran) one span, "admission: N more
// plugins", from the first's start to the last's end, naming each with
// its time in kproxy.admission.plugins; a plugin that refused, changed
// the object or took slowPlugin or more keeps its own span, and so does
// one unremarkable plugin between two others. Only neighbours fold, so a
// folded span never covers another plugin's time. A write's trace has
// half the spans it had with one per plugin, and half the tracing cost.
func foldSpans(spans []childSpan, quiet []bool) []childSpan {
	var out []childSpan
	for i := 0; i < len(spans); {
		j := i
		for j < len(spans) && quiet[j] {
			j++
		}
		switch {
		case j-i >= 2:
			out = append(out, foldRun(spans[i:j]))
		case j == i:
			j++ // not quiet: its own span
			fallthrough
		default:
			out = append(out, spans[i:j]...)
		}
		i = j
	}
	return out
}

func foldRun(run []childSpan) childSpan {
	names := make([]string, len(run))
	for i, sp := range run {
		names[i] = timedName(strings.TrimPrefix(sp.Name, "admission "), sp.End.Sub(sp.Start))
	}
	return childSpan{Name: fmt.Sprintf("admission: %d more plugins", len(run)), Start: run[0].Start, End: run[len(run)-1].End,
		Outcome: record.Pass, Attrs: []attribute.KeyValue{
			attribute.String("kproxy.admission.plugins", strings.Join(names, ", ")),
			attribute.String("kproxy.admission.explanation", "admitted without change, each in under "+slowPlugin.String()),
		}}
}

// childFor is a plugin call as a stage child.
func childFor(c apiserver.PluginCall) record.StageResult {
	ch := record.StageResult{Name: c.Name, Outcome: record.Pass, DurationNs: c.End.Sub(c.Start).Nanoseconds()}
	switch {
	case c.Err != nil:
		ch.Outcome, ch.Explanation = record.Reject, c.Err.Error()
		if c.Detail != "" {
			ch.Explanation += " [" + c.Detail + "]"
		}
	case c.Patch != "":
		ch.Explanation = "changed the object: " + c.Patch
	default:
		ch.Explanation = admittedUnchanged
	}
	return ch
}
