package stages

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/utils/clock"
	"sigs.k8s.io/yaml"

	kdecode "github.com/kproxy/kproxy/internal/decode"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/telemetry"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
	// The apiserver's per-request metrics, off before its packages
	// register them (apimetrics' doc says why and how).
	_ "github.com/kproxy/kproxy/internal/stages/apimetrics"
)

// KubernetesVersion is the Kubernetes release whose code the replay runs.
const KubernetesVersion = "v1.37.2"

// Config holds the pipeline's collaborators.
type Config struct {
	// TracerProvider makes the replay and stage spans; nil means no spans.
	TracerProvider trace.TracerProvider
	// Clock times the stages; nil means the real clock.
	Clock clock.PassiveClock
	// Budget bounds one replay; past it the prediction is unknown. Zero
	// means DefaultBudget.
	Budget time.Duration
	// APIServer are the mirrored kube-apiserver flags; a stage whose flags
	// were not given reports unknown rather than guess.
	APIServer *apiserver.Options
	// State is the read-only view of the cluster (informers); nil leaves
	// the stages that need it unknown.
	State *apiserver.ClusterState
	// Log receives what must not reach a record: a stage's panic and its
	// stack. Nil discards.
	Log *slog.Logger
}

// DefaultBudget bounds one replay. A write's replay calls the cluster's
// admission webhooks (up to 30s each, as in the apiserver) and waits for
// the real answer, so the budget is longer than any webhook timeout.
const DefaultBudget = 40 * time.Second

// Pipeline runs the stages in the apiserver's order.
type Pipeline struct {
	// stages are the filter stages, in the apiserver's order; handler the
	// resource handler after them (nil in tests of the loop alone).
	stages  []Stage
	handler *resourceHandler
	tracer  trace.Tracer
	clock   clock.PassiveClock
	budget  time.Duration
	state   *apiserver.ClusterState
	log     *slog.Logger
	m       *machinery
}

// New builds the pipeline. The order is the apiserver's: its handler chain
// (DefaultBuildHandlerChain, read bottom-up) and then the resource handler
// and registry (create.go / update.go: decode, mutating admission, strategy
// validation, validating admission, storage).
//
// The apiserver's machinery (authenticator, authorizer, ...) is assembled
// here once from cfg, and lives as long as ctx; register informers before
// cfg.State is started.
func New(ctx context.Context, cfg Config) *Pipeline {
	cfg.TracerProvider = replayTracing(cfg.TracerProvider)
	m := buildMachinery(ctx, cfg)
	// The handler chain (DefaultBuildHandlerChain, read bottom-up) ...
	p := newPipeline(cfg,
		newAuthentication(m),
		newImpersonation(m),
		newFlowControl(m),
		newAuthorization(m),
	)
	// ... then the resource handler, run once and reported as its five
	// stages: decode, mutating-admission, validation,
	// validating-admission, storage (handler.go).
	p.handler = newResourceHandler(m)
	p.m = m
	return p
}

// replayAttr is true on every span the replay makes: they describe what
// kproxy replayed in-process, not anything the apiserver did.
const replayAttr = "kproxy.replay"

// replayTracing is the provider the pipeline and its machinery trace
// with. The replay runs the apiserver's own code, whose spans (a dry
// run's "Create etcd3", "SerializeObject", "Write to database call
// succeeded") would read in kproxy's trace as if the apiserver had done
// the work: only kproxy's own spans are recorded, each marked replayAttr
// (telemetry.OwnSpansOnly). Their names stay the contract's stage names;
// the "replay" span above them and the mark say whose they are.
func replayTracing(tp trace.TracerProvider) trace.TracerProvider {
	return telemetry.OwnSpansOnly(tp, attribute.Bool(replayAttr, true))
}

func newPipeline(cfg Config, stages ...Stage) *Pipeline {
	p := &Pipeline{stages: stages, clock: cfg.Clock, budget: cfg.Budget, state: cfg.State, log: cfg.Log}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	tp := cfg.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	p.tracer = tp.Tracer("github.com/kproxy/kproxy/internal/stages")
	if p.clock == nil {
		p.clock = clock.RealClock{}
	}
	if p.budget == 0 {
		p.budget = DefaultBudget
	}
	return p
}

