package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/record"
)

// TestNoReplayer: a proxy without a replayer (kproxy serve
// --replay=false) forwards every request, records it with its prediction
// unknown ("the replay is disabled") and its headers redacted, and runs
// no replay at all: nothing is run, queued or shed.
func TestNoReplayer(t *testing.T) {
	up := tlsUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusCreated)
		}
		_, _ = io.WriteString(w, `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x"}}`)
	})
	sink := &records{}
	reg := prometheus.NewRegistry()
	p, err := New(Config{Upstream: up.URL, Passthrough: up.Passthrough, Sink: sink, Metrics: metrics.New(reg)})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewUnstartedServer(p)
	front.EnableHTTP2 = true
	front.StartTLS()
	defer front.Close()
	client := front.Client()
	client.Timeout = 10 * time.Second
	defer client.CloseIdleConnections()

	for _, c := range []struct {
		method, path, body string
		status             int
	}{
		{http.MethodGet, "/api/v1/namespaces/default/configmaps/x", "", 200},
		{http.MethodPost, "/api/v1/namespaces/default/configmaps", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}`, 201},
	} {
		req, _ := http.NewRequest(c.method, front.URL+c.path, strings.NewReader(c.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer not-a-secret-here")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Fatalf("%s %s: %d, want %d", c.method, c.path, resp.StatusCode, c.status)
		}
	}
	p.Drain()
	recs := sink.list()
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2", len(recs))
	}
	for _, rec := range recs {
		if p := rec.Predicted; p.Stage != record.StageUnknown || p.Status != 0 || p.Message != "cannot predict: the replay is disabled" {
			t.Errorf("%s %s: predicted %+v, want unknown: the replay is disabled", rec.Request.Method, rec.Request.Path, p)
		}
		if len(rec.Stages) != len(record.StageOrder) {
			t.Errorf("%s: %d stages, want the contract's nine, skipped", rec.Request.Method, len(rec.Stages))
		}
		for i, s := range rec.Stages {
			if s.Name != record.StageOrder[i] || s.Outcome != record.Skip || !strings.Contains(s.Explanation, "--replay=false") {
				t.Errorf("%s: stage %d %+v, want %s skipped: not replayed (--replay=false)", rec.Request.Method, i, s, record.StageOrder[i])
			}
		}
		if want := map[string]int{http.MethodGet: 200, http.MethodPost: 201}[rec.Request.Method]; rec.Actual.Status != want {
			t.Errorf("%s: actual %d, want %d", rec.Request.Method, rec.Actual.Status, want)
		}
		if got := http.Header(rec.Request.Headers).Get("Authorization"); got == "" || strings.Contains(got, "not-a-secret-here") {
			t.Errorf("%s: Authorization %q, want it redacted", rec.Request.Method, got)
		}
	}
	for _, result := range []string{"run", "shed"} {
		if got := gauge(t, reg, "kproxy_replays_total", "result", result); got != 0 {
			t.Errorf("kproxy_replays_total{result=%s} = %v without a replayer, want 0", result, got)
		}
	}
	if st := p.pool.stats(); st.Busy != 0 || st.Queued != 0 || st.Ran != 0 || st.Shed != 0 {
		t.Errorf("pool %+v without a replayer, want untouched", st)
	}
}
