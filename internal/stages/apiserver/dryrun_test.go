package apiserver

import (
	"net/url"
	"strings"
	"testing"
)

func TestForceDryRun(t *testing.T) {
	cases := []struct {
		name, verb, sub, query, body, ct string
		noQueryDryRun                    bool   // the replay's query gets no dryRun
		wantBody                         string // substring of the body sent to the handler ("" : unchanged)
		wantCT                           string
		wasDryRun                        bool
	}{
		{name: "create", verb: "create", body: `{"kind":"ConfigMap"}`, ct: "application/json"},
		{name: "create already dry", verb: "create", query: "dryRun=All", body: `{}`, ct: "application/json", wasDryRun: true},
		{name: "delete without body", verb: "delete"},
		{name: "delete, query dry run", verb: "delete", query: "dryRun=All", wasDryRun: true},
		{name: "kubectl delete", verb: "delete", body: `{"kind":"DeleteOptions","apiVersion":"v1","propagationPolicy":"Background"}`, ct: "application/json",
			wantBody: `"dryRun":["All"]`},
		{name: "body wins over query", verb: "delete", query: "dryRun=All", body: `{"propagationPolicy":"Foreground","gracePeriodSeconds":30}`, ct: "application/json",
			wantBody: `"gracePeriodSeconds":30`},
		{name: "delete, body dry run", verb: "delete", body: `{"kind":"DeleteOptions","apiVersion":"v1","dryRun":["All"]}`, ct: "application/json", wasDryRun: true},
		{name: "delete, empty dryRun list", verb: "delete", body: `{"dryRun":[]}`, ct: "application/json", wantBody: `"dryRun":["All"]`},
		{name: "deletecollection", verb: "deletecollection", body: `{"propagationPolicy":"Background"}`, ct: "", wantBody: `"dryRun":["All"]`},
		{name: "yaml body", verb: "delete", body: "kind: DeleteOptions\napiVersion: v1\npropagationPolicy: Orphan\n", ct: "application/yaml",
			wantBody: `"propagationPolicy":"Orphan"`, wantCT: "application/json"},
		{name: "undecodable body left to the handler", verb: "delete", body: `not json`, ct: "application/json"},
		// An eviction takes dryRun from its query and its body's
		// deleteOptions: a body's makes it a dry run, and a query's
		// added to it would be refused unless equal.
		{name: "eviction", verb: "create", sub: "eviction", body: `{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"p"}}`, ct: "application/json"},
		{name: "eviction, body dry run", verb: "create", sub: "eviction", body: `{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"p"},"deleteOptions":{"dryRun":["All"]}}`, ct: "application/json",
			wasDryRun: true, noQueryDryRun: true},
		{name: "eviction, a body dryRun validation refuses", verb: "create", sub: "eviction", body: `{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"p"},"deleteOptions":{"dryRun":["Bogus"]}}`, ct: "application/json",
			wasDryRun: true, noQueryDryRun: true},
		{name: "eviction, no kind, YAML", verb: "create", sub: "eviction", body: "metadata:\n  name: p\ndeleteOptions:\n  dryRun: [All, All]\n", ct: "application/yaml",
			wasDryRun: true, noQueryDryRun: true},
		{name: "eviction v1beta1, both", verb: "create", sub: "eviction", query: "dryRun=All", body: `{"apiVersion":"policy/v1beta1","kind":"Eviction","metadata":{"name":"p"},"deleteOptions":{"dryRun":["All"]}}`, ct: "application/json",
			wasDryRun: true},
		{name: "eviction, empty body dryRun", verb: "create", sub: "eviction", body: `{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"p"},"deleteOptions":{"dryRun":[]}}`, ct: "application/json"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q, _ := url.ParseQuery(tc.query)
			dry := dryRunRequest(tc.verb, tc.sub, q, []byte(tc.body), tc.ct)
			if dry != tc.wasDryRun {
				t.Errorf("dryRunRequest = %v, want %v", dry, tc.wasDryRun)
			}
			nq, body, ct := forceDryRun(tc.verb, tc.sub, dry, q, []byte(tc.body), tc.ct)
			if (nq.Get("dryRun") == "") != tc.noQueryDryRun {
				t.Errorf("query %v: dryRun %q", nq, nq.Get("dryRun"))
			}
			if tc.query == "" && len(q["dryRun"]) != 0 {
				t.Errorf("the request's own query was changed: %v", q)
			}
			switch {
			case tc.wantBody == "" && string(body) != tc.body:
				t.Errorf("body changed to %s", body)
			case tc.wantBody != "" && !strings.Contains(string(body), tc.wantBody):
				t.Errorf("body %s lacks %s", body, tc.wantBody)
			}
			if want := tc.wantCT; want == "" && ct != tc.ct || want != "" && ct != want {
				t.Errorf("content type %q", ct)
			}
			if tc.body != "" && isDeleteVerb(tc.verb) && tc.body != "not json" && !dryRunRequest(tc.verb, tc.sub, nq, body, ct) {
				t.Errorf("still not a dry run: %s %s", nq.Encode(), body)
			}
		})
	}
}