// Names lists the stage names in order.
func (p *Pipeline) Names() []string {
	n := make([]string, 0, len(p.stages)+5)
	for _, s := range p.stages {
		n = append(n, s.Name())
	}
	if p.handler != nil {
		n = append(n, p.handler.names()...)
	}
	return n
}

// step is one stage's verdict and how long it took.
type step struct {
	name string
	res  Result
	at   time.Time // when the stage's work began
	d    time.Duration
	// spanless: the stage did not apply and has no span (see recordSpans)
	spanless bool
}

// Outcome is the replay's result for one request.
type Outcome struct {
	// answer is the success status a stage decided (a 304), or 0.
	answer    int
	Predicted record.Prediction
	Stages    []record.StageResult
	Duration  time.Duration
	// Caller is who authentication found; ActingAs who the request runs
	// as after impersonation (nil when not replayed).
	Caller, ActingAs user.Info
	// Gated: Request.Gate ended the replay after the identity stages.
	Gated bool
}

// Run replays req through every stage, one after another in the caller's
// goroutine. It never panics. Stages must return promptly once ctx is done
// (the budget); a stage that ends past the budget is reported as error and
// the stages after it are not run.
func (p *Pipeline) Run(ctx context.Context, req *Request) Outcome {
	start := p.clock.Now()
	ctx, cancel := context.WithTimeout(ctx, p.budget)
	defer cancel()
	ctx, span := p.tracer.Start(ctx, "replay", trace.WithAttributes(
		attribute.String("kproxy.kubernetes_version", KubernetesVersion)))
	defer span.End()

	out := Outcome{Stages: make([]record.StageResult, 0, len(p.stages)+5)}
	var decided *Result
	var decidedBy, stopped string
	var unknown []string
	var run *apiserver.Run
	// Each element (a filter stage, or the resource handler and its five
	// stages) runs unless an earlier stage decided or the budget ran out.
	elements := make([]func() []step, 0, len(p.stages)+1)
	names := make([][]string, 0, len(p.stages)+1)
	for _, s := range p.stages {
		elements = append(elements, func() []step {
			res, at, d := p.runStage(ctx, s, req)
			return []step{{name: s.Name(), res: res, at: at, d: d}}
		})
		names = append(names, []string{s.Name()})
	}
	if p.handler != nil {
		elements = append(elements, func() []step {
			var steps []step
			run, steps = p.runHandler(ctx, req)
			return steps
		})
		names = append(names, p.handler.names())
	}
	var spanless []string // stages in the record with no span of their own
	var rechecks []recheck
	var gated string // why the Gate ended the replay
	for i, element := range elements {
		if gated != "" {
			for _, name := range names[i] {
				out.Stages = append(out.Stages, record.StageResult{Name: name, Outcome: record.Skip, Explanation: gated})
				spanless = append(spanless, name)
			}
			continue
		}
		if decided != nil || stopped != "" {
			for _, name := range names[i] {
				out.Stages = append(out.Stages, notReachedResult(name, decidedBy, stopped))
				spanless = append(spanless, name)
			}
			continue
		}
		steps := element()
		for _, st := range steps {
			if decided != nil || stopped != "" {
				out.Stages = append(out.Stages, notReachedResult(st.name, decidedBy, stopped))
				spanless = append(spanless, st.name)
				continue
			}
			if st.spanless {
				spanless = append(spanless, st.name)
			}
			res := st.res
			if ctx.Err() != nil && res.Outcome != record.Error {
				stopped = fmt.Sprintf("replay budget exceeded (%v)", p.budget)
				res = Failed(stopped)
			}
			out.Stages = append(out.Stages, record.StageResult{
				Name: st.name, Outcome: res.Outcome, DurationNs: st.d.Nanoseconds(),
				OffsetNs:    st.at.Sub(start).Nanoseconds(),
				Explanation: res.Explanation, Children: recordedChildren(res),
			})
			if res.Recheck != nil {
				rechecks = append(rechecks, recheck{at: len(out.Stages) - 1, f: res.Recheck})
			}
			switch {
			case res.Outcome == record.Error:
				unknown = append(unknown, fmt.Sprintf("%s failed: %s", st.name, res.Explanation))
			case res.Unknown:
				unknown = append(unknown, st.name+": "+res.Explanation)
			case res.Outcome == record.Reject:
				r := res
				decided, decidedBy = &r, st.name
			case res.Answer != 0:
				out.answer = res.Answer
			}
		}
		// The handler stops at its first refusal: the stages after it
		// were not reached.
		for _, name := range names[i][len(steps):] {
			out.Stages = append(out.Stages, notReachedResult(name, decidedBy, stopped))
			spanless = append(spanless, name)
		}
		if req.Gate != nil && names[i][0] == record.StageImpersonation && decided == nil && stopped == "" && len(unknown) == 0 && req.User != nil {
			gated = req.Gate(req.Caller, req.User)
		}
	}
	switch {
	case gated != "":
		out.Predicted, out.Gated = record.Prediction{Stage: record.StageUnknown, Message: gated}, true
	default:
		if len(unknown) == 0 {
			unknown = unknownBeforeHandler(run, out.Stages)
		}
		if decided == nil && len(unknown) == 0 {
			if r, name := lateDecision(req, run, out.Stages); r != nil {
				decided, decidedBy = r, name
			}
		}
		if len(unknown) == 0 {
			unknown = askRechecks(ctx, req, rechecks, out.Stages)
		}
		out.Predicted = predict(req, out.answer, decided, decidedBy, unknown)
	}
	out.Predicted.FlowSchema, out.Predicted.PriorityLevel = req.FlowSchema, req.PriorityLevel
	out.Caller, out.ActingAs = req.Caller, req.User
	out.Duration = p.clock.Since(start)
	span.SetAttributes(
		attribute.Int("kproxy.predicted.status", out.Predicted.Status),
		attribute.String("kproxy.predicted.stage", out.Predicted.Stage))
	if len(spanless) > 0 && span.IsRecording() {
		span.SetAttributes(attribute.String(skippedAttr, strings.Join(spanless, ", ")))
	}
	return out
}

