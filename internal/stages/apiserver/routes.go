package apiserver

import (
	"net/http"
	"strings"
	"sync"

	restful "github.com/emicklei/go-restful/v3"

	apirequest "k8s.io/apiserver/pkg/endpoints/request"
)

// routeCache is the apiserver's go-restful router (CurlyRouter) with its
// choices remembered. The router walks every web service and route of the
// built-in API (hundreds) for each request: a twentieth of a GET's replay.
// Its choice depends only on the method, the Content-Type and Accept
// headers and the path's tokens; for a resource request the tokens are
// literal except the namespace and the name, so requests that differ only
// in those (as the apiserver's own RequestInfo parses them) share a route.
// Only a route found is remembered: a refusal (404, 405, 406, 415) is
// asked of the router every time, as are requests that are not for a
// resource, or whose path goes on past the subresource (a proxy's path).
type routeCache struct {
	inner restful.RouteSelector
	mu    sync.RWMutex
	m     map[routeKey]routeChoice
}

// maxRoutes bounds the cache: past it, it starts again. The key space is
// small (a few per resource and verb a cluster's clients use).
const maxRoutes = 4096

type routeKey struct {
	method, contentType, accept        string
	prefix, group, version, verb       string
	resource, subresource              string
	namespaced, named, colon, trailing bool
	tokens, parts, services            int
}

type routeChoice struct {
	ws    *restful.WebService
	route *restful.Route
}

func newRouteCache(inner restful.RouteSelector) *routeCache {
	return &routeCache{inner: inner, m: map[routeKey]routeChoice{}}
}

func (c *routeCache) SelectRoute(services []*restful.WebService, r *http.Request) (*restful.WebService, *restful.Route, error) {
	key, ok := routeKeyOf(services, r)
	if !ok {
		return c.inner.SelectRoute(services, r)
	}
	c.mu.RLock()
	ch, hit := c.m[key]
	c.mu.RUnlock()
	if hit {
		return ch.ws, ch.route, nil
	}
	ws, route, err := c.inner.SelectRoute(services, r)
	if err == nil && ws != nil && route != nil {
		c.mu.Lock()
		if len(c.m) >= maxRoutes {
			c.m = map[routeKey]routeChoice{}
		}
		c.m[key] = routeChoice{ws, route}
		c.mu.Unlock()
	}
	return ws, route, err
}

// routeKeyOf is what the router's choice depends on, for a resource
// request whose path ends at most at its subresource.
func routeKeyOf(services []*restful.WebService, r *http.Request) (routeKey, bool) {
	info, ok := apirequest.RequestInfoFrom(r.Context())
	if !ok || info == nil || !info.IsResourceRequest || len(info.Parts) > 3 {
		return routeKey{}, false
	}
	p := r.URL.Path
	return routeKey{
		method: r.Method, contentType: r.Header.Get("Content-Type"), accept: r.Header.Get("Accept"),
		prefix: info.APIPrefix, group: info.APIGroup, version: info.APIVersion, verb: info.Verb,
		resource: info.Resource, subresource: info.Subresource,
		namespaced: info.Namespace != "", named: info.Name != "",
		colon:    strings.Contains(info.Namespace, ":") || strings.Contains(info.Name, ":"),
		trailing: strings.HasSuffix(p, "/"), tokens: strings.Count(strings.Trim(p, "/"), "/"),
		parts: len(info.Parts), services: len(services),
	}, true
}
