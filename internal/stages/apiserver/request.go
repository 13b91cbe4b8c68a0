package apiserver

import (
	"context"
	"net/http"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
)

// KubernetesVersion is the Kubernetes release whose code the replay runs.
const KubernetesVersion = "v1.37.2"

// ServerID names kproxy's replay where the apiserver's code wants an
// apiserver identity (metrics labels, configuration reloads).
const ServerID = "kproxy-replay"

// MaxBodyBytes is the apiserver's own request body limit (3 MiB): a
// longer body is refused upstream with 413, so the replay never needs
// more.
const MaxBodyBytes = 3 << 20

// Request is what the server runs: a copy of the client's request, as the
// replay sees it, with who it runs as.
type Request struct {
	// HTTP is a clone of the incoming request; its body is Body.
	HTTP *http.Request
	// Info is the request as the apiserver's RequestInfoFactory resolves it.
	Info *apirequest.RequestInfo
	// User is who the request runs as (after impersonation).
	User user.Info
	// Arrival is when the request arrived: the state the replay reads.
	Arrival time.Time
	// Body is the request body, up to MaxBodyBytes; BodyTruncated is set
	// when it was longer, or not read to its end.
	Body          []byte
	BodyTruncated bool
	// Actual waits for the apiserver's answer (false if ctx ends first):
	// to tell a write's own write from the state at arrival, and to take
	// the object a get of the latest met from its answer (answered.go);
	// never to predict a refusal; to say the replay met other state than
	// the request did (own_write.go).
	Actual func(ctx context.Context) (Answer, bool)
}

// Answer is what the apiserver answered: the status, for a write the
// resourceVersion of the object it returned ("" if none), for a refusal
// the Status it refused with, and for a get the body of a successful
// answer when kproxy kept the whole of it.
type Answer struct {
	Status int
	// FlowSchemaUID is the answer's X-Kubernetes-PF-FlowSchema-UID: the
	// FlowSchema API Priority and Fairness classified the request under.
	FlowSchemaUID   string
	ResourceVersion string
	// LastModified is the answer's Last-Modified header: for a document
	// the apiserver stamps as it serves it, its clock at that moment.
	LastModified string
	// DeletedUID is the uid a delete's answer names when it is a Status
	// (the object was removed, not only marked): its details' uid.
	DeletedUID string
	// EmptiedFinalizers: an update's answer is its object being deleted
	// with no finalizers left (decode.ObjectEmptiedFinalizers).
	EmptiedFinalizers bool
	// Refusal is a refused request's Status (nil when the body was none):
	// read only to tell a replay that met other state (a quota's usage, a
	// namespace's termination, RBAC) from one that disagrees.
	Refusal *metav1.Status
	// Body is the whole body of a get's 200 answer (nil when it was not
	// kept, or not whole), with its Content-Type and Content-Encoding.
	Body                         []byte
	ContentType, ContentEncoding string
}

// PluginExplainer adds what an admission plugin's refusal leaves out (the
// replay's explainers, in package stages).
type PluginExplainer interface {
	// Explain is the detail of plugin's refusal err, or "".
	Explain(plugin string, a admission.Attributes, err error) string
	// Webhook describes an admission webhook by name.
	Webhook(name string) string
}