// recheck is a stage's Recheck, and where its result is in the record.
type recheck struct {
	at int
	f  func(Answer) string
}

// askRechecks asks the stages' rechecks with the apiserver's answer, once
// the replay has run, and returns the unknowns they give, each stage's
// result in the record made unknown with its reason.
func askRechecks(ctx context.Context, req *Request, rechecks []recheck, results []record.StageResult) []string {
	if len(rechecks) == 0 || !answerAwaited(req) {
		return nil
	}
	aw, ok := req.Actual(ctx)
	if !ok {
		return nil
	}
	var unknown []string
	for _, rc := range rechecks {
		why := rc.f(aw)
		if why == "" {
			continue
		}
		st := &results[rc.at]
		st.Outcome, st.Explanation = record.Skip, why+"; read now: "+st.Explanation
		unknown = append(unknown, st.Name+": "+why)
	}
	return unknown
}

// unknownBeforeHandler reports the run's unknown when it is about a
// stage that ran before the handler (authorization: the RBAC registry's
// escalation check, read after RBAC changed), which no handler stage
// says (they say "see authorization"): that stage's result becomes
// unknown, saying why.
func unknownBeforeHandler(run *apiserver.Run, results []record.StageResult) []string {
	if run == nil || run.Unknown == "" || run.UnknownAt() != record.StageAuthorization {
		return nil
	}
	for i := range results {
		if results[i].Name == record.StageAuthorization {
			results[i].Outcome, results[i].Explanation = record.Skip, run.Unknown+"; read now: "+results[i].Explanation
			return []string{record.StageAuthorization + ": " + run.Unknown}
		}
	}
	return nil
}

