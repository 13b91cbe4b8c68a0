package stages

import (
	"fmt"
	"net/http"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	apiregistrationv1helper "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1/helper"

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
	if req.HTTP.Method != http.MethodGet {
		return Unknown("the " + req.HTTP.Method + " of discovery path " + req.Info.Path + ": not modelled")
	}
	rest := strings.Trim(strings.TrimPrefix(req.Info.Path, "/apis/"), "/")
	group, version, _ := strings.Cut(rest, "/")
	if strings.Contains(version, "/") {
		return Unknown("discovery path " + req.Info.Path + ": not modelled")
	}
	if !discoveryAcceptable(req.HTTP.Header.Get("Accept")) {
		return Unknown("discovery of " + req.Info.Path + " with Accept " + req.HTTP.Header.Get("Accept") + ": content negotiation not modelled")
	}
	w := d.m.writer()
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
