package apiserver

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	restful "github.com/emicklei/go-restful/v3"
	"k8s.io/apimachinery/pkg/util/sets"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
)

// TestRouteCache: the remembering router picks the route the apiserver's
// CurlyRouter picks, for the first request of a shape and for the next
// ones with other names and namespaces; a refusal is the router's, every
// time.
func TestRouteCache(t *testing.T) {
	ws := new(restful.WebService).Path("/api/v1").Consumes("application/json").Produces("application/json")
	noop := func(*restful.Request, *restful.Response) {}
	for _, r := range []*restful.RouteBuilder{
		ws.GET("/pods").To(noop).Operation("list-all"),
		ws.GET("/namespaces/{namespace}/pods").To(noop).Operation("list"),
		ws.GET("/namespaces/{namespace}/pods/{name}").To(noop).Operation("get"),
		ws.PUT("/namespaces/{namespace}/pods/{name}").To(noop).Operation("update"),
		ws.GET("/namespaces/{namespace}/pods/{name}/status").To(noop).Operation("get-status"),
		ws.GET("/watch/namespaces/{namespace}/pods").To(noop).Operation("watch"),
		ws.GET("/namespaces/{name}").To(noop).Operation("get-namespace"),
		ws.GET("/namespaces/{namespace}/pods/{name}/proxy/{path:*}").To(noop).Operation("proxy"),
	} {
		ws.Route(r)
	}
	services := []*restful.WebService{ws}
	resolver := &apirequest.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}
	request := func(method, path, accept string) *http.Request {
		r := httptest.NewRequest(method, path, nil)
		if method == "PUT" {
			r.Header.Set("Content-Type", "application/json")
		}
		if accept != "" {
			r.Header.Set("Accept", accept)
		}
		info, err := resolver.NewRequestInfo(r)
		if err != nil {
			t.Fatal(err)
		}
		return r.WithContext(apirequest.WithRequestInfo(r.Context(), info))
	}
	cache := newRouteCache(restful.CurlyRouter{})
	for _, c := range []struct{ method, path, accept, want string }{
		{"GET", "/api/v1/namespaces/a/pods/x", "", "get"},
		{"GET", "/api/v1/namespaces/b/pods/y", "", "get"},
		{"GET", "/api/v1/namespaces/b/pods/status", "", "get"}, // a pod named status
		{"GET", "/api/v1/namespaces/b/pods/y/status", "", "get-status"},
		{"GET", "/api/v1/namespaces/pods/pods/z", "", "get"}, // a namespace named pods
		{"PUT", "/api/v1/namespaces/a/pods/x", "", "update"},
		{"GET", "/api/v1/namespaces/a/pods", "", "list"},
		{"GET", "/api/v1/namespaces/a/pods?watch=1", "", "list"},
		{"GET", "/api/v1/watch/namespaces/a/pods", "", "watch"},
		{"GET", "/api/v1/pods", "", "list-all"},
		{"GET", "/api/v1/namespaces/a", "", "get-namespace"},
		{"GET", "/api/v1/namespaces/kube-system", "", "get-namespace"},
		{"GET", "/api/v1/namespaces/a/pods/x/proxy/some/path", "", "proxy"},
		{"GET", "/api/v1/namespaces/a/pods/x/proxy/other", "", "proxy"},
		{"GET", "/api/v1/namespaces/a/pods/x", "application/yaml", "406"},
		{"DELETE", "/api/v1/namespaces/a/pods/x", "", "405"},
		{"GET", "/api/v1/namespaces/c/pods/x", "", "get"},
	} {
		for round := range 2 {
			r := request(c.method, c.path, c.accept)
			_, wantRoute, wantErr := restful.CurlyRouter{}.SelectRoute(services, r)
			_, route, err := cache.SelectRoute(services, r)
			got := ""
			switch {
			case err != nil:
				if se, ok := err.(restful.ServiceError); ok {
					got = strconv.Itoa(se.Code)
				}
				if wantErr == nil || wantErr.Error() != err.Error() {
					t.Errorf("%s %s (round %d): %v, the router says %v", c.method, c.path, round, err, wantErr)
				}
			case route != nil:
				got = route.Operation
				if wantRoute == nil || wantRoute.Operation != got {
					t.Errorf("%s %s (round %d): route %s, the router's %v", c.method, c.path, round, got, wantRoute)
				}
			}
			if got != c.want {
				t.Errorf("%s %s (round %d): %q, want %q", c.method, c.path, round, got, c.want)
			}
		}
	}
	// One entry per shape: the gets by name share one; a proxy's path and
	// the refusals have none.
	ops := map[string]int{}
	for _, ch := range cache.m {
		ops[ch.route.Operation]++
	}
	if ops["get"] != 1 || ops["proxy"] != 0 || len(cache.m) != 8 {
		t.Errorf("cached %v (%d entries), want one per shape: 8, one for get, none for proxy", ops, len(cache.m))
	}
}