// lateDecision handles a refusal the resource handler makes on behalf of a
// stage that ran before it: the RBAC registry's escalation check, and the
// pods registry's check of create for a WebSocket exec, attach or
// port-forward, run inside the registry, yet the contract labels them
// authorization (they are authorization logic). The authorization stage's
// verdict becomes that refusal, with what would allow the write; the
// stages that ran before the registry keep their verdicts.
func lateDecision(req *Request, run *apiserver.Run, results []record.StageResult) (*Result, string) {
	if run == nil || run.Status == nil || run.Decided == "" {
		return nil, ""
	}
	for i := range results {
		if results[i].Name != run.Decided || results[i].Outcome == record.Reject {
			continue
		}
		var why string
		if !apiserver.UpgradeCreateCheck(req.Info.Resource, req.Info.Subresource, req.Info.Verb) {
			why = "the " + req.Info.Resource + " registry refuses the write after admission (its privilege-escalation check, labelled authorization): " +
				apiserver.StatusMessage(run.Status) + escalationAdvice(req)
		} else {
			why = "the pods registry asks the authorizer again, for verb create on pods/" + req.Info.Subresource +
				", before it connects a WebSocket " + req.Info.Subresource + " (sent as a GET, authorized above as get; kube-apiserver requires create for both protocols), and it is not allowed (labelled authorization): " +
				apiserver.StatusMessage(run.Status) + "\nthe caller needs the create verb on pods/" + req.Info.Subresource + " in namespace " + req.Info.Namespace
		}
		results[i].Outcome = record.Reject
		results[i].Explanation += "\n" + why
		r := Reject(run.Status, why)
		return &r, run.Decided
	}
	return nil, ""
}

// escalationAdvice says what would let a refused RBAC write through.
func escalationAdvice(req *Request) string {
	where := "cluster-wide"
	if ns := req.Info.Namespace; ns != "" {
		where = "in namespace " + ns
	}
	switch req.Info.Resource {
	case "roles", "clusterroles":
		return "\nthe writer must hold every permission the role grants " + where + ", or have the escalate verb on " + req.Info.Resource + " (rbac.authorization.k8s.io)"
	case "rolebindings", "clusterrolebindings":
		return "\nthe writer must hold every permission of the role it binds " + where + ", or have the bind verb on that role (rbac.authorization.k8s.io, resourceNames: [the role])"
	}
	return ""
}

// predict turns the stage verdicts into the record's prediction. A reject
// counts only when every stage before it was known: a stage we could not
// replay might have rejected first.
func predict(req *Request, answer int, decided *Result, decidedBy string, unknown []string) record.Prediction {
	if len(unknown) > 0 {
		return record.Prediction{Stage: record.StageUnknown,
			Message: "cannot predict: " + strings.Join(unknown, "; ")}
	}
	if decided != nil {
		pr := record.Prediction{Stage: decidedBy}
		if st := decided.Status; st != nil {
			pr.Status, pr.Reason, pr.Message = int(st.Code), string(st.Reason), st.Message
		}
		return pr
	}
	return record.Prediction{Status: successStatus(req, answer)}
}

// successStatus is the status the apiserver answers a successful request
// with: the handler's (201 for a create that stores a new object, 304 for
// a conditional request whose cached copy is current), else 200.
func successStatus(req *Request, answer int) int {
	if answer != 0 {
		return answer
	}
	if req.Info != nil && req.Info.Verb == "create" && req.HTTP.Method == http.MethodPost {
		return http.StatusCreated
	}
	return http.StatusOK
}

// runStage runs one filter stage in its own span, turning a panic into
// an error result.
func (p *Pipeline) runStage(ctx context.Context, s Stage, req *Request) (res Result, start time.Time, d time.Duration) {
	ctx, span := p.tracer.Start(ctx, s.Name())
	start = p.clock.Now()
	res = secretValuesOut(req, p.protect(s.Name(), req, func() Result { return s.Run(ctx, req) }))
	d = p.clock.Since(start)
	endStageSpan(span, res)
	span.End()
	return res, start, d
}

