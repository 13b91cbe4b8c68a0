package stages

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor"
	"k8s.io/apiserver/pkg/endpoints/discovery/aggregated"
	"k8s.io/apiserver/pkg/endpoints/handlers/negotiation"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	genericfeatures "k8s.io/apiserver/pkg/features"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	apiregistrationv1helper "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1/helper"
	aggregatorscheme "k8s.io/kube-aggregator/pkg/apiserver/scheme"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// Discovery of API groups the replay server does not serve itself: groups
// of CustomResourceDefinitions (the apiextensions discovery controller is
// not run in the replay, but which versions an established definition
// serves is in the definitions themselves) and groups nobody serves (the
// apiserver's 404). The aggregator lists an aggregated group's versions
// itself, from its APIServices; a version's discovery is the aggregated
// API's own (unknown), or the aggregator's 503 while it is not Available.

// groupDiscovery is decode's verdict on GET /apis/<group>[/<version>] for
// a group the replay server does not serve.
func (d decode) groupDiscovery(req *Request) Result {
	rest := strings.Trim(strings.TrimPrefix(req.Info.Path, "/apis/"), "/")
	group, version, _ := strings.Cut(rest, "/")
	w := d.m.writer()
	if why := groupChangedNear(w, group, req.Arrival); why != "" {
		return Unknown("discovery of " + req.Info.Path + ": " + why)
	}
	if groupUnknown(w, group) {
		// No handler at all: the end of the chain answers, whatever
		// the method or the Accept.
		return Reject(muxNotFound(), fmt.Sprintf("no CustomResourceDefinition or APIService names the group %q: nothing serves %s, the apiserver's mux answers 404 page not found", group, req.Info.Path))
	}
	if req.HTTP.Method != http.MethodGet {
		return Unknown("the " + req.HTTP.Method + " of discovery path " + req.Info.Path + ": not modelled")
	}
	if strings.Contains(version, "/") {
		return Unknown("discovery path " + req.Info.Path + ": not modelled")
	}
	if !discoveryAcceptable(req.HTTP.Header.Get("Accept")) {
		return Unknown("discovery of " + req.Info.Path + " with Accept " + req.HTTP.Header.Get("Accept") + ": content negotiation not modelled")
	}
	crds, err := w.CRDs().List(labels.Everything())
	if err != nil {
		return Unknown("the cluster's CustomResourceDefinitions: " + err.Error())
	}
	for _, crd := range crds {
		if crd.Spec.Group != group || !apiserver.Established(crd) {
			continue
		}
		for _, v := range crd.Spec.Versions {
			if v.Served && (version == "" || v.Name == version) {
				return Pass("CustomResourceDefinition " + crd.Name + " serves " + req.Info.Path)
			}
		}
	}
	if w.Served() == nil || !w.Served().APIServicesSynced() {
		return Unknown("the aggregator's APIServices have not synced yet")
	}
	services, err := w.Served().APIServices.List(labels.Everything())
	if err != nil {
		return Unknown("the aggregator's APIServices: " + err.Error())
	}
	for _, s := range services {
		if s.Spec.Group == group && version == "" {
			// kube-aggregator's apiGroupHandler: the group's versions
			// listed from its APIServices, Available or not.
			return Pass("the aggregator lists group " + group + " from its APIServices (" + s.Name + " among them), whether or not they are Available")
		}
		if s.Spec.Group == group && s.Spec.Version == version {
			if s.Spec.Service == nil {
				// The aggregator hands it to kube-apiserver, whose chain
				// serves this version neither built in nor from an
				// established CustomResourceDefinition (above): its end
				// answers.
				return Reject(muxNotFound(), "APIService "+s.Name+" is served by kube-apiserver itself, which serves "+req.Info.Path+
					" neither built in nor from an established CustomResourceDefinition: its mux answers 404 page not found")
			}
			return aggregatedAPI(s, req.Info.Path)
		}
	}
	return Reject(muxNotFound(), "no built-in group, CustomResourceDefinition or APIService serves "+req.Info.Path+": the apiserver's mux answers 404 page not found")
}

// aggregatedAPI is the aggregator's answer to a request for an API
// another server provides (an APIService with a Service): while the
// APIService is not Available, the aggregator itself answers 503; else
// the request goes to that server, which alone answers.
func aggregatedAPI(s *apiregistrationv1.APIService, path string) Result {
	if !apiregistrationv1helper.IsAPIServiceConditionTrue(s, apiregistrationv1.Available) {
		st := &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusServiceUnavailable, Message: "service unavailable"}
		why := "APIService " + s.Name + " is not Available"
		for _, c := range s.Status.Conditions {
			if c.Type == apiregistrationv1.Available {
				why += fmt.Sprintf(" (%s: %s)", c.Reason, c.Message)
			}
		}
		return Reject(st, why+": the aggregator answers "+path+" itself, 503 service unavailable")
	}
	return Unknown("APIService " + s.Name + " sends " + path + " to Service " + s.Spec.Service.Namespace + "/" + s.Spec.Service.Name + ": only it answers from here (an aggregated API)")
}

