package stages

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/kproxy/kproxy/internal/record"
)

// contractOrder is the contract's vocabulary, spelled out: the JSON other
// tools read (docs/capture-format.md).
var contractOrder = []string{"authentication", "impersonation", "flowcontrol", "authorization", "decode",
	"mutating-admission", "validation", "validating-admission", "storage"}

func TestNewHasContractStagesInOrder(t *testing.T) {
	if got := New(context.Background(), Config{}).Names(); !slices.Equal(got, contractOrder) {
		t.Fatalf("stages %v, want %v", got, contractOrder)
	}
	if !slices.Equal(record.StageOrder[:], contractOrder) {
		t.Fatalf("record.StageOrder %v, want the contract's %v", record.StageOrder, contractOrder)
	}
}

// fake is a stage with a scripted result.
type fake struct {
	name string
	run  func(ctx context.Context) Result
}

func (f fake) Name() string                               { return f.name }
func (f fake) Run(ctx context.Context, _ *Request) Result { return f.run(ctx) }

func result(r Result) func(context.Context) Result { return func(context.Context) Result { return r } }

func forbidden() Result {
	st := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("no rule")).Status()
	return Reject(&st, "no rule")
}

func TestRun(t *testing.T) {
	pass := result(Pass("ok"))
	cases := []struct {
		name         string
		stages       []func(context.Context) Result
		budget       time.Duration
		wantOutcomes []string
		wantPred     record.Prediction
		wantMsg      string // substring of the unknown message
		wantLog      string // in kproxy's log, never in the record
	}{
		{
			name:         "all pass predicts success",
			stages:       []func(context.Context) Result{pass, pass, pass},
			wantOutcomes: []string{"pass", "pass", "pass"},
			wantPred:     record.Prediction{Status: 200},
		},
		{
			name:         "first reject decides, later stages not reached",
			stages:       []func(context.Context) Result{pass, result(forbidden()), pass},
			wantOutcomes: []string{"pass", "reject", "skip"},
			wantPred:     record.Prediction{Status: 403, Stage: "s1", Reason: "Forbidden", Message: `pods is forbidden: no rule`},
		},
		{
			name:         "a stage not modelled makes the prediction unknown",
			stages:       []func(context.Context) Result{result(notModelled()), pass},
			wantOutcomes: []string{"skip", "pass"},
			wantPred:     record.Prediction{Stage: record.StageUnknown},
			wantMsg:      "s0: not modelled yet",
		},
		{
			name:         "unknown before a reject stays unknown",
			stages:       []func(context.Context) Result{result(notModelled()), result(forbidden())},
			wantOutcomes: []string{"skip", "reject"},
			wantPred:     record.Prediction{Stage: record.StageUnknown},
			wantMsg:      "s0: not modelled yet",
		},
		{
			name:         "a panic is an error, never a guess",
			stages:       []func(context.Context) Result{func(context.Context) Result { panic("boom") }, pass},
			wantOutcomes: []string{"error", "pass"},
			wantPred:     record.Prediction{Stage: record.StageUnknown},
			wantMsg:      "s0 failed: the replay failed on a panic, a kproxy bug: the stack is in kproxy's log",
			wantLog:      "boom",
		},
		{
			name: "past the budget is an error",
			stages: []func(context.Context) Result{func(ctx context.Context) Result {
				<-ctx.Done()
				return Pass("late")
			}, pass},
			budget:       20 * time.Millisecond,
			wantOutcomes: []string{"error", "skip"},
			wantPred:     record.Prediction{Stage: record.StageUnknown},
			wantMsg:      "replay budget exceeded",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sr := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
			var ss []Stage
			for i, f := range tc.stages {
				ss = append(ss, fake{name: "s" + string(rune('0'+i)), run: f})
			}
			var logs strings.Builder
			p := newPipeline(Config{TracerProvider: tp, Budget: tc.budget, Log: slog.New(slog.NewTextHandler(&logs, nil))}, ss...)
			req := &Request{HTTP: httptest.NewRequest("GET", "/api/v1/pods", nil)}
			out := p.Run(context.Background(), req)
			var outcomes []string
			for _, s := range out.Stages {
				outcomes = append(outcomes, s.Outcome)
			}
			if !slices.Equal(outcomes, tc.wantOutcomes) {
				t.Errorf("outcomes %v, want %v", outcomes, tc.wantOutcomes)
			}
			got := out.Predicted
			if tc.wantLog != "" {
				if !strings.Contains(logs.String(), tc.wantLog) || !strings.Contains(logs.String(), "goroutine") {
					t.Errorf("the log lacks %q and the stack: %s", tc.wantLog, logs.String())
				}
				if strings.Contains(got.Message, tc.wantLog) || strings.Contains(got.Message, "goroutine") {
					t.Errorf("the record's message holds the panic's value or stack: %q", got.Message)
				}
			}
			if tc.wantMsg != "" {
				if !strings.Contains(got.Message, tc.wantMsg) {
					t.Errorf("message %q lacks %q", got.Message, tc.wantMsg)
				}
				got.Message = ""
			}
			if got != tc.wantPred {
				t.Errorf("predicted %+v, want %+v", got, tc.wantPred)
			}
			// One span for the replay and one per stage that ran.
			var names []string
			for _, s := range sr.Ended() {
				names = append(names, s.Name())
			}
			if !slices.Contains(names, "replay") {
				t.Errorf("no replay span in %v", names)
			}
		})
	}
}

