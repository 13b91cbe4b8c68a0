package tui

import (
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/record"
)

// TestKubectlCommand: the kubectl line trusts the same CA as the curl
// line (without it kubectl refused kproxy's certificate), and carries
// what kubectl can of the impersonation.
func TestKubectlCommand(t *testing.T) {
	get := record.Request{Method: "GET", Path: "/api/v1/namespaces/a/secrets/s"}
	for _, tc := range []struct {
		name string
		r    record.Record
		want string
	}{
		{"a token caller's get", record.Record{Identity: "token", Request: get},
			`kubectl --server "$APISERVER" --certificate-authority "$CA" --token "$TOKEN" get --raw /api/v1/namespaces/a/secrets/s`},
		{"a certificate caller's delete", record.Record{Identity: "certificate", Request: record.Request{Method: "DELETE", Path: "/api/v1/namespaces/a/pods/p"}},
			`kubectl --server "$APISERVER" --certificate-authority "$CA" --client-certificate "$CERT" --client-key "$KEY" delete --raw /api/v1/namespaces/a/pods/p`},
		{"impersonation", record.Record{Identity: "token", Request: record.Request{Method: "GET", Path: "/api", ActingAs: "bob",
			Headers: map[string][]string{"Impersonate-User": {"bob"}, "Impersonate-Group": {"devs", "qa team"}, "Impersonate-Uid": {"u-1"}}}},
			`kubectl --server "$APISERVER" --certificate-authority "$CA" --token "$TOKEN" --as bob --as-group devs --as-group 'qa team' --as-uid u-1 get --raw /api`},
		{"an impersonated extra kubectl cannot send", record.Record{Identity: "token", Request: record.Request{Method: "GET", Path: "/api", ActingAs: "bob",
			Headers: map[string][]string{"Impersonate-User": {"bob"}, "Impersonate-Extra-Scopes": {"s1"}}}},
			"kubectl --server \"$APISERVER\" --certificate-authority \"$CA\" --token \"$TOKEN\" --as bob get --raw /api\n# kubectl cannot send Impersonate-Extra-* headers: the curl line above does"},
		{"a patch: no kubectl form", record.Record{Identity: "token", Request: record.Request{Method: "PATCH", Path: "/api/v1/namespaces/a/pods/p"}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := kubectlCommand(&tc.r); got != tc.want {
				t.Errorf("kubectlCommand:\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

// TestExportArgs: :export's file is the rest of the line, quoted or not,
// spaces kept, ~/ the home directory; a format it does not write is named.
func TestExportArgs(t *testing.T) {
	t.Setenv("HOME", "/home/sre")
	for _, tc := range []struct {
		line, format, path, err string
	}{
		{"export har flows.har", "har", "flows.har", ""},
		{`export jsonl "/tmp/marked ünï.jsonl"`, "jsonl", "/tmp/marked ünï.jsonl", ""},
		{"export jsonl /tmp/marked flows.jsonl", "jsonl", "/tmp/marked flows.jsonl", ""},
		{"export har ~/incident.har", "har", "/home/sre/incident.har", ""},
		{"export csv x.csv", "", "", ":export csv: not a format"},
		{"export har", "", "", ":export wants a format and a file"},
	} {
		format, path, err := exportArgs(tc.line)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, want an error containing %q", tc.line, err, tc.err)
			}
		case err != nil || format != tc.format || path != tc.path:
			t.Errorf("%q: %q %q %v, want %q %q", tc.line, format, path, err, tc.format, tc.path)
		}
	}
}
