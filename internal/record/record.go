// Package record defines the capture record, the one data shape behind the
// capture file, the live event stream, kproxy explain, the tests and the
// spans (docs/capture-format.md: fields may be added, never renamed), and
// the contract's vocabulary: the stage names in the apiserver's order and
// the stage outcomes.
package record

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"
)

// Stage outcomes.
const (
	Pass   = "pass"
	Reject = "reject"
	Skip   = "skip"
	Error  = "error"
)

// The stage names (docs/labelling.md), in the apiserver's order.
const (
	StageAuthentication      = "authentication"
	StageImpersonation       = "impersonation"
	StageFlowControl         = "flowcontrol"
	StageAuthorization       = "authorization"
	StageDecode              = "decode"
	StageMutatingAdmission   = "mutating-admission"
	StageValidation          = "validation"
	StageValidatingAdmission = "validating-admission"
	StageStorage             = "storage"
)

// StageOrder lists the stage names in the apiserver's order: every record
// has one result per stage, in this order.
var StageOrder = [...]string{
	StageAuthentication, StageImpersonation, StageFlowControl, StageAuthorization,
	StageDecode, StageMutatingAdmission, StageValidation, StageValidatingAdmission, StageStorage,
}

// BeforeHandler reports the stages of the apiserver's filter chain, which
// decide before its resource handler runs.
func BeforeHandler(stage string) bool {
	switch stage {
	case StageAuthentication, StageImpersonation, StageFlowControl, StageAuthorization:
		return true
	}
	return false
}

// StageUnknown is predicted.stage when kproxy cannot predict.
const StageUnknown = "unknown"

// Record is one proxied request: what kproxy predicted, what the upstream
// answered, and how long each part took.
type Record struct {
	ID        string        `json:"id"`
	Start     time.Time     `json:"start"`
	Request   Request       `json:"request"`
	Predicted Prediction    `json:"predicted"`
	Actual    Actual        `json:"actual"`
	Stages    []StageResult `json:"stages"`
	Latency   Latency       `json:"latency"`
	TraceID   string        `json:"traceID"`
	// Mode is how the request reached kproxy: "reverse" or "forward".
	Mode string `json:"mode,omitempty"`
	// Identity says how kproxy forwarded the caller: "token" (passed
	// through), "certificate" (impersonated), "anonymous", or "rejected".
	Identity string `json:"identity,omitempty"`
	// KubernetesVersion is the version whose rules the replay applied.
	KubernetesVersion string `json:"kubernetesVersion,omitempty"`
	// Server is where the apiserver itself spent the request's time, from
	// its own spans or its audit latency annotations; nil when neither
	// arrived.
	Server *Server `json:"server,omitempty"`
	// RerunOf is set on the record of a re-run (the flow API's replay):
	// the id of the flow whose request was replayed again at Start,
	// without going upstream; Actual is that flow's answer, copied.
	RerunOf string `json:"rerunOf,omitempty"`
	// Replica is the kproxy instance that wrote the record (kproxy serve
	// --replica), when set: several replicas behind one load balancer.
	Replica string `json:"replica,omitempty"`
}