func TestSuccessStatus(t *testing.T) {
	for _, tc := range []struct {
		method, path string
		answer       int // what a stage decided, or 0
		want         int
	}{
		{"POST", "/api/v1/namespaces/default/configmaps", 0, 201},
		{"GET", "/api/v1/namespaces/default/configmaps", 0, 200},
		{"PUT", "/api/v1/namespaces/default/configmaps/x", 0, 200},
		{"GET", "/apis", 304, 304},
		{"POST", "/api/v1/namespaces/default/pods/p/binding", 201, 201},
	} {
		r := httptest.NewRequest(tc.method, tc.path, nil)
		info, err := ResolveRequestInfo(r)
		if err != nil {
			t.Fatal(err)
		}
		if got := successStatus(&Request{HTTP: r, Info: info}, tc.answer); got != tc.want {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path, got, tc.want)
		}
	}
}

// notModelled is a stage's honest answer when it cannot replay a request.
func notModelled() Result { return Unknown("not modelled yet") }

// identityStage is a fake identity stage: it passes and sets who the
// request runs as, as authentication and impersonation do.
type identityStage struct {
	name string
	u    user.Info
}

func (s identityStage) Name() string { return s.name }
func (s identityStage) Run(_ context.Context, req *Request) Result {
	if req.Caller == nil {
		req.Caller = s.u
	}
	req.User = s.u
	return Pass("ok")
}

// TestGate: Request.Gate is asked once the identity stages passed; its
// answer ends the replay there (the stages after it skipped, saying why,
// the prediction unknown), or lets it go on; a request refused before
// has its verdict, and the gate is not asked.
func TestGate(t *testing.T) {
	bob := &user.DefaultInfo{Name: "bob"}
	for _, tc := range []struct {
		name         string
		authn        Stage
		gate         string // the gate's answer
		wantAsked    bool
		wantOutcomes []string
		wantPred     record.Prediction
	}{
		{"picked", identityStage{"authentication", bob}, "", true,
			[]string{"pass", "pass", "pass"}, record.Prediction{Status: 200}},
		{"left out", identityStage{"authentication", bob}, "outside the filter", true,
			[]string{"pass", "pass", "skip"}, record.Prediction{Stage: record.StageUnknown, Message: "outside the filter"}},
		{"refused first", fake{name: "authentication", run: result(forbidden())}, "outside the filter", false,
			[]string{"reject", "skip", "skip"}, record.Prediction{Status: 403, Stage: "authentication", Reason: "Forbidden", Message: "pods is forbidden: no rule"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPipeline(Config{}, tc.authn, identityStage{"impersonation", bob}, fake{name: "authorization", run: result(Pass("allowed"))})
			var asked user.Info
			req := &Request{HTTP: httptest.NewRequest("GET", "/api/v1/pods", nil), Gate: func(caller, _ user.Info) string {
				asked = caller
				return tc.gate
			}}
			out := p.Run(context.Background(), req)
			var outcomes []string
			for _, s := range out.Stages {
				outcomes = append(outcomes, s.Outcome)
			}
			if !slices.Equal(outcomes, tc.wantOutcomes) || out.Predicted != tc.wantPred {
				t.Errorf("outcomes %v, predicted %+v; want %v, %+v", outcomes, out.Predicted, tc.wantOutcomes, tc.wantPred)
			}
			if (asked != nil) != tc.wantAsked || asked != nil && asked.GetName() != "bob" {
				t.Errorf("gate asked with %v, want asked %v (with bob)", asked, tc.wantAsked)
			}
			if out.Gated != (tc.gate != "" && tc.wantAsked) {
				t.Errorf("Gated %v", out.Gated)
			}
			if out.Gated && out.Stages[2].Explanation != tc.gate {
				t.Errorf("the stage after the gate says %q, want %q", out.Stages[2].Explanation, tc.gate)
			}
		})
	}
}

