package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/kproxy/kproxy/internal/filter"
	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/stages"
)

// tokenReplayer stands in for the pipeline's identity stages: the bearer
// token is the user's name. It asks the request's Gate, as the pipeline
// does once impersonation has passed, and counts what it replayed.
type tokenReplayer struct {
	mu  sync.Mutex
	ran map[string]bool // path, whether the gate was asked
}

func (r *tokenReplayer) Run(_ context.Context, req *stages.Request) stages.Outcome {
	r.mu.Lock()
	r.ran[req.HTTP.URL.Path] = req.Gate != nil
	r.mu.Unlock()
	if req.Gate != nil {
		u := &user.DefaultInfo{Name: strings.TrimPrefix(req.HTTP.Header.Get("Authorization"), "Bearer ")}
		if why := req.Gate(u, u); why != "" {
			return stages.Outcome{Predicted: record.Prediction{Stage: record.StageUnknown, Message: why}, Gated: true}
		}
	}
	return stages.Outcome{Predicted: record.Prediction{Status: 200}}
}

// TestReplayFilter: --replay-filter replays the requests it picks; one it
// leaves out on arrival never reaches the replayer, and is recorded with
// its nine stages skipped and why; one whose answer hangs on a token's
// user is replayed as far as its identity, and the gate decides.
func TestReplayFilter(t *testing.T) {
	up := tlsUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x"}}`)
	})
	type want struct {
		replayed, gateAsked bool
		message             string // the prediction's, "" when predicted
	}
	for _, tc := range []struct {
		filter string
		// requests: token user and namespace
		user, ns string
		want     want
	}{
		{"~n payments", "bob", "payments", want{true, false, ""}},
		{"~n payments", "bob", "other", want{false, false, "not replayed: the request is outside --replay-filter ~n payments"}},
		{"~n payments | ~u alice", "bob", "payments", want{true, false, ""}},
		{"~n payments | ~u alice", "alice", "other", want{true, true, ""}},
		{"~n payments | ~u alice", "bob", "other", want{true, true, `replayed only as far as impersonation: user "bob" is outside --replay-filter ~n payments | ~u alice`}},
		{"!~v get", "bob", "other", want{false, false, "not replayed: the request is outside --replay-filter !~v get"}},
	} {
		name := tc.filter + "/" + tc.user + "/" + tc.ns
		t.Run(name, func(t *testing.T) {
			f, err := filter.ParseRequestOnly(tc.filter)
			if err != nil {
				t.Fatal(err)
			}
			sink := &records{}
			reg := prometheus.NewRegistry()
			rp := &tokenReplayer{ran: map[string]bool{}}
			p, err := New(Config{Upstream: up.URL, Passthrough: up.Passthrough, Replayer: rp, Sink: sink,
				Metrics: metrics.New(reg), ReplayFilter: f})
			if err != nil {
				t.Fatal(err)
			}
			front := httptest.NewTLSServer(p)
			defer front.Close()
			client := front.Client()
			client.Timeout = 10 * time.Second
			path := "/api/v1/namespaces/" + tc.ns + "/configmaps/x"
			req, _ := http.NewRequest(http.MethodGet, front.URL+path, nil)
			req.Header.Set("Authorization", "Bearer "+tc.user)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("forwarded: %d, want the upstream's 200", resp.StatusCode)
			}
			p.Drain()
			recs := sink.list()
			if len(recs) != 1 {
				t.Fatalf("%d records, want 1", len(recs))
			}
			rec := recs[0]
			gateAsked, replayed := rp.ran[path]
			if replayed != tc.want.replayed || gateAsked != tc.want.gateAsked {
				t.Errorf("replayed %v (gate asked %v), want %v (%v)", replayed, gateAsked, tc.want.replayed, tc.want.gateAsked)
			}
			switch {
			case tc.want.message == "" && (rec.Predicted.Stage != "" || rec.Predicted.Status != 200):
				t.Errorf("predicted %+v, want 200", rec.Predicted)
			case tc.want.message != "" && (rec.Predicted.Stage != record.StageUnknown || rec.Predicted.Message != tc.want.message):
				t.Errorf("predicted %+v, want unknown: %q", rec.Predicted, tc.want.message)
			}
			if !replayed {
				if len(rec.Stages) != len(record.StageOrder) {
					t.Fatalf("%d stages, want the nine", len(rec.Stages))
				}
				for i, s := range rec.Stages {
					if s.Name != record.StageOrder[i] || s.Outcome != record.Skip || s.Explanation != tc.want.message {
						t.Errorf("stage %d: %+v, want %s skipped: %s", i, s, record.StageOrder[i], tc.want.message)
					}
				}
			}
			filtered := 0.0
			if tc.want.message != "" {
				filtered = 1
			}
			if got := gauge(t, reg, "kproxy_replays_total", "result", "filtered"); got != filtered {
				t.Errorf("kproxy_replays_total{result=filtered} = %v, want %v", got, filtered)
			}
		})
	}
}