// runHandler runs the resource handler once and reports it as its five
// stages. Their work happened in that one run, so their spans are made
// after the fact, with the times the work really took.
func (p *Pipeline) runHandler(ctx context.Context, req *Request) (*apiserver.Run, []step) {
	h := p.handler
	now := p.clock.Now()
	var run *apiserver.Run
	var pre *Result
	if r := p.protect(record.StageDecode, req, func() Result {
		run, pre = h.run(ctx, req)
		return Result{}
	}); r.Outcome == record.Error {
		pre = &r
	}
	if run != nil && run.Status != nil && mayEcho(req) {
		st := *run.Status
		st.Message = record.RedactEchoes(st.Message)
		run.Status = &st
	}
	steps := make([]step, 0, len(h.stages))
	for i, s := range h.stages {
		var res Result
		if i == 0 && pre != nil {
			res = *pre
		} else {
			res = p.protect(s.Name(), req, func() Result { return s.report(ctx, req, run) })
		}
		res = secretValuesOut(req, res)
		at, d, spanless := p.recordSpans(ctx, s.Name(), res, now)
		now = at.Add(d) // a stage that did not run sits where the last one ended
		steps = append(steps, step{s.Name(), res, at, d, spanless})
		if res.Outcome == record.Reject {
			break // the stages after it were not reached
		}
	}
	return run, steps
}

// mayEcho says whether the apiserver's messages about req may echo a
// body or a stored object (record.RedactEchoes): any request on Secrets,
// and every write with a body, whose object may be a ConfigMap holding a
// kubeconfig or a Helm release, a TokenReview, a custom resource holding
// a credential (a probe: a ConfigMap's merge patch quoted the Helm
// release stored in it, a TokenReview's YAML the token's first bytes).
func mayEcho(req *Request) bool {
	resource := ""
	if req.Info != nil && req.Info.IsResourceRequest {
		resource = req.Info.Resource
	}
	return MayEcho(req.HTTP.Method, resource)
}

// MayEcho is mayEcho by a request's method and resource (the proxy
// redacts the apiserver's answer by the same rule).
func MayEcho(method, resource string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
		return true
	}
	return resource == "secrets"
}

// secretValuesOut keeps what the apiserver's messages echo of a body or
// a stored object (mayEcho: a Secret's data quoted by a server-side
// apply's "got &value.valueUnstructured{Value:...}", a patched object
// quoted whole, found by probes) out of a stage's verdict, its children
// and its spans.
func secretValuesOut(req *Request, res Result) Result {
	if !mayEcho(req) {
		return res
	}
	// A refusal's free text may quote the body's secrets themselves (a
	// policy's messageExpression, a webhook's message): those values
	// are scrubbed wherever they appear.
	var values []string
	if res.Status != nil || res.Outcome == record.Reject || res.Outcome == record.Error {
		values = SecretStringsOf(req)
	}
	scrub := func(s string) string { return record.ScrubValues(record.RedactEchoes(s), values) }
	res.Explanation = scrub(res.Explanation)
	if res.Status != nil {
		st := *res.Status
		st.Message = scrub(st.Message)
		res.Status = &st
	}
	record.RedactExplanations(res.Children)
	for i := range res.Children {
		res.Children[i].Explanation = record.ScrubValues(res.Children[i].Explanation, values)
	}
	if len(res.Spans) > 0 {
		spans := make([]childSpan, len(res.Spans))
		for i, c := range res.Spans {
			c.Err = scrub(c.Err)
			attrs := make([]attribute.KeyValue, len(c.Attrs))
			for j, kv := range c.Attrs {
				if kv.Value.Type() == attribute.STRING {
					kv = attribute.String(string(kv.Key), scrub(kv.Value.AsString()))
				}
				attrs[j] = kv
			}
			c.Attrs = attrs
			spans[i] = c
		}
		res.Spans = spans
	}
	return res
}