// TestRecordedChildren: a stage that passed keeps the members that spoke;
// one that refused or failed keeps them all.
func TestRecordedChildren(t *testing.T) {
	chain := []record.StageResult{
		{Name: "x509", Outcome: record.Skip, Explanation: noCredentialChild},
		{Name: "node", Outcome: record.Skip, Explanation: "no opinion: node: not a node"},
		{Name: "rbac", Outcome: record.Pass, Explanation: "allow"},
		{Name: "webhook", Outcome: record.Skip, Explanation: notAskedChild},
	}
	names := func(cs []record.StageResult) string {
		var out []string
		for _, c := range cs {
			out = append(out, c.Name)
		}
		return strings.Join(out, ",")
	}
	cases := []struct {
		outcome  string
		children []record.StageResult
		want     string
	}{
		{record.Pass, chain, "node,rbac"},
		{record.Reject, chain, "x509,node,rbac,webhook"},
		{record.Error, chain, "x509,node,rbac,webhook"},
		{record.Pass, chain[:1], ""},
		{record.Pass, nil, ""},
	}
	for _, c := range cases {
		got := recordedChildren(Result{Outcome: c.outcome, Children: c.children})
		if names(got) != c.want {
			t.Errorf("%s with %d children: kept %q, want %q", c.outcome, len(c.children), names(got), c.want)
		}
	}
	if names(chain) != "x509,node,rbac,webhook" {
		t.Errorf("recordedChildren changed the stage's own children: %s", names(chain))
	}
}

// TestPanicExplanation: a replay that panics in Kubernetes' own code (the
// apiserver's handler, run by the replay) says so: kube-apiserver panics
// on the request too. A panic in kproxy's code is kproxy's bug. A panic
// carried over from another goroutine, its stack in its value (the
// apiserver's timeout filter), is read from that stack.
func TestPanicExplanation(t *testing.T) {
	explain := func(f func()) (msg, blame string) {
		defer func() {
			msg, blame = PanicReport(recover(), "r1")
		}()
		f()
		return "", ""
	}
	carried := func(culprit string) func() {
		return func() {
			panic("runtime error: invalid memory address or nil pointer dereference\ngoroutine 7 [running]:\nruntime/debug.Stack()\n\t/usr/local/go/src/runtime/debug/stack.go:26 +0x5e\n" +
				"panic({0x603de80?, 0x9bf3210?})\n\t/usr/local/go/src/runtime/panic.go:860 +0x13a\n" +
				culprit + "({{0x0, 0x0}, {0x0, 0x0, 0x2dda3e9d32f0}}, ...)\n\t/root/go/pkg/mod/x.go:1319 +0x42\n" +
				"k8s.io/apiserver/pkg/endpoints/handlers.createHandler.func1(0x1)\n\t/root/go/pkg/mod/create.go:127\n")
		}
	}
	var meta *metav1.ObjectMeta
	for _, tc := range []struct {
		name        string
		f           func()
		want, blame string
	}{
		{"Kubernetes' code", func() { _ = meta.GetName() },
			"the replay failed on a panic (runtime error: invalid memory address or nil pointer dereference) in the apiserver's own code (k8s.io/apimachinery/pkg/apis/meta/v1.(*ObjectMeta).GetName), which kube-apiserver runs for this request too",
			"in Kubernetes' code"},
		{"a status code HTTP cannot carry", func() { httptest.NewRecorder().WriteHeader(1000) },
			"the apiserver's handler writes a status code HTTP cannot carry (invalid WriteHeader code 1000", "in the apiserver's own handling"},
		{"kproxy's code", func() { var s []int; _ = s[len(s)] },
			"the replay failed on a panic (runtime error: index out of range [0] with length 0), a kproxy bug: the stack is in kproxy's log under record r1", "a kproxy bug"},
		{"carried over, Kubernetes' code", carried("k8s.io/apiextensions-apiserver/pkg/apiserver.schemaCoercingDecoder.Decode"),
			"in the apiserver's own code (k8s.io/apiextensions-apiserver/pkg/apiserver.schemaCoercingDecoder.Decode)", "in Kubernetes' code"},
		{"carried over, kproxy's code", carried("github.com/kproxy/kproxy/internal/stages/apiserver.(*observedPlugin).Admit"),
			"a kproxy bug", "a kproxy bug"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg, blame := explain(tc.f)
			if !strings.Contains(msg, tc.want) || !strings.HasPrefix(blame, tc.blame) {
				t.Errorf("explanation %q, blame %q; want %q, %q", msg, blame, tc.want, tc.blame)
			}
		})
	}
}
