package stages

import (
	"net/http"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Discovery of API groups the replay server does not serve itself: groups
// of CustomResourceDefinitions (the apiextensions discovery controller is
// not run in the replay, but which versions an established definition
// serves is in the definitions themselves) and groups nobody serves (the
// apiserver's 404). Aggregated APIs answer their own discovery: unknown.

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
	w := d.m.write
	crds, err := w.crds.List(labels.Everything())
	if err != nil {
		return Unknown("the cluster's CustomResourceDefinitions: " + err.Error())
	}
	for _, crd := range crds {
		if crd.Spec.Group != group || !established(crd) {
			continue
		}
		for _, v := range crd.Spec.Versions {
			if v.Served && (version == "" || v.Name == version) {
				return Pass("CustomResourceDefinition " + crd.Name + " serves " + req.Info.Path)
			}
		}
	}
	if w.served == nil || !w.served.apiServicesSynced() {
		return Unknown("the aggregator's APIServices have not synced yet")
	}
	services, err := w.served.apiServices.List(labels.Everything())
	if err != nil {
		return Unknown("the aggregator's APIServices: " + err.Error())
	}
	for _, s := range services {
		if s.Spec.Group == group && (version == "" || s.Spec.Version == version) {
			if s.Spec.Service == nil {
				return Unknown("APIService " + s.Name + " is served by kube-apiserver itself: its discovery of " + req.Info.Path + " is not modelled")
			}
			return Unknown("APIService " + s.Name + " sends " + req.Info.Path + " to Service " + s.Spec.Service.Namespace + "/" + s.Spec.Service.Name + ": only it answers from here (an aggregated API)")
		}
	}
	st := &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusNotFound, Message: "404 page not found"}
	return Reject(st, "no built-in group, CustomResourceDefinition or APIService serves "+req.Info.Path+": the apiserver's mux answers 404 page not found")
}

// discoveryAcceptable reports an Accept header discovery is served in.
func discoveryAcceptable(accept string) bool {
	if accept == "" {
		return true
	}
	for _, part := range strings.Split(accept, ",") {
		mt, _, _ := strings.Cut(strings.TrimSpace(part), ";")
		switch strings.ToLower(mt) {
		case "*/*", "application/*", "application/json", "application/vnd.kubernetes.protobuf", "application/yaml":
			return true
		}
	}
	return false
}
