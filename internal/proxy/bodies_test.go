package proxy

import (
	"net/http"
	"strings"
	"testing"

	apirequest "k8s.io/apiserver/pkg/endpoints/request"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/stages"
)

// TestCaptureBodyOfProxySubresource: a body posted through a proxy
// subresource is its backend's, never captured (a probe's password posted
// through services/proxy was); a Kubernetes object's is, redacted.
func TestCaptureBodyOfProxySubresource(t *testing.T) {
	for _, tc := range []struct {
		name     string
		info     apirequest.RequestInfo
		captured bool
	}{
		{"services/proxy", apirequest.RequestInfo{IsResourceRequest: true, Verb: "create", APIVersion: "v1", Namespace: "ns", Resource: "services", Name: "web", Subresource: "proxy"}, false},
		{"nodes/proxy", apirequest.RequestInfo{IsResourceRequest: true, Verb: "update", APIVersion: "v1", Resource: "nodes", Name: "n1", Subresource: "proxy"}, false},
		{"the proxy verb", apirequest.RequestInfo{IsResourceRequest: true, Verb: "proxy", APIVersion: "v1", Namespace: "ns", Resource: "pods", Name: "p"}, false},
		{"a configmap", apirequest.RequestInfo{IsResourceRequest: true, Verb: "create", APIVersion: "v1", Namespace: "ns", Resource: "configmaps"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hr, _ := http.NewRequest(http.MethodPost, "https://kproxy/x", nil)
			info := tc.info
			var rec record.Request
			captureBody(&rec, &stages.Request{HTTP: hr, Info: &info, Body: []byte(`{"password":"SECRETB777","data":{"a":"b"}}`)})
			switch {
			case tc.captured && rec.Body == nil:
				t.Errorf("not captured: %q", rec.BodyNote)
			case !tc.captured && (rec.Body != nil || !strings.Contains(rec.BodyNote, "proxy subresource")):
				t.Errorf("captured %s (note %q), want it left out, saying why", rec.Body, rec.BodyNote)
			}
		})
	}
}