// Request describes the request as the apiserver resolves it.
type Request struct {
	Method      string   `json:"method"`
	Path        string   `json:"path"`
	Query       string   `json:"query"`
	User        string   `json:"user"`
	Groups      []string `json:"groups"`
	Verb        string   `json:"verb"`
	APIGroup    string   `json:"apiGroup"`
	APIVersion  string   `json:"apiVersion"`
	Resource    string   `json:"resource"`
	Subresource string   `json:"subresource"`
	Namespace   string   `json:"namespace"`
	Name        string   `json:"name"`
	// ActingAs is the user the request runs as after impersonation, when
	// it impersonates; User and Groups are the authenticated caller.
	ActingAs string `json:"actingAs,omitempty"`
	// Protocol is the client's HTTP version (HTTP/1.1, HTTP/2.0), as
	// Go's Request.Proto has it; kubectl and client-go speak HTTP/2.
	Protocol string `json:"protocol,omitempty"`
	// UserAgent and ContentType help tell clients and encodings apart.
	UserAgent   string `json:"userAgent,omitempty"`
	ContentType string `json:"contentType,omitempty"`
	// BodyBytes is how many request body bytes went upstream.
	BodyBytes int64 `json:"bodyBytes,omitempty"`
	// Headers are the client's request headers, credentials redacted
	// (RedactHeaders).
	Headers map[string][]string `json:"headers,omitempty"`
	// Body is a write's body as JSON (decoded from YAML, protobuf or CBOR
	// when sent so), with secrets redacted (RedactBody); only with
	// kproxy serve --capture-bodies.
	Body json.RawMessage `json:"body,omitempty"`
	// BodyNote says why a write's body is not in Body (too large, not
	// decodable) when bodies are captured.
	BodyNote string `json:"bodyNote,omitempty"`
	// Impersonate is what the Impersonate-* headers ask for (only with
	// --capture-bodies, which records what replaying the request needs).
	Impersonate *Impersonation `json:"impersonate,omitempty"`
}

// ScopeNamespace is the namespace the request is in, as kubectl has it:
// "" for a Namespace itself and its subresources, which are
// cluster-scoped (the apiserver's RequestInfo, and so Namespace, gives
// /api/v1/namespaces/x the namespace x).
func (q *Request) ScopeNamespace() string {
	if q.Resource == "namespaces" && q.APIGroup == "" && q.Namespace == q.Name {
		return ""
	}
	return q.Namespace
}

// Impersonation is a request's Impersonate-* headers.
type Impersonation struct {
	User   string              `json:"user,omitempty"`
	UID    string              `json:"uid,omitempty"`
	Groups []string            `json:"groups,omitempty"`
	Extra  map[string][]string `json:"extra,omitempty"`
}