// mayHoldSecrets: req has a body whose values SecretStringsOf may find
// (a write of Secrets, ConfigMaps, which hold kubeconfigs and Helm
// releases, or TokenReviews).
func mayHoldSecrets(req *Request) bool {
	return req.Info != nil && len(req.Body) > 0 && SecretBearing(req.Info.Resource)
}

// SecretBearing: a body of the resource may carry secret values
// (SecretStringsOf).
func SecretBearing(resource string) bool {
	switch resource {
	case "secrets", "configmaps", "tokenreviews":
		return true
	}
	return false
}

// SecretStringsOf are the secret values in req's body
// (record.SecretStrings): of a write to Secrets, ConfigMaps (kubeconfigs,
// Helm releases) or TokenReviews, in any encoding; and, once the replay's
// handler ran, those of the objects its admission was given (the stored
// Secret a patch or a delete is about). The body's are found once: the
// replay's refusal and the proxy's record of the answer both scrub them.
func SecretStringsOf(req *Request) []string {
	req.storedMu.Lock()
	stored := req.stored
	req.storedMu.Unlock()
	var values []string
	if stored != nil {
		values = stored()
	}
	if len(values) == 0 {
		return bodySecretStrings(req)
	}
	return append(append([]string(nil), bodySecretStrings(req)...), values...)
}

// storedSecrets sets how the secret values of the objects the replay's
// admission was given are found (apiserver.Run.SecretValues): a policy
// quoting a Secret's stored data, for a patch that does not carry it.
func (req *Request) storedSecrets(of func() []string) {
	req.storedMu.Lock()
	req.stored = of
	req.storedMu.Unlock()
}

// bodySecretStrings are the secret values in req's body, found once.
func bodySecretStrings(req *Request) []string {
	req.secretsOnce.Do(func() {
		if !mayHoldSecrets(req) {
			return
		}
		if req.Info.Resource == "configmaps" && !record.ConfigMapMayHoldSecrets(req.Info.Name, req.Body) {
			return
		}
		// In any encoding: a protobuf Secret's too. JSON and YAML are
		// made JSON as they are; only another encoding is decoded.
		var j []byte
		var err error
		if f, _ := kdecode.Detect(req.Body); f == kdecode.JSON || f == kdecode.YAML {
			j, err = yaml.YAMLToJSON(req.Body)
		} else {
			var v any
			if v, err = kdecode.Value(req.Body); err == nil {
				j, err = json.Marshal(v)
			}
		}
		if err == nil {
			req.secrets = record.SecretStrings(req.Info.Resource, req.Info.Name, j)
		}
	})
	return req.secrets
}

// recordSpans makes a handler stage's span and its children's after the
// fact and returns when the stage began and how long it took. A stage
// with no times of its own is one the handler's run did not time: a
// stage that did not apply or was not reached (a GET's admission) is a
// point at after, where the stage before it ended; any other lasts from
// after until now. (It was always "until now", so that a GET's three
// admission stages each showed the whole handler's time, storage's read
// included, in the record, the waterfall and the trace.)
//
// A stage that did not apply, with nothing under it, has no span, as a
// stage not reached has none: the replay span names them (skippedAttr)
// and the record says why. A GET's three admission stages were three of
// its trace's sixteen spans, each a point in time saying "a get is not
// admitted", and spans are most of what kproxy allocates for a request.
func (p *Pipeline) recordSpans(ctx context.Context, name string, res Result, after time.Time) (began time.Time, took time.Duration, spanless bool) {
	began, ended := res.Began, res.Ended
	switch {
	case !began.IsZero():
	case res.Outcome == record.Skip:
		began, ended = after, after
	default:
		began, ended = after, p.clock.Now()
	}
	if res.Outcome == record.Skip && !res.Unknown && len(res.Spans) == 0 {
		return began, ended.Sub(began), true
	}
	sctx, span := p.tracer.Start(ctx, name, trace.WithTimestamp(began))
	for _, c := range res.Spans {
		_, cs := p.tracer.Start(sctx, c.Name, trace.WithTimestamp(c.Start))
		cs.SetAttributes(attribute.String("kproxy.stage.outcome", c.Outcome))
		cs.SetAttributes(c.Attrs...)
		if c.Err != "" {
			cs.SetStatus(codes.Error, c.Err)
		}
		cs.End(trace.WithTimestamp(c.End))
	}
	endStageSpan(span, res)
	span.End(trace.WithTimestamp(ended))
	return began, ended.Sub(began), false
}

