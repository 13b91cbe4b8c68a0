package stages

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// decode reports the resource handler up to admission: content type,
// body decoding and strict field validation, defaulting, conversion,
// query options, patch parsing; for a read (get, list, watch) its query
// options. When the handler is not run, decode says why (the
// resourceHandler's verdict before any run).
type decode struct{ m *machinery }

func (decode) Name() string { return record.StageDecode }

// before decides what the handler cannot be asked: requests the replay
// answers from elsewhere (the apiserver's own non-resource handlers,
// group discovery, aggregated APIs) or not at all. ok means run the
// handler.
func (d decode) before(ctx context.Context, req *Request) (res Result, ok bool) {
	w := d.m.writer() // once: it is read on every request
	if req.Info != nil && !req.Info.IsResourceRequest && w != nil {
		if res, answered := d.aggregatorDiscovery(w, req); answered {
			return res, false
		}
	}
	switch {
	case req.Info != nil && !req.Info.IsResourceRequest && w != nil && w.ServesDiscovery(req.HTTP.Method, req.Info):
		return Result{}, true // discovery and /version: the replay server's own handlers
	case req.Info == nil:
		return Unknown("the request could not be resolved as the apiserver resolves it"), false
	case !req.Info.IsResourceRequest && w == nil:
		return Unknown("the write path cannot be replayed: " + d.m.writeError().Error()), false
	case !req.Info.IsResourceRequest && !strings.HasPrefix(req.Info.Path, "/apis/"):
		return d.nonResource(ctx, req), false
	case !req.Info.IsResourceRequest:
		return d.groupDiscovery(req), false
	case req.Info.Verb == "proxy" && strings.HasPrefix(req.Info.Path, "/api/v1/proxy/"):
		// The proxy paths kube-apiserver dropped long ago: its request
		// resolution still names the verb "proxy" (authorized as such),
		// and the core group's web service, rooted at /api, has no route
		// for them: go-restful answers through its service error handler.
		st := &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusNotFound, Reason: metav1.StatusReasonNotFound,
			Message: "the server could not find the requested resource", Details: &metav1.StatusDetails{}}
		return Reject(st, "the apiserver no longer serves the proxy paths under /api/v1/proxy/ (use the proxy subresource: services/NAME/proxy, pods/NAME/proxy, nodes/NAME/proxy): "+
			"the web service rooted at /api has no route for them: 404 NotFound"), false
	case !apiserver.IsWrite(req.Info) && !apiserver.IsRead(req.Info) && req.Info.Verb != "":
		// Not a method the apiserver resolves to no verb (OPTIONS,
		// TRACE, any other): that runs as a read, go-restful has no
		// route for it and answers 405, as for a HEAD, before anything
		// reads storage.
		return Unknown("the " + req.Info.Verb + " verb: not modelled"), false
	}
	if why := notReplayable(req); why != "" {
		return Unknown(why), false
	}
	if w == nil {
		return Unknown("the write path cannot be replayed: " + d.m.writeError().Error()), false
	}
	if i := req.Info; !apiserver.BuiltIn(i.APIGroup) && !w.ServesCustom(i.APIGroup, i.Resource) {
		if why := groupChangedNear(w, i.APIGroup, req.Arrival); why != "" {
			return Unknown(fmt.Sprintf("kproxy sees nothing serving %q now: %s", i.Resource+"."+i.APIGroup, why)), false
		}
		if s, ok, why := aggregatedFor(w, i.APIGroup, i.APIVersion); ok && s.Spec.Service != nil {
			return aggregatedAPI(s, req.Info.Path), false
		} else if why != "" {
			return Unknown(why), false
		}
		if groupUnknown(w, i.APIGroup) {
			return Reject(muxNotFound(), fmt.Sprintf("no built-in group, CustomResourceDefinition or APIService serves the group %q: the apiserver's mux answers 404 page not found", i.APIGroup)), false
		}
		if noCRDNamed(w, i.Resource+"."+i.APIGroup) {
			return d.noSuchResource(ctx, req), false
		}
		return Unknown(fmt.Sprintf("%q is neither built in nor served by a CustomResourceDefinition or an APIService kproxy can see: one created or changed just now may not have reached kproxy's informers yet; otherwise not modelled", i.Resource+"."+i.APIGroup)), false
	}
	return Result{}, true
}

