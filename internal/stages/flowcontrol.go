package stages

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	genericfilters "k8s.io/apiserver/pkg/server/filters"
	utilflowcontrol "k8s.io/apiserver/pkg/util/flowcontrol"
	fcrequest "k8s.io/apiserver/pkg/util/flowcontrol/request"

	"github.com/kproxy/kproxy/internal/record"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// flowControl replays API Priority and Fairness classification with the
// apiserver's own APF controller, fed the cluster's FlowSchemas and
// PriorityLevelConfigurations: which FlowSchema matches the (impersonated)
// user and which priority level it sends the request to. Long-running
// requests other than watches are exempt, as in the apiserver. Whether a
// request would wait in a queue or be rejected with 429 depends on the
// apiserver's load at that instant, which kproxy does not see: the stage
// passes and says so.
type flowControl struct {
	m    *machinery
	opts *apiserver.Options
}

// nonMutatingVerbs are the verbs max-in-flight counts as reads (the
// apiserver's WithMaxInFlightLimit).
var nonMutatingVerbs = sets.NewString("get", "list", "watch")

// longRunning is kube-apiserver's own long-running check.
var longRunning = genericfilters.BasicLongRunningRequestCheck(
	sets.NewString("watch", "proxy"),
	sets.NewString("attach", "exec", "proxy", "log", "portforward"),
)

func newFlowControl(m *machinery) Stage { return &flowControl{m: m, opts: m.opts} }

func (flowControl) Name() string { return record.StageFlowControl }

func (f *flowControl) Run(ctx context.Context, req *Request) Result {
	if f.opts != nil && !f.opts.EnablePriorityAndFairness {
		// kube-apiserver's WithMaxInFlightLimit: long-running requests
		// (watches included) are not counted.
		if req.Info != nil && longRunning(req.HTTP, req.Info) {
			return Pass(fmt.Sprintf("--enable-priority-and-fairness=false: max-in-flight does not count %s, a long-running request", describeVerb(req)))
		}
		limit, kind := f.opts.MaxRequestsInFlight, "--max-requests-inflight"
		if req.Info != nil && !nonMutatingVerbs.Has(req.Info.Verb) {
			limit, kind = f.opts.MaxMutatingRequestsInFlight, "--max-mutating-requests-inflight"
		}
		if limit == 0 {
			return Pass(fmt.Sprintf("--enable-priority-and-fairness=false and %s=0: no limit applies", kind))
		}
		return Pass(fmt.Sprintf("--enable-priority-and-fairness=false: the request counts against %s=%d; whether it would be rejected (429) depends on the apiserver's load at that instant, which kproxy does not predict", kind, limit))
	}
	if req.Info != nil && req.Info.Verb != "watch" && longRunning(req.HTTP, req.Info) {
		return Pass(fmt.Sprintf("exempt from API Priority and Fairness: %s is a long-running request", describeVerb(req)))
	}
	if f.m.apf == nil {
		return Unknown("no cluster state to classify the request with (kproxy has no upstream credentials)")
	}
	if req.User == nil {
		return Unknown("the caller is not known (authentication was not replayed)")
	}
	if !f.m.apfReady() {
		return Unknown("the FlowSchemas and PriorityLevelConfigurations have not synced yet")
	}
	var fs *flowcontrolv1.FlowSchema
	var pl *flowcontrolv1.PriorityLevelConfiguration
	var distinguisher string
	f.m.apf.Handle(ctx, utilflowcontrol.RequestDigest{RequestInfo: req.Info, User: req.User},
		func(s *flowcontrolv1.FlowSchema, p *flowcontrolv1.PriorityLevelConfiguration, d string) {
			fs, pl, distinguisher = s, p, d
		},
		func() fcrequest.WorkEstimate { return fcrequest.WorkEstimate{InitialSeats: 1} },
		func(bool) {}, func() {})
	if fs == nil || pl == nil {
		return Unknown("API Priority and Fairness did not classify the request")
	}
	req.FlowSchema, req.PriorityLevel = fs.Name, pl.Name
	// The user is the record's (request.user, or actingAs when the
	// request impersonates): the matched rule names the subject that fits.
	what := fmt.Sprintf("FlowSchema %q (precedence %d) matches first", fs.Name, fs.Spec.MatchingPrecedence)
	if rule := matchedRule(fs, req.User, req.Info); rule != "" {
		what += " (" + rule + ")"
	}
	what += fmt.Sprintf(": PriorityLevel %q", pl.Name)
	if distinguisher != "" {
		what += fmt.Sprintf(", flow %q", distinguisher)
	}
	if pl.Spec.Type == flowcontrolv1.PriorityLevelEnablementExempt {
		return Pass(what + ", exempt: never queued or rejected")
	}
	return Pass(what + "; whether it queues or is rejected (429) depends on the apiserver's load at that instant, not predicted")
}

