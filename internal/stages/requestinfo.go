package stages

import (
	"net/http"

	"k8s.io/apimachinery/pkg/util/sets"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
)

// requestInfoFactory is the apiserver's own resolver with the prefixes
// kube-apiserver configures (server.NewRequestInfoResolver).
var requestInfoFactory = &apirequest.RequestInfoFactory{
	APIPrefixes:          sets.NewString("api", "apis"),
	GrouplessAPIPrefixes: sets.NewString("api"),
}

// ResolveRequestInfo says what the apiserver will make of the request: verb,
// group, version, resource, subresource, namespace, name.
func ResolveRequestInfo(r *http.Request) (*apirequest.RequestInfo, error) {
	return requestInfoFactory.NewRequestInfo(r)
}