// skippedAttr, on the replay span, names the stages with no span of their
// own: those that did not apply to the request and those not reached.
const skippedAttr = "kproxy.stages.skipped"

// notReachedResult is a stage after the one that decided, or after the
// replay stopped.
func notReachedResult(name, decidedBy, stopped string) record.StageResult {
	why := "not reached: " + stopped
	if stopped == "" {
		why = "not reached: " + decidedBy + " decides the request"
	}
	return record.StageResult{Name: name, Outcome: record.Skip, Explanation: why}
}

// protect runs the stage, turning a panic into an error result. The
// panic and its stack go to kproxy's log, never into the record: a stack
// is no explanation, and the values it was handling may be secrets.
func (p *Pipeline) protect(stage string, req *Request, f func() Result) (res Result) {
	defer func() {
		if v := recover(); v != nil {
			why, blame := PanicReport(v, req.ID)
			p.log.Error("replay stage panicked ("+blame+")", "stage", stage, "record", req.ID, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			res = Failed(why)
		}
	}()
	return f()
}

// PanicReport says a replay failed on a panic (v, recovered): why, for
// a record (what kind of failure, and where, never the stack or the
// values involved), and blame, for the log line beside the stack. A
// panic in Kubernetes' own code (the replay runs the apiserver's) is
// kube-apiserver's too: a request that makes its handler panic has it
// abort the request (a probe found one: a protobuf body for a custom
// resource, answered by a dropped connection), which is worth saying
// rather than blaming kproxy. Called from the recovering function.
func PanicReport(v any, id string) (why, blame string) {
	what := "a panic"
	if err, ok := v.(runtime.Error); ok {
		what = "a panic (" + err.Error() + ")"
	}
	// net/http panics on a status code it cannot write (a webhook's
	// denial with code 1000, say): kube-apiserver's writer does so alike
	// and aborts the request (found by a probe; it had been blamed on
	// kproxy).
	if s, ok := v.(string); ok && strings.HasPrefix(s, "invalid WriteHeader code ") {
		return "the apiserver's handler writes a status code HTTP cannot carry (" + s + ": an admission webhook's or policy's refusal with such a code), " +
				"on which kube-apiserver's net/http panics too: it aborts the request (its connection closed, or its HTTP/2 stream reset), with no answer to predict",
			"in the apiserver's own handling, which kube-apiserver runs too"
	}
	if site := panicSite(v); upstreamCode(site) {
		return "the replay failed on " + what + " in the apiserver's own code (" + site + "), which kube-apiserver runs for this request too: " +
				"it likely fails the request alike (a Kubernetes bug: its handler panics and the request is aborted, with no answer to predict); " +
				"the stack is in kproxy's log under record " + id,
			"in Kubernetes' code, which the apiserver runs too"
	}
	return "the replay failed on " + what + ", a kproxy bug: the stack is in kproxy's log under record " + id, "a kproxy bug"
}

// panicSite is the function that panicked: the first frame past the
// runtime's panic machinery, as seen from a deferred recover. A panic
// carried over from another goroutine (the apiserver's timeout filter
// panics again with the first one's stack in its value) is read from
// that stack.
func panicSite(v any) string {
	if s, ok := v.(string); ok && strings.Contains(s, "\ngoroutine ") {
		return stackSite(s)
	}
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	inPanic := false
	for {
		f, more := frames.Next()
		switch {
		case f.Function == "runtime.gopanic":
			inPanic = true
		case inPanic && !strings.HasPrefix(f.Function, "runtime."):
			return f.Function
		}
		if !more {
			return ""
		}
	}
}

// stackSite is the function that panicked in a stack as Go prints it:
// the first function past panic( and the runtime's frames.
func stackSite(stack string) string {
	inPanic := false
	for _, line := range strings.Split(stack, "\n") {
		switch {
		case strings.HasPrefix(line, "panic("):
			inPanic = true
		case !inPanic || line == "" || strings.HasPrefix(line, "\t") || strings.HasPrefix(line, "runtime."):
		default:
			if i := strings.LastIndex(line, "("); i > 0 {
				return line[:i]
			}
			return line
		}
	}
	return ""
}

// upstreamCode reports a function of Kubernetes' own modules.
func upstreamCode(fn string) bool {
	return strings.HasPrefix(fn, "k8s.io/")
}

// endStageSpan records a stage's verdict on its span. A stage that
// refuses the request, or whose replay failed, is an error: that is the
// span an operator looks for in a refused request's trace.
func endStageSpan(span trace.Span, res Result) {
	span.SetAttributes(
		attribute.String("kproxy.stage.outcome", res.Outcome),
		attribute.String("kproxy.stage.explanation", res.Explanation))
	switch res.Outcome {
	case record.Error:
		span.SetStatus(codes.Error, res.Explanation)
	case record.Reject:
		span.SetStatus(codes.Error, refusal(res.Status))
	}
}

// refusal is a refusal's short description: "403 Forbidden".
func refusal(st *metav1.Status) string {
	switch {
	case st == nil:
		return "rejected"
	case st.Reason != "":
		return fmt.Sprintf("%d %s", st.Code, st.Reason)
	}
	return fmt.Sprintf("%d %s", st.Code, http.StatusText(int(st.Code)))
}

// WaitReady waits, at most timeout, until the machinery that digests the
// cluster state asynchronously (the APF controller) has caught up with it.
func (p *Pipeline) WaitReady(ctx context.Context, timeout time.Duration) bool {
	if p.m == nil || p.m.apfReady == nil {
		return true
	}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		return p.m.apfReady(), nil
	})
	return err == nil
}