// aggregatedFor finds the APIService of group/version, if the replay can
// see the aggregator's APIServices.
func aggregatedFor(w *apiserver.Server, group, version string) (*apiregistrationv1.APIService, bool, string) {
	if w.Served() == nil || !w.Served().APIServicesSynced() {
		return nil, false, "the aggregator's APIServices have not synced yet"
	}
	s, err := w.Served().APIServices.Get("v" + strings.TrimPrefix(version, "v") + "." + group)
	if err != nil || s.Spec.Group != group || s.Spec.Version != version {
		return nil, false, ""
	}
	return s, true, ""
}

// groupChangedNear says that group's CustomResourceDefinitions or
// APIServices changed less than apiChangeLag before arrival, or since, as
// kproxy's informers saw them, or "". What the apiserver routes and lists
// for the group follows them a moment late, and kproxy reads them after
// the request (a probe creating and deleting CRDs every few seconds: a
// group's discovery answered 200 predicted 404 and the reverse, 76
// records).
func groupChangedNear(w *apiserver.Server, group string, arrival time.Time) string {
	served := w.Served()
	if served == nil {
		return ""
	}
	at, seen := served.GroupChangedAt(group)
	switch {
	case !seen:
		return "kproxy has not listed the CustomResourceDefinitions and APIServices yet"
	case at.Before(arrival.Add(-apiChangeLag)):
		return ""
	}
	return fmt.Sprintf("the CustomResourceDefinitions or APIServices of group %q changed at %s (as kproxy saw them), less than %v before the request arrived or since: "+
		"the apiserver follows such a change a moment late, and kproxy reads them after the request, so what the apiserver served then is not known",
		group, at.UTC().Format("15:04:05.000"), apiChangeLag)
}

// groupUnknown reports a group no CustomResourceDefinition (in any state)
// and no APIService names: the apiserver routes nothing there.
func groupUnknown(w *apiserver.Server, group string) bool {
	crds, err := w.CRDs().List(labels.Everything())
	if err != nil || w.Served() == nil || !w.Served().APIServicesSynced() {
		return false
	}
	for _, crd := range crds {
		if crd.Spec.Group == group {
			return false
		}
	}
	services, err := w.Served().APIServices.List(labels.Everything())
	if err != nil {
		return false
	}
	for _, s := range services {
		if s.Spec.Group == group {
			return false
		}
	}
	return true
}

// discoveryAcceptable reports an Accept header discovery is served in.
func discoveryAcceptable(accept string) bool {
	return acceptsAny(accept, "*/*", "application/*", "application/json", "application/vnd.kubernetes.protobuf", "application/yaml")
}

// acceptsAny reports an Accept header that is empty or names one of
// mediaTypes (parameters aside).
func acceptsAny(accept string, mediaTypes ...string) bool {
	if accept == "" {
		return true
	}
	for _, part := range strings.Split(accept, ",") {
		mt, _, _ := strings.Cut(strings.TrimSpace(part), ";")
		for _, want := range mediaTypes {
			if strings.EqualFold(mt, want) {
				return true
			}
		}
	}
	return false
}

