package stages

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"

	kdecode "github.com/kproxy/kproxy/internal/decode"
)

// statusCodecs encode metav1.Status the way the apiserver's filters do.
var statusCodecs = kdecode.StatusCodecs()

// filter runs one of the apiserver's own filters (WithAuthentication,
// WithImpersonation, WithAuthorization, ...) on a copy of a request. It is
// built once: some filters keep state across requests, as in the apiserver.
type filter struct{ h http.Handler }

// filtered is what a filter did with one request.
type filtered struct {
	passed bool                       // the filter called the next handler
	req    *http.Request              // the request it passed on
	resp   *httptest.ResponseRecorder // what it answered otherwise
}

type filteredKey struct{}

func newFilter(wrap func(next http.Handler) http.Handler) *filter {
	return &filter{h: wrap(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		out := r.Context().Value(filteredKey{}).(*filtered)
		out.passed, out.req = true, r
	}))}
}

func (f *filter) run(r *http.Request) *filtered {
	out := &filtered{resp: httptest.NewRecorder()}
	f.h.ServeHTTP(out.resp, r.WithContext(context.WithValue(r.Context(), filteredKey{}, out)))
	return out
}

// status is the metav1.Status the filter answered with.
func (o *filtered) status() *metav1.Status {
	if st, ok := kdecode.Status(o.resp.Header().Get("Content-Type"), o.resp.Body.Bytes()); ok {
		return st
	}
	return &metav1.Status{Status: metav1.StatusFailure, Code: int32(o.resp.Code), Message: strings.TrimSpace(o.resp.Body.String())}
}

// requestFor is a fresh copy of the replayed request (filters change
// headers) carrying what the apiserver's filters expect in the context.
func requestFor(ctx context.Context, req *Request, u user.Info) *http.Request {
	return req.HTTP.Clone(filterContext(ctx, req, u))
}

// readOnlyRequestFor shares the replayed request's headers: for filters
// that only read them (WithAuthorization).
func readOnlyRequestFor(ctx context.Context, req *Request, u user.Info) *http.Request {
	return req.HTTP.WithContext(filterContext(ctx, req, u))
}

func filterContext(ctx context.Context, req *Request, u user.Info) context.Context {
	ctx = apirequest.WithRequestInfo(ctx, req.Info)
	if u != nil {
		ctx = apirequest.WithUser(ctx, u)
	}
	return ctx
}