// Ready says why predictions are not ready yet (nil: they are): the
// cluster state has not synced, or APF has not digested it. Without a
// view of the cluster there is nothing to wait for.
func (p *Pipeline) Ready() error {
	if p.state == nil {
		return nil
	}
	if !p.state.Synced() {
		return errors.New("the replay's cluster state has not synced")
	}
	if p.m != nil && p.m.apfReady != nil && !p.m.apfReady() {
		return errors.New("the replay's APF controller has not digested the flow schemas")
	}
	return nil
}

// StorageAccess says how the storage stage reads: etcd directly (the
// apiserver's etcd3 store), or the apiserver's view and why.
func (p *Pipeline) StorageAccess() (etcd bool, why string) {
	if p.m == nil || p.m.writer() == nil {
		return false, "the write path is not built"
	}
	return p.m.writer().EtcdAccess()
}

// APFNames resolves the UIDs of the apiserver's X-Kubernetes-PF-* response
// headers to FlowSchema and PriorityLevelConfiguration names, from the
// replay's informers; unknown UIDs resolve to "".
func (p *Pipeline) APFNames(fsUID, plUID string) (flowSchema, priorityLevel string) {
	if p.m == nil || p.m.apfName == nil {
		return "", ""
	}
	return p.m.apfName(fsUID, plUID)
}

// recordedChildren are the children a stage's record keeps. A stage that
// passed keeps those that had something to say: the member that decided,
// and any that answered "no opinion" or failed before it. The members it
// never asked, and the authenticators that found no credential they read,
// are left out of the record (the trace still names them): they are the
// same in every record and explain nothing. A stage that refused or
// failed keeps every member, each one's answer a near miss.
func recordedChildren(res Result) []record.StageResult {
	if res.Outcome != record.Pass {
		return res.Children
	}
	kept := res.Children[:0:0]
	for _, c := range res.Children {
		if c.Outcome == record.Skip && (c.Explanation == notAskedChild || c.Explanation == noCredentialChild) {
			continue
		}
		kept = append(kept, c)
	}
	if len(kept) == 0 {
		return nil
	}
	return kept
}