func (d decode) report(ctx context.Context, req *Request, run *apiserver.Run) Result {
	start, end, _ := run.PhaseTimes(apiserver.PhaseDecode)
	var res Result
	switch {
	case run.Unknown != "" && run.UnknownAt() == record.StageDecode:
		res = Unknown(run.Unknown)
	case run.Status != nil && strings.TrimSuffix(req.Info.Path, "/") == "/apis":
		// Aggregated discovery's refusal: the aggregator's own document,
		// not the replay server's.
		res = Unknown("the apiserver's aggregator serves aggregated discovery of /apis; its refusals (here " + apiserver.StatusMessage(run.Status) + " from kube-apiserver's own handler) are not replayed")
	case run.Decided == record.StageDecode && run.Handshake != "":
		res = Reject(run.Status, run.Handshake)
	case run.Decided == record.StageDecode && run.Code == http.StatusMethodNotAllowed:
		res = Reject(run.Status, "the apiserver's router (go-restful) serves no "+req.HTTP.Method+" on this path: "+apiserver.StatusMessage(run.Status))
	case run.Decided == record.StageDecode && run.Read:
		res = Reject(run.Status, "the apiserver's handler refuses the request's options before reading storage: "+apiserver.StatusMessage(run.Status))
	case run.Decided == record.StageDecode:
		res = Reject(run.Status, "the apiserver's handler refuses the request before admission: "+apiserver.StatusMessage(run.Status))
	case !req.Info.IsResourceRequest:
		res = d.discovery(ctx, req, run)
	case run.Read && run.Handshake != "":
		res = Pass("the handler accepts the " + req.Info.Verb + "'s options; " + run.Handshake)
	case run.Read:
		res = Pass("the handler accepts the " + req.Info.Verb + "'s options")
	default:
		res = Pass(decodedWhat(req))
	}
	if res.Outcome == record.Pass && (run.Code >= 200 && run.Code < 400 || run.Code == http.StatusSwitchingProtocols) {
		res.Answer = run.Code
	}
	res.Began, res.Ended = start, end
	return res
}

// discovery is the verdict on a discovery request the handler accepted. A
// conditional request for an aggregated discovery root is answered 304
// when the client's ETag is the apiserver's current one (the aggregator's
// document, not the replay server's: see discovery_etag.go).
func (d decode) discovery(ctx context.Context, req *Request, run *apiserver.Run) Result {
	inm := req.HTTP.Header.Get("If-None-Match")
	if !apiserver.DiscoveryRoot(req.Info) || (run.Code != http.StatusOK && run.Code != http.StatusNotModified) || run.ETag == "" || inm == "" {
		return Pass("the apiserver's discovery handlers answer " + req.Info.Path)
	}
	root := strings.TrimSuffix(req.Info.Path, "/")
	served := d.m.writer().Served()
	// /apis lists every group, /api the core group's only.
	at, seen := served.ChangedAt()
	if root == "/api" {
		at, seen = served.GroupChangedAt("")
	}
	if !seen {
		return Unknown("a conditional request of the discovery document " + root + " (If-None-Match): kproxy has not listed the CustomResourceDefinitions and APIServices it lists yet")
	}
	if !at.Before(req.Arrival.Add(-apiChangeLag)) {
		// The aggregator updates its document a moment after a change,
		// and kproxy reads its ETag after the request (a probe churning
		// CRDs: 304 answered, 200 predicted, 304 records).
		return Unknown(fmt.Sprintf("a conditional request of the discovery document %s (If-None-Match), and the CustomResourceDefinitions or APIServices it lists changed at %s, less than %v before the request arrived or since: "+
			"which ETag the apiserver had then is not known", root, at.UTC().Format("15:04:05.000"), apiChangeLag))
	}
	current, err := served.ETag(ctx, root)
	if err != nil {
		return Unknown("a conditional discovery request (If-None-Match): " + err.Error())
	}
	if current == inm {
		run.Code = http.StatusNotModified
		return Pass("the client's cached discovery document of " + req.Info.Path + " is current (If-None-Match is the apiserver's ETag): 304 Not Modified")
	}
	run.Code = http.StatusOK
	return Pass("the client's cached discovery document of " + req.Info.Path + " is out of date (If-None-Match is not the apiserver's current ETag): the document is sent again")
}

