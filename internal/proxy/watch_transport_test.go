package proxy

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/kproxy/kproxy/internal/record"
)

// namedTransport answers with an error naming itself, so a test sees
// which transport a request took.
type namedTransport string

func (n namedTransport) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New(string(n))
}

// TestWatchTransport: a watch goes upstream over the watch transports
// (HTTP/2), the caller's or kproxy's own for a certificate caller; a
// watch asking for an upgrade, and every other request, over the
// HTTP/1.1 ones. Without watch transports, watches take the others.
func TestWatchTransport(t *testing.T) {
	u, _ := url.Parse("https://apiserver.example")
	all := Config{Upstream: u, Passthrough: namedTransport("passthrough"), Impersonating: namedTransport("impersonating"),
		WatchPassthrough: namedTransport("watch passthrough"), WatchImpersonating: namedTransport("watch impersonating")}
	plain := all
	plain.WatchPassthrough, plain.WatchImpersonating = nil, nil
	for _, c := range []struct {
		name    string
		cfg     Config
		verb    string
		upgrade bool
		cert    bool
		want    string
	}{
		{"watch", all, "watch", false, false, "watch passthrough"},
		{"watch, certificate caller", all, "watch", false, true, "watch impersonating"},
		{"websocket watch", all, "watch", true, false, "passthrough"},
		{"websocket watch, certificate caller", all, "watch", true, true, "impersonating"},
		{"list", all, "list", false, false, "passthrough"},
		{"get, certificate caller", all, "get", false, true, "impersonating"},
		{"watch without watch transports", plain, "watch", false, false, "passthrough"},
		{"watch without watch transports, certificate caller", plain, "watch", false, true, "impersonating"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := New(c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			ex := &exchange{rec: &record.Record{Request: record.Request{Verb: c.verb}}}
			if c.cert {
				ex.actAs = &user.DefaultInfo{Name: "alice"}
			}
			req := httptest.NewRequest("GET", "https://apiserver.example/api/v1/pods?watch=1", nil)
			if c.upgrade {
				req.Header.Set("Upgrade", "websocket")
			}
			req = req.WithContext(context.WithValue(req.Context(), exchangeKey{}, ex))
			_, err = p.reverseProxyFor(ex).Transport.RoundTrip(req)
			if err == nil || err.Error() != c.want {
				t.Errorf("went over %v, want %s", err, c.want)
			}
		})
	}
}

// TestWatchTransportSpeaksHTTP2: the watch transport offers HTTP/2 with
// small receive windows; the others offer HTTP/1.1 only.
func TestWatchTransportSpeaksHTTP2(t *testing.T) {
	w, h1 := newWatchTransport(nil), newTransport(nil)
	if w.Protocols == nil || !w.Protocols.HTTP2() || w.HTTP2 == nil || w.HTTP2.MaxReceiveBufferPerStream != 64<<10 {
		t.Errorf("watch transport: protocols %v, HTTP/2 config %+v", w.Protocols, w.HTTP2)
	}
	if got := h1.TLSClientConfig.NextProtos; len(got) != 1 || got[0] != "http/1.1" {
		t.Errorf("the HTTP/1.1 transport offers %v", got)
	}
}
