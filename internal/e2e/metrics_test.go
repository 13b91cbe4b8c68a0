package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kproxy/kproxy/internal/flowview"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
)

// scrape reads kproxy's /metrics and parses it; raw is the text as
// served.
func scrape(t *testing.T, k *kproxy) (fams map[string]*dto.MetricFamily, raw []byte) {
	t.Helper()
	if k.srv.MetricsAddr == "" {
		t.Fatal("kproxy serves no metrics")
	}
	resp, err := http.Get("http://" + k.srv.MetricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if raw, err = io.ReadAll(resp.Body); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d %s", resp.StatusCode, raw)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	if fams, err = p.TextToMetricFamilies(bytes.NewReader(raw)); err != nil {
		t.Fatalf("/metrics is not Prometheus's text format: %v", err)
	}
	return fams, raw
}

// sample is the value of the sample of family name whose labels include
// every one of labels ("k=v" pairs): a counter's or gauge's value, a
// histogram's count; summed when several match.
func sample(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	var sum float64
	for _, m := range fams[name].GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		match := true
		for _, kv := range labels {
			k, v, _ := strings.Cut(kv, "=")
			match = match && have[k] == v
		}
		if !match {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// checkConventions checks kproxy's metric names and types against
// Prometheus's conventions, and its own linter.
func checkConventions(t *testing.T, fams map[string]*dto.MetricFamily, raw []byte) {
	t.Helper()
	name := regexp.MustCompile(`^kproxy_[a-z][a-z0-9_]*[a-z]$`)
	var ours int
	for n, f := range fams {
		if !strings.HasPrefix(n, "kproxy_") {
			if !strings.HasPrefix(n, "go_") && !strings.HasPrefix(n, "process_") {
				t.Errorf("metric %s: not kproxy's, nor the Go runtime's or the process's", n)
			}
			continue
		}
		ours++
		if !name.MatchString(n) || f.GetHelp() == "" {
			t.Errorf("metric %s: want a snake_case kproxy_ name and a help text", n)
		}
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			if !strings.HasSuffix(n, "_total") {
				t.Errorf("counter %s does not end in _total", n)
			}
		case dto.MetricType_HISTOGRAM:
			if !strings.HasSuffix(n, "_seconds") {
				t.Errorf("histogram %s is not in seconds", n)
			}
		case dto.MetricType_GAUGE:
			if strings.HasSuffix(n, "_total") {
				t.Errorf("gauge %s ends in _total", n)
			}
		default:
			t.Errorf("metric %s is a %v", n, f.GetType())
		}
	}
	if ours < 10 {
		t.Errorf("only %d kproxy_ metrics", ours)
	}
	problems, err := promlint.New(bytes.NewReader(raw)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "kproxy_") {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	}
}

// TestMetrics serves kproxy's metrics on a free port, sends a few
// requests through kproxy, and checks the counters moved as the records
// say, and the names follow Prometheus's conventions.
func TestMetrics(t *testing.T) {
	stream := record.NewStream()
	recs, _, unsubscribe := stream.Subscribe(64)
	defer unsubscribe()
	k := startKproxy(t, kproxyOptions{stream: stream, capture: t.TempDir() + "/capture.jsonl",
		set: func(o *serve.Options) { o.MetricsListen = "127.0.0.1:0" }})
	r := reverseRoute(k)
	c := r.client(nil)
	cm := "/api/v1/namespaces/" + testNS + "/configmaps"
	t.Cleanup(func() {
		_ = adminClient().CoreV1().ConfigMaps(testNS).Delete(context.Background(), "t-metrics", metav1.DeleteOptions{})
	})
	reqs := []struct {
		request
		status int
	}{
		{request{method: "GET", path: cm, user: "admin"}, 200},
		{request{method: "GET", path: cm, user: "bad"}, 401},
		{request{method: "POST", path: cm, user: "admin", body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"t-metrics"}}`}, 201},
		{request{method: "GET", path: cm + "/t-metrics-absent", user: "admin"}, 404},
	}
	for _, q := range reqs {
		if got := do(t, c, r.base, q.request); got.status != q.status {
			t.Fatalf("%s %s as %s: %d %s, want %d", q.method, q.path, q.user, got.status, got.body, q.status)
		}
	}
	var got []*record.Record
	for range reqs {
		select {
		case rec := <-recs:
			got = append(got, rec)
		case <-time.After(30 * time.Second):
			t.Fatalf("%d records of %d", len(got), len(reqs))
		}
	}

	fams, raw := scrape(t, k)
	checkConventions(t, fams, raw)
	n := float64(len(reqs))
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"kproxy_requests_total", nil, n},
		{"kproxy_requests_total", []string{"verb=list", "code_class=2xx"}, 1},
		{"kproxy_requests_total", []string{"verb=list", "code_class=4xx"}, 1},
		{"kproxy_requests_total", []string{"verb=create", "code_class=2xx"}, 1},
		{"kproxy_requests_total", []string{"verb=get", "code_class=4xx"}, 1},
		{"kproxy_replays_total", []string{"result=run"}, n},
		{"kproxy_replays_total", []string{"result=shed"}, 0},
		{"kproxy_replay_duration_seconds", nil, n},
		// Authentication runs in every replay.
		{"kproxy_replay_stage_duration_seconds", []string{"stage=authentication"}, n},
		{"kproxy_predictions_total", nil, n},
		{"kproxy_records_total", nil, n},
		{"kproxy_capture_records_total", nil, n},
		{"kproxy_capture_records_dropped_total", nil, 0},
		{"kproxy_replay_workers", nil, float64(runtime.GOMAXPROCS(0))},
		{"kproxy_replay_queue_capacity", nil, float64(proxy.DefaultReplayQueue(proxy.DefaultReplayWorkers()))},
		{"kproxy_replay_body_budget_bytes", nil, float64(proxy.DefaultReplayBodyBudget)},
		{"kproxy_replay_body_bytes", nil, 0},
		// Every relay ended before its record was written; one at a time
		// is no burst.
		{"kproxy_requests_in_flight", nil, 0},
		{"kproxy_upstream_idle_closes_total", nil, 0},
	} {
		if fams[tc.name] == nil {
			t.Errorf("no metric %s", tc.name)
			continue
		}
		if got := sample(fams, tc.name, tc.labels...); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	// Agreement, as the records themselves say.
	want := map[string]float64{}
	for _, rec := range got {
		_, kind := flowview.Agreement(rec)
		want[map[flowview.AgreementKind]string{flowview.Match: "agree", flowview.Mismatch: "disagree", flowview.Unknown: "unknown"}[kind]]++
	}
	for _, a := range []string{"agree", "disagree", "unknown"} {
		if got := sample(fams, "kproxy_predictions_total", "agreement="+a); got != want[a] {
			t.Errorf("kproxy_predictions_total{agreement=%q} = %v, the records say %v", a, got, want[a])
		}
	}
	if want["agree"] == 0 {
		t.Errorf("no prediction agreed: %+v", want)
	}
	// Stage names are the contract's.
	for _, m := range fams["kproxy_replay_stage_duration_seconds"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "stage" && !slices.Contains(contractStages, l.GetValue()) {
				t.Errorf("stage label %q is not a contract stage", l.GetValue())
			}
		}
	}
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes", "kproxy_replay_queue_depth", "kproxy_replay_workers_busy"} {
		if fams[name] == nil {
			t.Errorf("no %s", name)
		}
	}
}

// shedNS holds the configmaps of TestMetricsShedding, whose creates a
// slow validating webhook holds.
const shedNS = "kproxy-e2e-shed"

// TestMetricsShedding runs kproxy with one replay worker and a queue of
// one. Creates held by a slow webhook hold the worker (the replay calls
// the webhook too, in dry run): the creates sent with it are shed. Then a
// burst of 50 concurrent GETs. Every request gets the apiserver's real
// answer, every request has its record, a shed replay says so (unknown),
// and no prediction is a status the apiserver did not give.
func TestMetricsShedding(t *testing.T) {
	ctx := context.Background()
	admin := adminClient()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, namespace(shedNS), createOpts); ignoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	const webhookTime = 2 * time.Second
	registerSlowWebhook(t, admin, "slow.shed.kproxy.test", shedNS, webhookTime)
	t.Cleanup(func() {
		_ = admin.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, "kproxy-"+shedNS, metav1.DeleteOptions{})
		_ = admin.CoreV1().Namespaces().Delete(ctx, shedNS, metav1.DeleteOptions{})
	})
	// The apiserver calls the webhook once it has seen its
	// configuration: a dry run takes the webhook's time.
	probe := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"probe"}}`
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		start := time.Now()
		res := admin.CoreV1().RESTClient().Post().AbsPath("/api/v1/namespaces/"+shedNS+"/configmaps").Param("dryRun", "All").
			SetHeader("Content-Type", "application/json").Body([]byte(probe)).Do(ctx)
		return res.Error() == nil && time.Since(start) >= webhookTime, nil
	})
	if err != nil {
		t.Fatalf("the slow webhook is not called: %v", err)
	}

	capture := t.TempDir() + "/capture.jsonl"
	k := startKproxy(t, kproxyOptions{capture: capture, set: func(o *serve.Options) {
		o.MetricsListen, o.ReplayWorkers, o.ReplayQueue = "127.0.0.1:0", 1, 1
	}})
	r := reverseH2Route(k)
	c := r.client(nil)
	cm := "/api/v1/namespaces/" + shedNS + "/configmaps"

	// burst sends n requests at once and checks each got want.
	burst := func(n int, want int, req func(i int) request) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Go(func() {
				q := req(i)
				hr, err := http.NewRequest(q.method, r.base+q.path, strings.NewReader(q.body))
				if err != nil {
					errs <- err
					return
				}
				hr.Header.Set("Authorization", "Bearer "+tokenOf(q.user))
				if q.body != "" {
					hr.Header.Set("Content-Type", "application/json")
				}
				resp, err := c.Do(hr)
				if err != nil {
					errs <- fmt.Errorf("%s %s: %w", q.method, q.path, err)
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != want {
					errs <- fmt.Errorf("%s %s: %d %s, want %d", q.method, q.path, resp.StatusCode, b, want)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
	const creates, gets = 8, 50
	burst(creates, http.StatusCreated, func(i int) request {
		return request{method: "POST", path: cm, user: "admin",
			body: fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"t-shed-%d"}}`, i)}
	})
	// The creates' replays end (the webhook's time each, one after the
	// other) before the GETs come: their replays are quick, and some get
	// the worker.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		fams, _ := scrape(t, k)
		return sample(fams, "kproxy_replay_workers_busy")+sample(fams, "kproxy_replay_queue_depth") == 0, nil
	})
	if err != nil {
		t.Fatalf("the creates' replays did not end: %v", err)
	}
	burst(gets, http.StatusOK, func(i int) request {
		return request{method: "GET", path: cm + fmt.Sprintf("/t-shed-%d", i%creates), user: "admin"}
	})
	recs := readCapture(t, capture, creates+gets)
	fams, raw := scrape(t, k)
	checkConventions(t, fams, raw)
	k.stop()

	var shedCreates, shed, predictedGets int
	for _, rec := range recs {
		p, a := rec.Predicted, rec.Actual
		if p.Stage == record.StageUnknown {
			if p.Message == proxy.ShedMessage {
				shed++
				if rec.Request.Verb == "create" {
					shedCreates++
				}
				// The creates' replays authenticated admin's token
				// before the GETs came: a shed GET names its caller.
				if rec.Request.Verb == "get" && (rec.Request.User != "admin" ||
					!strings.Contains(rec.Stages[0].Explanation, "as kproxy's replay authenticated the same bearer token")) {
					t.Errorf("shed GET %s: user %q (%s), want admin, named from an earlier replay", rec.ID, rec.Request.User, rec.Stages[0].Explanation)
				}
			}
			continue
		}
		if rec.Request.Verb == "get" {
			predictedGets++
		}
		if a.Status/100 == 2 && p.Status/100 != 2 {
			t.Errorf("record %s %s %s: predicted %d @%s (%s), the apiserver answered %d", rec.ID, rec.Request.Method, rec.Request.Path, p.Status, p.Stage, p.Message, a.Status)
		}
		if p.Status == http.StatusGatewayTimeout && a.Status != http.StatusGatewayTimeout {
			t.Errorf("record %s: predicted a 504 the apiserver did not give (%s)", rec.ID, p.Message)
		}
	}
	t.Logf("shed: %d of %d creates, %d of %d in all; %d GETs predicted", shedCreates, creates, shed, creates+gets, predictedGets)
	// The first create's replay holds the worker for the webhook's 2s,
	// one more waits: the creates that arrive meanwhile are shed.
	if shedCreates == 0 {
		t.Errorf("no create was shed with one replay worker, a queue of one and %d creates each held %v by the webhook", creates, webhookTime)
	}
	if got := sample(fams, "kproxy_replays_total", "result=shed"); got != float64(shed) {
		t.Errorf("kproxy_replays_total{result=shed} = %v, the records say %d", got, shed)
	}
	if got := sample(fams, "kproxy_replays_total"); got != creates+gets {
		t.Errorf("kproxy_replays_total (run and shed) = %v, want %d", got, creates+gets)
	}
	if got := sample(fams, "kproxy_records_total"); got != creates+gets {
		t.Errorf("kproxy_records_total = %v, want %d", got, creates+gets)
	}
}
