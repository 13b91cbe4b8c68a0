package stages

import (
	"context"
	"fmt"
	"net/http"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
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

// IsLongRunning reports whether kube-apiserver counts the request as
// long-running (a watch, an exec, a log, a proxy): held open, rather
// than answered.
func IsLongRunning(r *http.Request, info *apirequest.RequestInfo) bool {
	return info != nil && longRunning(r, info)
}

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
	if why := f.classifiedLate(ctx, req, fs); why != "" {
		// Not a prediction of the classification: the stage still passes
		// (a 429 the apiserver gave is the shed check's, moment.go).
		return Pass(why)
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

// classifiedLate says why the replay's classification (fs) is not the
// request's, or "": kproxy saw the FlowSchemas or PriorityLevels change
// after the request arrived, and the apiserver's answer names another
// FlowSchema (its X-Kubernetes-PF-FlowSchema-UID). A request held long
// (a list waiting for a resourceVersion, a slow webhook) is replayed
// after its answer, against the FlowSchemas as they are then (found by a
// probe: a FlowSchema's precedence changed during a 3 s list, the
// replay named the FlowSchema that matches since, every time).
func (f *flowControl) classifiedLate(ctx context.Context, req *Request, fs *flowcontrolv1.FlowSchema) string {
	if !answerAwaited(req) || req.Arrival.IsZero() || !f.m.apfChanges.changedSince(req.Arrival) {
		return ""
	}
	aw, ok := req.Actual(ctx)
	if !ok || aw.FlowSchemaUID == "" || aw.FlowSchemaUID == string(fs.UID) {
		return ""
	}
	theirs := aw.FlowSchemaUID
	if f.m.apfName != nil {
		if name, _ := f.m.apfName(aw.FlowSchemaUID, ""); name != "" {
			theirs = fmt.Sprintf("%q", name)
		}
	}
	return fmt.Sprintf("the apiserver classified the request under FlowSchema %s (its answer's X-Kubernetes-PF-FlowSchema-UID), and the replay, "+
		"reading the FlowSchemas after kproxy saw them change since this request arrived, under %q: which FlowSchema and PriorityLevel "+
		"the request met is not predicted", theirs, fs.Name)
}