func describeVerb(req *Request) string {
	if req.Info == nil {
		return req.HTTP.Method
	}
	if req.Info.Subresource != "" {
		return req.Info.Verb + " " + req.Info.Resource + "/" + req.Info.Subresource
	}
	return req.Info.Verb + " " + req.Info.Resource
}

// shedBody begins the plain-text answer API Priority and Fairness and
// max-in-flight give a request they reject for load (the apiserver's
// tooManyRequests), which no Status carries.
const shedBody = "Too many requests, please try again later."

// ShedForLoad is the prediction to record once the apiserver's answer is
// known: p, unless the apiserver refused the request with 429 for a limit
// of that instant that the replay does not share.
//   - Shed for load by API Priority and Fairness or max-in-flight (their
//     plain-text 429): the flowcontrol stage cannot predict that (it
//     depends on the apiserver's load at that instant), so whatever the
//     stages after it predicted is not what the request met. A refusal
//     predicted before flowcontrol (authentication, impersonation) stands:
//     the apiserver decides those first, and a 429 contradicts it.
//   - Any other 429 (a Status: a watch cache still initializing or behind
//     the revision asked for, a rate-limiting admission plugin, a
//     disruption budget) where the replay predicted success: the replay
//     runs later, on kproxy's own state, and cannot have met that limit.
//
// The prediction becomes unknown, saying what the replay's stages answer.
func ShedForLoad(p record.Prediction, a record.Actual) record.Prediction {
	if a.Status != http.StatusTooManyRequests || p.Stage == record.StageUnknown {
		return p
	}
	var why string
	switch {
	case a.Reason == "" && strings.HasPrefix(a.Message, shedBody):
		if p.Stage == record.StageAuthentication || p.Stage == record.StageImpersonation {
			return p
		}
		by := "max-in-flight (--max-requests-inflight, --max-mutating-requests-inflight)"
		switch {
		case a.PriorityLevel != "":
			by = fmt.Sprintf("API Priority and Fairness, priority level %q", a.PriorityLevel)
		case a.PriorityLevelUID != "":
			by = "API Priority and Fairness, priority level uid " + a.PriorityLevelUID
		}
		why = "the apiserver shed the request for load (429 from " + by + "); whether a request is shed depends on the apiserver's load at that instant, which kproxy does not predict"
	case p.Stage == "" && p.Status != http.StatusTooManyRequests:
		why = fmt.Sprintf("the apiserver refused the request with 429 (%q), a limit of that instant (a watch cache not ready or behind, a rate limit, a disruption budget) that kproxy's replay, run after it on kproxy's own state, does not meet", a.Message)
	default:
		return p
	}
	then := fmt.Sprintf("the stages after flowcontrol allow the request (%d)", p.Status)
	if p.Stage != "" {
		then = fmt.Sprintf("the stages after flowcontrol refuse it at %s (%d)", p.Stage, p.Status)
	}
	return record.Prediction{Stage: record.StageUnknown, FlowSchema: p.FlowSchema, PriorityLevel: p.PriorityLevel,
		Message: "cannot predict: " + why + "; " + then}
}
