package stages

import (
	"context"

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
	return h.m.writer().Run(ctx, req.forServer(), h.m.now), nil
}

// handlerRunOf is the run a stage after decode reports on, or, when there
// is none to report on (not a write, or decode could not replay it), the
// stage's result.
func handlerRunOf(req *Request, run *apiserver.Run) (*apiserver.Run, Result) {
	switch {
	case !apiserver.IsWrite(req.Info):
		return nil, Skip(notWriteReason(req))
	case run == nil || run.Unknown != "":
		return nil, Skip("not replayed (see decode)")
	default:
		return run, Result{}
	}
}

var _ handlerStage = decode{} // a compile-time guard: decode reports like the others
