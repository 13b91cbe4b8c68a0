package stages

import (
	"context"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"

	"github.com/kproxy/kproxy/internal/record"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// Stage is one step of the apiserver's request path.
type Stage interface {
	// Name is the contract's stage name.
	Name() string
	// Run decides the stage for the request. It must not modify req.HTTP or
	// write to the cluster, and must return promptly when ctx is done: the
	// replay has a budget, and the record waits for the replay.
	Run(ctx context.Context, req *Request) Result
}

// Request is what the replay sees of one request: a copy, never the request
// being forwarded.
type Request struct {
	// ID is the capture record's id.
	ID string
	// Arrival is when kproxy received the request; the replay predicts from
	// the cluster state at that moment.
	Arrival time.Time
	// HTTP is a clone of the incoming request: method, URL, headers
	// (credentials included, in memory only), TLS state. Its body is nil.
	HTTP *http.Request
	// Body is the request body, up to MaxBodyBytes.
	Body []byte
	// BodyTruncated is set when the body was longer than MaxBodyBytes.
	BodyTruncated bool
	// Info is the request as the apiserver's RequestInfoFactory resolves it.
	Info *apirequest.RequestInfo
	// User is the identity after the stages that decide it have run (set by
	// authentication and impersonation); nil before.
	User user.Info
	// Caller is the authenticated identity, before impersonation.
	Caller user.Info
	// Given is an identity a CI test case gives by name (kproxy test
	// --engine local): authentication takes it as found, with no
	// credential to check. nil for every proxied request.
	Given user.Info
	// FlowSchema and PriorityLevel are APF's classification (flowcontrol).
	FlowSchema, PriorityLevel string

	// Gate, when set, is asked once the stages that decide who the
	// request runs as have passed (authentication, impersonation): a
	// non-empty answer ends the replay there, the stages after it not
	// replayed and the prediction unknown, with that answer as the
	// reason (kproxy serve --replay-filter on a user known only then).
	Gate func(caller, actingAs user.Info) string

	// Actual waits for the apiserver's answer (false if ctx ends first).
	// The replay uses it to tell a write's own write from the state at
	// arrival, and to take the object a get met from a get's answer;
	// never to predict a refusal.
	Actual func(ctx context.Context) (apiserver.Answer, bool)

	// secrets are the body's secret values (SecretStringsOf), found once.
	secretsOnce sync.Once
	secrets     []string
	// stored finds the secret values of the objects the replay's
	// admission was given (a patch's or a delete's stored object), set
	// after the handler's run.
	storedMu sync.Mutex
	stored   func() []string
}

// Answer is what the apiserver answered (apiserver.Answer).
type Answer = apiserver.Answer

// MaxBodyBytes is the apiserver's own request body limit (3 MiB): a longer
// body is rejected upstream with 413, so the replay never needs more.
const MaxBodyBytes = apiserver.MaxBodyBytes

// Result is a stage's verdict.
type Result struct {
	Outcome     string
	Explanation string
	// Status is what the real apiserver answers when Outcome is reject.
	Status *metav1.Status
	// Answer is the status of a success, when the stage knows it is not
	// the usual 200 or 201 (a 304, say).
	Answer int
	// Children hold finer detail: each authenticator, authorizer, plugin.
	Children []record.StageResult
	// Unknown marks a stage that cannot say (not modelled yet, or lacking
	// configuration or state): the prediction cannot be known past it.
	Unknown bool
	// Began and Ended are set by stages whose work happened earlier (the
	// write path runs once for decode through storage): the stage's span
	// and duration take these times, and Spans its children's.
	Began, Ended time.Time
	Spans        []childSpan
	// Recheck, when set, is asked with the apiserver's answer once the
	// replay has run (a request whose answer is awaited): a non-empty
	// reason makes the stage's verdict, and the prediction, unknown. It is
	// for a verdict taken from state the replay keeps for itself (a token
	// cache) that the apiserver's may not hold, which only the answer can
	// show: asked at the end, it holds no replay worker waiting for it.
	Recheck func(Answer) string
}

// childSpan is a span recorded after the fact: an admission plugin's
// call, an etcd read.
type childSpan struct {
	Name       string
	Start, End time.Time
	Outcome    string
	Err        string
	Attrs      []attribute.KeyValue
}

// Pass, Skip, Reject and Errorf build results.
func Pass(explanation string) Result { return Result{Outcome: record.Pass, Explanation: explanation} }

// Skip is a stage that does not apply to the request.
func Skip(explanation string) Result { return Result{Outcome: record.Skip, Explanation: explanation} }

// Reject is a stage that would refuse the request with st.
func Reject(st *metav1.Status, explanation string) Result {
	return Result{Outcome: record.Reject, Status: st, Explanation: explanation}
}

// Failed is a stage whose replay itself failed.
func Failed(explanation string) Result {
	return Result{Outcome: record.Error, Explanation: explanation}
}

// Unknown is a stage that cannot decide: the prediction becomes unknown.
// The stage is reported skipped with the reason.
func Unknown(explanation string) Result {
	return Result{Outcome: record.Skip, Explanation: explanation, Unknown: true}
}

// IsWrite reports whether the request goes through the resource handler's
// write path (decode, admission, validation, storage).
func IsWrite(info *apirequest.RequestInfo) bool { return apiserver.IsWrite(info) }

// forServer is the request as the replay apiserver runs it.
func (r *Request) forServer() *apiserver.Request {
	return &apiserver.Request{HTTP: r.HTTP, Info: r.Info, User: r.User, Arrival: r.Arrival,
		Body: r.Body, BodyTruncated: r.BodyTruncated, Actual: r.Actual}
}
