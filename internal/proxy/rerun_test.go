package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/stages"
)

func TestRerunStoreLimits(t *testing.T) {
	req := func(n int) *stages.Request { return &stages.Request{Body: make([]byte, n)} }
	for _, tc := range []struct {
		name   string
		limits RerunLimits
		bodies []int // flows f0, f1, ... kept in order
		kept   string
	}{
		{"off", RerunLimits{}, []int{1}, ""},
		{"by count", RerunLimits{Flows: 2}, []int{0, 0, 0}, "f1,f2"},
		{"by bytes", RerunLimits{Flows: 10, Bytes: 10}, []int{4, 4, 4}, "f1,f2"},
		{"a body above the whole budget is not kept", RerunLimits{Flows: 10, Bytes: 10}, []int{4, 11, 4}, "f0,f2"},
		{"a big body pushes out several", RerunLimits{Flows: 10, Bytes: 10}, []int{3, 3, 3, 9}, "f3"},
		{"many, to wrap the FIFO", RerunLimits{Flows: 3}, []int{0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, "f7,f8,f9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newRerunStore(tc.limits)
			sink := s.sink(record.Sinks(nil))
			for i, n := range tc.bodies {
				id := "f" + string(rune('0'+i))
				r := req(n)
				r.ID = id
				s.pend(r)
				sink.Write(&record.Record{ID: id})
			}
			var kept []string
			for i := range tc.bodies {
				id := "f" + string(rune('0'+i))
				if _, err := s.get(id); err == nil {
					kept = append(kept, id)
				} else if e := (*RerunUnavailableError)(nil); !errors.As(err, &e) || !e.NotFound() || !strings.Contains(err.Error(), id) {
					t.Errorf("get(%s): %v", id, err)
				}
			}
			if got := strings.Join(kept, ","); got != tc.kept {
				t.Errorf("kept %s, want %s", got, tc.kept)
			}
			if s != nil && len(s.pending) != 0 {
				t.Errorf("%d requests still pending after their records were written", len(s.pending))
			}
			if s != nil && s.limits.Bytes > 0 && s.bytes > s.limits.Bytes {
				t.Errorf("keeps %d body bytes, limit %d", s.bytes, s.limits.Bytes)
			}
		})
	}
}

// seenReplayer predicts 403 and remembers the requests it replayed.
type seenReplayer struct {
	mu   sync.Mutex
	reqs []*stages.Request
	body [][]byte
}

func (r *seenReplayer) Run(_ context.Context, req *stages.Request) stages.Outcome {
	r.mu.Lock()
	r.reqs = append(r.reqs, req)
	r.body = append(r.body, req.Body)
	n := len(r.reqs)
	r.mu.Unlock()
	return stages.Outcome{Predicted: record.Prediction{Status: 403, Stage: record.StageAuthorization, Reason: "Forbidden",
		Message: "run " + string(rune('0'+n))}, Duration: time.Millisecond}
}

func (r *seenReplayer) last() *stages.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reqs[len(r.reqs)-1]
}

// chanSink hands records to the test.
type chanSink chan *record.Record

func (c chanSink) Write(r *record.Record) { c <- r }

func TestReplayRerunsWithoutGoingUpstream(t *testing.T) {
	var upstreamCalls atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamCalls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","message":"nope","code":403}`)
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	clk := clocktesting.NewFakePassiveClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	sink := make(chanSink, 10)
	rp := &seenReplayer{}
	p, err := New(Config{Upstream: u, Passthrough: http.DefaultTransport, Replayer: rp, Sink: sink, Clock: clk,
		Rerun: RerunLimits{Flows: 2, Bytes: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(p)
	defer front.Close()

	body := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}`
	req, _ := http.NewRequest("POST", front.URL+"/api/v1/namespaces/default/configmaps", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer alice-token")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	orig := <-sink
	if orig.Actual.Status != 403 || orig.Actual.Message != "nope" {
		t.Fatalf("original record %+v", orig.Actual)
	}

	clk.SetTime(clk.Now().Add(time.Hour))
	rec, err := p.Replay(context.Background(), orig.ID)
	if err != nil {
		t.Fatal(err)
	}
	if upstreamCalls.Load() != 1 {
		t.Errorf("the upstream saw %d requests: a re-run must not go upstream", upstreamCalls.Load())
	}
	select {
	case got := <-sink:
		t.Errorf("the sinks got %v: a re-run is not a proxied request and must not be captured", got.ID)
	default:
	}
	again := rp.last()
	if again.HTTP.Header.Get("Authorization") != "Bearer alice-token" || string(again.Body) != body ||
		!again.Arrival.Equal(clk.Now()) || again.Actual != nil || again.ID != rec.ID {
		t.Errorf("the re-run replayed id %s, arrival %v, headers %v, body %q, actual %v", again.ID, again.Arrival, again.HTTP.Header, again.Body, again.Actual != nil)
	}
	switch {
	case rec.ID == orig.ID || rec.RerunOf != orig.ID:
		t.Errorf("re-run record id %s rerunOf %s, original %s", rec.ID, rec.RerunOf, orig.ID)
	case rec.Predicted.Message != "run 2" || rec.Actual.Message != "nope" || rec.Actual.Status != 403:
		t.Errorf("re-run predicted %+v, actual %+v: want the new prediction and the original answer", rec.Predicted, rec.Actual)
	case !rec.Start.Equal(clk.Now()) || rec.Request.Path != orig.Request.Path:
		t.Errorf("re-run start %v path %s", rec.Start, rec.Request.Path)
	}

	// A re-run can be asked again; two more proxied flows then push the
	// original out (the count limit is 2).
	if _, err := p.Replay(context.Background(), orig.ID); err != nil {
		t.Fatalf("re-running again: %v", err)
	}
	for i := 0; i < 2; i++ {
		resp, err := http.Get(front.URL + "/api/v1/namespaces")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		<-sink
	}
	_, err = p.Replay(context.Background(), orig.ID)
	var unavailable *RerunUnavailableError
	if !errors.As(err, &unavailable) || !unavailable.NotFound() ||
		!strings.Contains(err.Error(), "flow "+orig.ID+" is older than the newest 2 kproxy keeps for re-runs") {
		t.Errorf("re-running an evicted flow: %v", err)
	}

	// Without Rerun limits nothing is kept, and the error says how to
	// turn re-runs on.
	off, _ := New(Config{Upstream: u, Passthrough: http.DefaultTransport, Replayer: rp})
	if _, err := off.Replay(context.Background(), orig.ID); err == nil || !strings.Contains(err.Error(), "--api-listen") {
		t.Errorf("re-runs off: %v", err)
	}
}
