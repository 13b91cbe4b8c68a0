package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/flowapi"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
)

// TestReplayFilter: with --replay-filter, kproxy in front of the real
// apiserver replays the requests the filter picks and predicts them as
// the apiserver answers; a request it leaves out on arrival is forwarded
// and recorded with every stage skipped and why; a token caller, whose
// user kproxy learns only from the replay's authentication, is replayed
// that far, and picked or left out by who it is.
func TestReplayFilter(t *testing.T) {
	capture := filepath.Join(t.TempDir(), "capture.jsonl")
	const expr = "~n kube-public | ~u alice & ~n " + testNS
	k := startKproxy(t, kproxyOptions{capture: capture, flowAPI: true, set: func(o *serve.Options) { o.ReplayFilter = expr }})
	r := reverseRoute(k)
	cm := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"t-replay-filter-%d"}}`, time.Now().UnixNano())
	const (
		predicted = ""
		outside   = "not replayed: the request is outside --replay-filter " + expr
		gatedBob  = `replayed only as far as impersonation: user "bob" is outside --replay-filter ` + expr
	)
	cases := []struct {
		req  request
		want string // the prediction's message: predicted (as the apiserver answers), or why not
	}{
		{request{method: "GET", path: "/api/v1/namespaces/" + testNS + "/configmaps", user: "alice"}, predicted},
		{request{method: "POST", path: "/api/v1/namespaces/" + testNS + "/configmaps", body: cm, user: "alice"}, predicted},
		{request{method: "GET", path: "/api/v1/namespaces/kube-public/configmaps", user: "bob"}, predicted},
		{request{method: "GET", path: "/api/v1/namespaces/" + testNS + "/configmaps", user: "bob"}, gatedBob},
		{request{method: "GET", path: "/api/v1/namespaces/default/configmaps", user: "alice"}, outside},
	}
	for _, c := range cases {
		do(t, r.client(nil), r.base, c.req)
	}
	recs := readCapture(t, capture, len(cases))
	for _, c := range cases {
		name := c.req.user + " " + c.req.method + " " + c.req.path
		var rec *record.Record
		for i, x := range recs { // in completion order: find the case's own
			// A token caller left out on arrival is not authenticated:
			// its record names no user.
			if x.Request.Method == c.req.method && x.Request.Path == c.req.path && (x.Request.User == c.req.user || c.want == outside && x.Request.User == "") {
				rec = &recs[i]
			}
		}
		if rec == nil {
			t.Fatalf("%s: no record", name)
		}
		if len(rec.Stages) != len(contractStages) {
			t.Fatalf("%s: %d stages, want the nine", name, len(rec.Stages))
		}
		switch c.want {
		case predicted:
			if rec.Predicted.Stage == record.StageUnknown || rec.Predicted.Status != rec.Actual.Status {
				t.Errorf("%s: predicted %+v, the apiserver answered %d: want it predicted", name, rec.Predicted, rec.Actual.Status)
			}
		case gatedBob:
			// Replayed as far as who it is: the record names bob, and the
			// stages after impersonation say why they were not replayed.
			if rec.Request.User != "bob" || rec.Stages[0].Outcome != record.Pass || !strings.Contains(rec.Stages[0].Explanation, `"bob"`) {
				t.Errorf("%s: user %q, authentication %+v: want bob, authenticated by the replay", name, rec.Request.User, rec.Stages[0])
			}
			for _, s := range rec.Stages[2:] {
				if s.Outcome != record.Skip || s.Explanation != c.want {
					t.Errorf("%s: stage %s %s %q, want skipped: %q", name, s.Name, s.Outcome, s.Explanation, c.want)
				}
			}
			fallthrough
		default:
			if rec.Predicted.Stage != record.StageUnknown || rec.Predicted.Message != c.want {
				t.Errorf("%s: predicted %+v, want unknown: %q", name, rec.Predicted, c.want)
			}
			if rec.Actual.Status == 0 || rec.Actual.Error != "" {
				t.Errorf("%s: actual %+v, want the apiserver's answer, forwarded as usual", name, rec.Actual)
			}
		}
		if c.want == outside {
			for _, s := range rec.Stages {
				// authentication may add who the caller is, as an
				// earlier replay authenticated the same token.
				if s.Outcome != record.Skip || (s.Explanation != outside && (s.Name != record.StageAuthentication ||
					!strings.HasPrefix(s.Explanation, outside+"; the caller is named as kproxy's replay authenticated the same bearer token"))) {
					t.Errorf("%s: stage %s %s %q, want skipped: %q", name, s.Name, s.Outcome, s.Explanation, outside)
				}
			}
			// Left out, yet explained on demand: a re-run replays it in
			// full, as the apiserver answered it.
			var now record.Record
			if err := json.Unmarshal(httpPost(t, k.apiURL+flowapi.PathFlows+"/"+rec.ID+"/replay"), &now); err != nil {
				t.Fatal(err)
			}
			if now.Predicted.Stage == record.StageUnknown || now.Predicted.Status != rec.Actual.Status || now.Request.User != c.req.user {
				t.Errorf("%s: re-run predicted %+v for user %q, the apiserver answered %d: want it predicted in full", name, now.Predicted, now.Request.User, rec.Actual.Status)
			}
		}
	}

	// Changed without a restart, through the flow API: bob's request,
	// left out before, is replayed now.
	api, err := flowapi.NewClient(k.apiURL, flowapi.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if now, err := api.SetReplayFilter(context.Background(), "~u bob"); err != nil || now != "~u bob" {
		t.Fatalf("SetReplayFilter: %q, %v", now, err)
	}
	bob := request{method: "GET", path: "/api/v1/namespaces/" + testNS + "/configmaps", user: "bob"}
	do(t, r.client(nil), r.base, bob)
	recs = readCapture(t, capture, len(cases)+1)
	if last := recs[len(recs)-1]; last.Predicted.Stage == record.StageUnknown || last.Predicted.Status != last.Actual.Status {
		t.Errorf("bob's GET after the filter changed to ~u bob: predicted %+v, the apiserver answered %d: want it predicted", last.Predicted, last.Actual.Status)
	}
}