// notWriteReason says why a request has no decode or admission.
func notWriteReason(req *Request) string {
	if req.Info == nil || !req.Info.IsResourceRequest {
		return "not a resource request: nothing is admitted"
	}
	return "a " + req.Info.Verb + " is not admitted"
}

// notReplayable says why the write path cannot replay a write, or "".
func notReplayable(req *Request) string {
	i := req.Info
	if i.Resource == "componentstatuses" && (i.Verb != "get" || probedComponent(i.Name)) {
		return "componentstatuses are probed live by the apiserver: not modelled"
	}
	return ""
}

// probedComponent reports a component the apiserver's componentstatus
// registry probes live (its serversToValidate: the controller manager,
// the scheduler, etcd-N for each etcd it stores in); any other name it
// answers 404 without probing anything, which the replay's registry
// does too.
func probedComponent(name string) bool {
	if name == "controller-manager" || name == "scheduler" {
		return true
	}
	n, ok := strings.CutPrefix(name, "etcd-")
	if !ok || n == "" {
		return false
	}
	_, err := strconv.Atoi(n)
	return err == nil
}

func decodedWhat(req *Request) string {
	ct := req.HTTP.Header.Get("Content-Type")
	if ct == "" {
		ct = "no content type"
	}
	what := req.Info.Resource
	if req.Info.Subresource != "" {
		what += "/" + req.Info.Subresource
	}
	fv := req.HTTP.URL.Query().Get("fieldValidation")
	if fv == "" {
		fv = "Strict for apply, Warn otherwise (default)"
	}
	return strings.Join([]string{"decoded the " + req.Info.Verb + " of " + what + " (" + ct + ")", "field validation " + fv}, "; ")
}

// noSuchResource is the verdict on a resource of a group that is served
// (a CustomResourceDefinition or a local APIService names it) when no
// CustomResourceDefinition names the resource: the apiextensions handler
// finds none by that name and passes the request on, and the
// apiserver's mux answers 404 page not found. kproxy's view of the
// CustomResourceDefinitions comes from an informer, which can lag the
// apiserver's or run ahead of it (one created or deleted around the
// request): when the apiserver answered otherwise, the verdict says
// nothing about the request.
func (d decode) noSuchResource(ctx context.Context, req *Request) Result {
	name := req.Info.Resource + "." + req.Info.APIGroup
	if answerAwaited(req) {
		if aw, ok := req.Actual(ctx); ok && aw.Status != http.StatusNotFound {
			return Unknown(fmt.Sprintf("kproxy sees no CustomResourceDefinition %q, and the apiserver answered %d: one was created or deleted around this request, so which the apiserver saw on arrival is not known", name, aw.Status))
		}
	}
	return Reject(muxNotFound(), fmt.Sprintf("no CustomResourceDefinition %q: the group %q is served, but not this resource (the apiextensions handler finds no definition by that name and passes the request on), so the apiserver's mux answers 404 page not found", name, req.Info.APIGroup))
}

// noCRDNamed reports that kproxy's informer holds no
// CustomResourceDefinition of that name, in any state.
func noCRDNamed(w *apiserver.Server, name string) bool {
	_, err := w.CRDs().Get(name)
	return apierrors.IsNotFound(err)
}
