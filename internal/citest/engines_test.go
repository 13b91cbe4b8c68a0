package citest

import (
	"testing"

	apirequest "k8s.io/apiserver/pkg/endpoints/request"
)

func TestNamesClusterIP(t *testing.T) {
	svc := &apirequest.RequestInfo{IsResourceRequest: true, Verb: "create", APIVersion: "v1", Resource: "services"}
	for _, c := range []struct {
		name string
		info *apirequest.RequestInfo
		body string
		want bool
	}{
		{"a clusterIP", svc, `{"spec":{"clusterIP":"10.96.0.7","ports":[{"port":80}]}}`, true},
		{"clusterIPs in YAML", svc, "spec:\n  clusterIPs: [10.96.0.7]\n", true},
		{"headless", svc, `{"spec":{"clusterIP":"None"}}`, false},
		{"none named", svc, `{"spec":{"ports":[{"port":80,"nodePort":30080}]}}`, false},
		{"an update", &apirequest.RequestInfo{Verb: "update", APIVersion: "v1", Resource: "services", Name: "s"}, `{"spec":{"clusterIP":"10.96.0.7"}}`, true},
		{"a status update", &apirequest.RequestInfo{Verb: "update", APIVersion: "v1", Resource: "services", Name: "s", Subresource: "status"}, `{"spec":{"clusterIP":"10.96.0.7"}}`, false},
		{"a delete", &apirequest.RequestInfo{Verb: "delete", APIVersion: "v1", Resource: "services", Name: "s"}, `{"spec":{"clusterIP":"10.96.0.7"}}`, false},
		{"another resource", &apirequest.RequestInfo{Verb: "create", APIGroup: "example.com", APIVersion: "v1", Resource: "services"}, `{"spec":{"clusterIP":"10.96.0.7"}}`, false},
		{"not an object", svc, `[`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := namesClusterIP(c.info, []byte(c.body)); got != c.want {
				t.Errorf("namesClusterIP = %v, want %v", got, c.want)
			}
		})
	}
}