// Prediction is the replay's verdict.
type Prediction struct {
	Status  int    `json:"status"`
	Stage   string `json:"stage"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
	// FlowSchema and PriorityLevel are the replay's APF classification,
	// to compare with actual.flowSchema / actual.priorityLevel.
	FlowSchema    string `json:"flowSchema,omitempty"`
	PriorityLevel string `json:"priorityLevel,omitempty"`
}

// Actual is what the upstream apiserver answered.
type Actual struct {
	Status        int    `json:"status"`
	Reason        string `json:"reason"`
	Message       string `json:"message"`
	AuditID       string `json:"auditID"`
	FlowSchema    string `json:"flowSchema"`
	PriorityLevel string `json:"priorityLevel"`
	// FlowSchemaUID and PriorityLevelUID are the raw APF response headers.
	FlowSchemaUID    string `json:"flowSchemaUID,omitempty"`
	PriorityLevelUID string `json:"priorityLevelUID,omitempty"`
	// Warnings are the apiserver's Warning headers.
	Warnings []string `json:"warnings,omitempty"`
	// RetryAfter is the Retry-After header of a 429 (or 503), in seconds.
	RetryAfter string `json:"retryAfter,omitempty"`
	// ResponseBytes is how many body bytes reached the client (after a
	// switch of protocols, what the apiserver sent on the connection).
	ResponseBytes int64 `json:"responseBytes,omitempty"`
	// Events is how many events a watch answered 200 over HTTP carried to
	// the client (JSON or protobuf; a WebSocket watch's, and a stream the
	// apiserver compressed (Content-Encoding: gzip), are not counted):
	// 0 for one that carried none, absent for any other request.
	Events *int64 `json:"events,omitempty"`
	// StreamError is the last ERROR event of such a watch: the apiserver
	// ends a watch it cannot go on with inside its 200 (410 Expired "too
	// old resource version", a storage error).
	StreamError *StreamStatus `json:"streamError,omitempty"`
	// Error is set when no answer came from the upstream (kproxy answered).
	Error string `json:"error,omitempty"`
	// Headers are the response headers the client received, redacted as
	// request headers are.
	Headers map[string][]string `json:"headers,omitempty"`
}

// StreamStatus is a Status the apiserver sent inside a stream.
type StreamStatus struct {
	Code    int    `json:"code"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// NoAnswer reports a record whose status kproxy wrote because the
// apiserver's answer never came: the client went away first (499), the
// apiserver could not be reached (502), the request's body stopped
// arriving (408), the apiserver hung up without an answer and kproxy
// aborted the client's request alike (no status: 0), or kproxy refused
// to forward a caller it cannot
// forward as exactly that caller (403, ErrorUnforwardable), each with
// Error saying so. Such a status is no answer to compare a prediction
// with.
func (a Actual) NoAnswer() bool {
	if a.Error == "" {
		return false
	}
	if strings.HasPrefix(a.Error, ErrorUnforwardable) {
		return true
	}
	switch a.Status {
	case 0, StatusClientCanceled, http.StatusBadGateway, http.StatusRequestTimeout:
		// 0: aborted before any answer (the apiserver hung up, and kproxy
		// ended the client's request alike).
		return true
	}
	return false
}

// ErrorUnforwardable begins the Error of a request kproxy refused (403)
// because no impersonation makes the apiserver see its caller exactly.
const ErrorUnforwardable = "answered by kproxy: it cannot forward this caller by impersonation exactly: "

// StatusClientCanceled is the status a record gets when its client went
// away before the apiserver answered (nginx's 499; the client sees none).
const StatusClientCanceled = 499

// StageResult is one stage's verdict; Children hold finer detail (each
// authenticator, authorizer, admission plugin, webhook).
type StageResult struct {
	Name       string `json:"name"`
	Outcome    string `json:"outcome"`
	DurationNs int64  `json:"durationNs"`
	// OffsetNs is when the stage began, from the start of the replay (a
	// waterfall's time axis); absent on children and stages not reached.
	OffsetNs    int64         `json:"offsetNs,omitempty"`
	Explanation string        `json:"explanation"`
	Children    []StageResult `json:"children,omitempty"`
}

// Latency splits the request's time.
type Latency struct {
	TotalNs    int64 `json:"totalNs"`
	UpstreamNs int64 `json:"upstreamNs"`
	ReplayNs   int64 `json:"replayNs"`
	// ServerNs is the apiserver's own time for the request (Server.TotalNs).
	ServerNs int64 `json:"serverNs,omitempty"`
}

// Sources of Server.
const (
	ServerFromTrace = "trace" // the apiserver's OpenTelemetry spans
	ServerFromAudit = "audit" // its audit events' apiserver.latency.k8s.io annotations
)

// Layer stages of a ServerLayer besides the contract's stage names.
const (
	LayerAudit         = "audit"
	LayerSerialization = "serialization"
	LayerOther         = "other"
)

// Server is the apiserver's own account of the request's time.
type Server struct {
	Source  string `json:"source"`
	TraceID string `json:"traceID,omitempty"`
	TotalNs int64  `json:"totalNs"`
	// Layers are in the order they began; a layer's SelfNs is its
	// duration less its children's (filter spans nest).
	Layers []ServerLayer `json:"layers"`
	// Summary says where the time went, in one sentence.
	Summary string `json:"summary"`
}

// ServerLayer is one layer of the apiserver: a filter, the handler, a
// webhook call, an etcd call, the serialization.
type ServerLayer struct {
	Name string `json:"name"`
	// Stage is a contract stage name, or LayerAudit, LayerSerialization,
	// LayerOther.
	Stage      string `json:"stage"`
	DurationNs int64  `json:"durationNs"`
	SelfNs     int64  `json:"selfNs"`
	// OffsetNs is when the layer began, from the start of the request at
	// the apiserver; Depth its nesting (0: the request itself). Both are
	// for drawing a waterfall; audit annotations give neither.
	OffsetNs int64 `json:"offsetNs,omitempty"`
	Depth    int   `json:"depth,omitempty"`
}
