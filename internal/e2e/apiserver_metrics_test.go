package e2e

import (
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/component-base/metrics/legacyregistry"
)

// TestReplayObservesNoApiserverMetric: the replay runs the apiserver's
// code, which observes the apiserver's own Prometheus metrics on every
// request; kproxy serves none of them, so the replay turns them off
// (internal/stages/apimetrics). A read, a write, a refused request and a
// list replayed against the real apiserver change no apiserver metric in
// kproxy's process: a metric a new Kubernetes version adds to the request
// path fails here by name, to be added to apimetrics.Disabled.
func TestReplayObservesNoApiserverMetric(t *testing.T) {
	r, recs := recordedKproxy(t)
	c := r.client(nil)
	name := "metrics-" + time.Now().Format("150405.000000")
	name = strings.ReplaceAll(name, ".", "-")
	requests := []request{
		{method: "POST", path: "/api/v1/namespaces/" + testNS + "/configmaps", user: "admin",
			body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"` + name + `"},"data":{"k":"v"}}`},
		{method: "GET", path: "/api/v1/namespaces/" + testNS + "/configmaps/" + name, user: "admin"},
		{method: "GET", path: "/api/v1/namespaces/" + testNS + "/configmaps", user: "admin"},
		{method: "GET", path: "/api/v1/namespaces/" + testNS + "/secrets", user: "bob"},
		{method: "DELETE", path: "/api/v1/namespaces/" + testNS + "/configmaps/" + name, user: "admin"},
	}
	// Once first, so what the machinery sets up at its first request
	// (caches, gauges set once) is not counted.
	send := func() {
		for _, req := range requests {
			do(t, c, r.base, req)
			select {
			case rec := <-recs:
				// A replay that ran to its verdict, so every stage's code ran.
				if rec.Predicted.Status != rec.Actual.Status {
					t.Fatalf("%s %s: predicted %+v, the apiserver answered %d", req.method, req.path, rec.Predicted, rec.Actual.Status)
				}
			case <-time.After(time.Minute):
				t.Fatalf("%s %s: no record", req.method, req.path)
			}
		}
	}
	send()
	before := apiserverMetrics(t)
	send()
	after := apiserverMetrics(t)
	var changed []string
	for name, v := range after {
		if before[name] != v {
			changed = append(changed, name)
		}
	}
	sort.Strings(changed)
	if len(changed) > 0 {
		t.Errorf("the replay still observes the apiserver's metrics %v: add them to apimetrics.Disabled", changed)
	}
}

// apiserverMetrics is what kproxy's process holds in the apiserver's
// registry, by family, leaving out what changes on its own: the Go
// runtime's and the process's collectors, the work queues of informers
// and controllers running in the background, and the registry's own
// bookkeeping.
func apiserverMetrics(t *testing.T) map[string]string {
	t.Helper()
	mfs, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, mf := range mfs {
		n := mf.GetName()
		if strings.HasPrefix(n, "go_") || strings.HasPrefix(n, "process_") || strings.HasPrefix(n, "workqueue_") ||
			strings.HasPrefix(n, "grpc_client_") || n == "registered_metrics_total" {
			continue
		}
		out[n] = familyValue(mf)
	}
	return out
}

// familyValue is a family's samples as text, to compare.
func familyValue(mf *dto.MetricFamily) string {
	var b strings.Builder
	for _, m := range mf.GetMetric() {
		b.WriteString(m.String())
		b.WriteByte('\n')
	}
	return b.String()
}
