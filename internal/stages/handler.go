package stages

import (
	"context"
	"slices"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// One handler run, five verdicts. Decode, mutating admission, validation,
// validating admission and storage are one piece of code in the
// apiserver: its resource handler calling the registry, which calls
// admission around the strategy and the store. The replay runs that
// handler once per request (apiserver.Server.runRequest) and each of the five
// stages reports its part of the run, with the times the work really
// took.

// handlerStage is one of the five stages the resource handler goes
// through. report says what it did in run (nil when the handler was not
// run: decode's verdict says why).
type handlerStage interface {
	Name() string
	report(ctx context.Context, req *Request, run *apiserver.Run) Result
}

// resourceHandler is kube-apiserver's resource handler as a pipeline
// element: run once, reported as its five stages in the apiserver's
// order.
type resourceHandler struct {
	m      *machinery
	decode decode
	stages []handlerStage // decode first
}

func newResourceHandler(m *machinery) *resourceHandler {
	d := decode{m}
	return &resourceHandler{m: m, decode: d, stages: []handlerStage{
		d,
		newMutatingAdmission(m),
		newValidation(m),
		newValidatingAdmission(m),
		newStorage(m),
	}}
}

func (h *resourceHandler) names() []string {
	n := make([]string, len(h.stages))
	for i, s := range h.stages {
		n[i] = s.Name()
	}
	return n
}

// run runs the handler once (unless decode decides without it) and
// returns the run and decode's verdict when there was no run.
func (h *resourceHandler) run(ctx context.Context, req *Request) (*apiserver.Run, *Result) {
	res, ok := h.decode.before(ctx, req)
	if !ok {
		return nil, &res
	}
	run := h.m.writer().Run(ctx, req.forServer(), h.m.now)
	req.storedSecrets(run.SecretValues)
	return run, nil
}

// handlerRunOf is the run stage (after decode) reports on, or, when there
// is none to report on (not a write, decode could not replay it, or the
// run cannot be trusted from this stage on), the stage's result.
func handlerRunOf(stage string, req *Request, run *apiserver.Run) (*apiserver.Run, Result) {
	switch {
	case !apiserver.IsWrite(req.Info):
		return nil, Skip(notWriteReason(req))
	case run == nil:
		return nil, Skip("not replayed (see decode)")
	}
	if res, ok := unknownFrom(stage, run); ok {
		return nil, res
	}
	return run, Result{}
}

// unknownFrom is what stage reports of a run that cannot be trusted (ok),
// or ok false for the stage to report the run as usual. The stage whose
// layer the run's unknown is about (a webhook's phase, storage for a
// failed read or a conflict in flight; decode for the run as a whole)
// says why; the stages after it say where to look; the stages before it
// report what the run did, which is known.
func unknownFrom(stage string, run *apiserver.Run) (Result, bool) {
	if run == nil || run.Unknown == "" {
		return Result{}, false
	}
	at := run.UnknownAt()
	switch {
	case at == stage:
		return Unknown(run.Unknown), true
	case slices.Index(record.StageOrder[:], at) < slices.Index(record.StageOrder[:], stage):
		return Skip("not replayed (see " + at + ")"), true
	}
	return Result{}, false
}

var _ handlerStage = decode{} // a compile-time guard: decode reports like the others