// aggregatorDiscovery is kube-aggregator's own answer to /apis, /apis/
// and /apis/<group>[/] (its apiserver.go registers apisHandler there, and
// an apiGroupHandler for each group an APIService names): the discovery
// document it builds from its APIServices, negotiated by
// responsewriters.WriteObjectNegotiated with the aggregator's codecs
// ("only the following media types are accepted: ..." for an Accept it
// serves nothing in), for any method (neither handler looks at it).
// Not answered here (answered false): a GET of /apis asking for
// aggregated discovery (the replay server runs that document's handler),
// and a group no APIService names (the aggregator has no handler for it:
// kube-apiserver's own answers).
func (d decode) aggregatorDiscovery(w *apiserver.Server, req *Request) (res Result, answered bool) {
	p := req.Info.Path
	rest, ok := strings.CutPrefix(p, "/apis/")
	group := strings.TrimSuffix(rest, "/")
	h := aggregatorHandlers()
	switch {
	case p == "/apis":
		rec := serveRecorded(h.root, req.HTTP)
		switch {
		case rec.Header().Get(aggregatedMarker) == "":
		case req.HTTP.Method == http.MethodGet:
			return Result{}, false
		case req.HTTP.Header.Get("If-None-Match") != "":
			return Unknown("a conditional " + req.HTTP.Method + " of aggregated discovery (/apis, If-None-Match): not modelled"), true
		default:
			// The replay server routes /apis through go-restful (GET
			// only); the aggregator's aggregated handler looks at no
			// method.
			r := Pass("kube-aggregator serves its aggregated discovery document of /apis (any method: its handler does not look at it)")
			r.Answer = http.StatusOK
			return r, true
		}
		return aggregatorVerdict(req, rec, "kube-aggregator's /apis handler lists the groups of its APIServices"), true
	case p == "/apis/":
		return aggregatorVerdict(req, serveRecorded(h.list, req.HTTP), "kube-aggregator's /apis/ handler lists the groups of its APIServices"), true
	case !ok || group == "" || strings.Contains(group, "/") || (rest != group && rest != group+"/"):
		return Result{}, false
	}
	if w.Served() == nil || !w.Served().APIServicesSynced() {
		return Unknown("discovery of " + p + ": the aggregator's APIServices have not synced yet"), true
	}
	services, err := w.Served().APIServices.List(labels.Everything())
	if err != nil {
		return Unknown("the aggregator's APIServices: " + err.Error()), true
	}
	if why := groupChangedNear(w, group, req.Arrival); why != "" {
		return Unknown("discovery of " + p + ": " + why), true
	}
	var names []string
	for _, s := range services {
		if s.Spec.Group == group {
			names = append(names, s.Name)
		}
	}
	if len(names) == 0 {
		return Result{}, false
	}
	return aggregatorVerdict(req, serveRecorded(h.group, req.HTTP), "kube-aggregator's handler of group "+group+" lists its versions from its APIServices ("+strings.Join(names, ", ")+"), Available or not"), true
}

// aggregatedMarker is the header the stand-in for the aggregated
// discovery document sets: the wrapper chose it.
const aggregatedMarker = "X-Kproxy-Aggregated-Discovery"

// discoveryHandlers are kube-aggregator's discovery negotiation: list
// (apisHandler: an APIGroupList), group (apiGroupHandler: an APIGroup),
// root (list within aggregated discovery's wrapper, as /apis is served;
// the aggregated document itself is a stand-in that marks the answer).
// The documents are empty: only the negotiation's status is wanted.
type discoveryHandlers struct{ list, group, root http.Handler }

// aggregatorHandlers builds the handlers once (the wrapper builds a
// scheme and codecs of its own), with the codecs kube-aggregator's
// apiserver.go builds (CBOR when CBORServingAndStorage is on).
var aggregatorHandlers = sync.OnceValue(func() discoveryHandlers {
	codecs := aggregatorscheme.Codecs
	if utilfeature.DefaultFeatureGate.Enabled(genericfeatures.CBORServingAndStorage) {
		codecs = serializer.NewCodecFactory(aggregatorscheme.Scheme, serializer.WithSerializer(cbor.NewSerializerInfo))
	}
	negotiated := func(obj func() runtime.Object) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			responsewriters.WriteObjectNegotiated(codecs, negotiation.DefaultEndpointRestrictions, schema.GroupVersion{}, w, r, http.StatusOK, obj(), false)
		})
	}
	list := negotiated(func() runtime.Object { return &metav1.APIGroupList{} })
	aggregatedStandIn := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Header().Set(aggregatedMarker, "1") })
	return discoveryHandlers{
		list:  list,
		group: negotiated(func() runtime.Object { return &metav1.APIGroup{} }),
		root:  aggregated.WrapAggregatedDiscoveryToHandler(list, aggregatedStandIn, nil),
	}
})

// serveRecorded runs h on r into a recorder.
func serveRecorded(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

// aggregatorVerdict is decode's verdict on the aggregator's negotiated
// answer: its refusal, or its document (200).
func aggregatorVerdict(req *Request, rec *httptest.ResponseRecorder, serves string) Result {
	if rec.Code == http.StatusOK {
		r := Pass(serves + " (any method: it does not look at it)")
		r.Answer = http.StatusOK
		return r
	}
	st := &metav1.Status{}
	if err := json.Unmarshal(rec.Body.Bytes(), st); err != nil || st.Code == 0 {
		return Unknown(fmt.Sprintf("%s; its answer (%d) is not a Status: not modelled", serves, rec.Code))
	}
	return Reject(st, serves+", negotiated with Accept "+strconv.Quote(req.HTTP.Header.Get("Accept"))+": "+apiserver.StatusMessage(st))
}