// TestSetReplayFilter: the replay filter changes at run time (the flow
// API's PUT): requests arriving after the change follow the new one; a
// filter refused keeps the one in force; without a replayer there is
// nothing to filter (a conflict, not the filter's fault).
func TestSetReplayFilter(t *testing.T) {
	up := tlsUpstream(t, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "{}") })
	rp := &tokenReplayer{ran: map[string]bool{}}
	sink := &records{}
	p, err := New(Config{Upstream: up.URL, Passthrough: up.Passthrough, Replayer: rp, Sink: sink})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewTLSServer(p)
	defer front.Close()
	get := func(ns string) *record.Record {
		t.Helper()
		n := len(sink.list())
		req, _ := http.NewRequest(http.MethodGet, front.URL+"/api/v1/namespaces/"+ns+"/configmaps/x", nil)
		req.Header.Set("Authorization", "Bearer bob")
		resp, err := front.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		p.Drain()
		recs := sink.list()
		if len(recs) != n+1 {
			t.Fatalf("%d records, want %d", len(recs), n+1)
		}
		return recs[n]
	}
	if got := p.ReplayFilter(); got != "" {
		t.Fatalf("ReplayFilter() = %q with none given", got)
	}
	if rec := get("other"); rec.Predicted.Status != 200 {
		t.Errorf("without a filter: predicted %+v, want replayed", rec.Predicted)
	}
	if now, err := p.SetReplayFilter("~n   payments"); err != nil || now != "~n payments" || p.ReplayFilter() != now {
		t.Fatalf("SetReplayFilter = %q, %v (in force %q)", now, err, p.ReplayFilter())
	}
	if rec := get("other"); rec.Predicted.Message != "not replayed: the request is outside --replay-filter ~n payments" {
		t.Errorf("after the change: predicted %+v, want left out", rec.Predicted)
	}
	if _, err := p.SetReplayFilter("~x"); err == nil || p.ReplayFilter() != "~n payments" {
		t.Errorf("SetReplayFilter(~x) = %v, in force %q: want refused, the filter kept", err, p.ReplayFilter())
	}
	if now, err := p.SetReplayFilter(" "); err != nil || now != "" {
		t.Fatalf("SetReplayFilter(blank) = %q, %v", now, err)
	}
	if rec := get("other"); rec.Predicted.Status != 200 {
		t.Errorf("filter cleared: predicted %+v, want replayed", rec.Predicted)
	}
	off, _ := New(Config{Upstream: up.URL, Passthrough: up.Passthrough})
	var conflict interface{ Conflict() bool }
	if _, err := off.SetReplayFilter("~n x"); !errors.As(err, &conflict) || !conflict.Conflict() {
		t.Errorf("SetReplayFilter without a replayer: %v, want a conflict", err)
	}
}
