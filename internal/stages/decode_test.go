package stages

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	apirequest "k8s.io/apiserver/pkg/endpoints/request"

	"github.com/kproxy/kproxy/internal/record"
)

// TestNoSuchResource: a resource no CustomResourceDefinition defines, in a
// served group, is the mux's 404, unless the apiserver answered otherwise:
// a definition created or deleted around the request, which kproxy's
// informer may not have seen as the apiserver did.
func TestNoSuchResource(t *testing.T) {
	info := &apirequest.RequestInfo{IsResourceRequest: true, Verb: "create", APIGroup: "example.com", APIVersion: "v1", Resource: "widgets", Namespace: "ns"}
	cases := []struct {
		name     string
		answered int // 0: no answer to wait for (a test case)
		unknown  bool
		says     string
	}{
		{"no answer to compare", 0, false, `no CustomResourceDefinition "widgets.example.com"`},
		{"the apiserver answered 404", http.StatusNotFound, false, "404 page not found"},
		{"the apiserver created it", http.StatusCreated, true, "created or deleted around this request"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := &Request{Info: info, HTTP: httptest.NewRequest("POST", "/apis/example.com/v1/namespaces/ns/widgets", nil)}
			if tc.answered != 0 {
				req.Actual = func(context.Context) (Answer, bool) { return Answer{Status: tc.answered}, true }
			}
			res := decode{}.noSuchResource(context.Background(), req)
			if res.Unknown != tc.unknown || !strings.Contains(res.Explanation, tc.says) {
				t.Errorf("got %s (unknown %v) %q, want unknown %v saying %q", res.Outcome, res.Unknown, res.Explanation, tc.unknown, tc.says)
			}
			if !tc.unknown && res.Outcome != record.Reject {
				t.Errorf("outcome %s, want %s", res.Outcome, record.Reject)
			}
			if !tc.unknown && (res.Status == nil || res.Status.Code != http.StatusNotFound || res.Status.Message != "404 page not found") {
				t.Errorf("refusal %+v, want the mux's 404 page not found", res.Status)
			}
		})
	}
}

// TestProbedComponent: the names the componentstatus registry probes live
// (its serversToValidate); any other it answers 404 without probing.
func TestProbedComponent(t *testing.T) {
	for name, want := range map[string]bool{
		"controller-manager": true, "scheduler": true, "etcd-0": true, "etcd-12": true,
		"etcd-": false, "etcd-x": false, "bogus": false, "": false, "Scheduler": false,
	} {
		if got := probedComponent(name); got != want {
			t.Errorf("probedComponent(%q) = %v, want %v", name, got, want)
		}
	}
}
