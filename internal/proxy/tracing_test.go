package proxy_test

import (
	"context"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/rest"

	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/stages"
)

// refusingReplay predicts what the apiserver answers below: bob, known
// only once the replay has authenticated his token, refused at
// authorization. It names the APF objects of the response's headers.
type refusingReplay struct{}

func (refusingReplay) Run(context.Context, *stages.Request) stages.Outcome {
	return stages.Outcome{
		Predicted: record.Prediction{Status: 403, Stage: record.StageAuthorization, Reason: "Forbidden"},
		Caller:    &user.DefaultInfo{Name: "bob", Groups: []string{"devs", "qa"}},
	}
}

func (refusingReplay) APFNames(fs, pl string) (string, string) {
	if fs == "fs-uid" && pl == "pl-uid" {
		return "global-default", "global-default"
	}
	return "", ""
}

// spanSink checks, as each record arrives, that its server span has
// already ended: whoever reads a record finds its trace complete.
type spanSink struct {
	t    *testing.T
	sr   *tracetest.SpanRecorder
	recs chan *record.Record
}

func (s spanSink) Write(r *record.Record) {
	if serverSpan(s.sr, r.TraceID) == nil {
		s.t.Errorf("record %s written before its server span ended", r.ID)
	}
	s.recs <- r
}

func serverSpan(sr *tracetest.SpanRecorder, traceID string) sdktrace.ReadOnlySpan {
	for _, s := range sr.Ended() {
		if s.SpanKind() == trace.SpanKindServer && s.SpanContext().TraceID().String() == traceID {
			return s
		}
	}
	return nil
}

// tracedProxy runs a proxy in front of upstream (nil: an upstream that
// is down) with a recording tracer provider.
func tracedProxy(t *testing.T, upstream http.Handler, replayer proxy.Replayer) (base string, client *http.Client, sr *tracetest.SpanRecorder, recs chan *record.Record) {
	t.Helper()
	up := httptest.NewTLSServer(upstream)
	t.Cleanup(up.Close)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: up.Certificate().Raw})
	u, err := proxy.NewUpstream(&rest.Config{Host: up.URL, TLSClientConfig: rest.TLSClientConfig{CAData: caPEM}})
	if err != nil {
		t.Fatal(err)
	}
	if upstream == nil {
		up.Close() // nothing answers there any more
	}
	sr = tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	recs = make(chan *record.Record, 4)
	p, err := proxy.New(proxy.Config{Upstream: u.URL, Passthrough: u.Passthrough, Replayer: replayer,
		Sink: spanSink{t, sr, recs}, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewTLSServer(p)
	t.Cleanup(func() { front.Close(); p.Drain() })
	return front.URL, front.Client(), sr, recs
}

func get(t *testing.T, client *http.Client, url string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer bob-token")
	req.Header.Set("User-Agent", "kubectl/v1.37.2 (test)")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func waitRecord(t *testing.T, recs chan *record.Record) *record.Record {
	t.Helper()
	select {
	case r := <-recs:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("no record")
		return nil
	}
}

func attrs(s sdktrace.ReadOnlySpan) map[string]string {
	m := map[string]string{}
	for _, a := range s.Attributes() {
		m[string(a.Key)] = a.Value.String()
	}
	return m
}

// TestServerSpanOfARefusedRequest: the server span carries what an
// operator searches a refused request by, including what only the replay
// knew (the token's user, the prediction), ends when the response ended,
// and is an error.
func TestServerSpanOfARefusedRequest(t *testing.T) {
	refuse := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Audit-Id", "audit-1")
		w.Header().Set("X-Kubernetes-Pf-Flowschema-Uid", "fs-uid")
		w.Header().Set("X-Kubernetes-Pf-Prioritylevel-Uid", "pl-uid")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"secrets is forbidden: User \"bob\" cannot list resource \"secrets\"","reason":"Forbidden","code":403}`)
	})
	base, client, sr, recs := tracedProxy(t, refuse, refusingReplay{})
	if got := get(t, client, base+"/api/v1/namespaces/team/secrets"); got != 403 {
		t.Fatalf("status %d", got)
	}
	rec := waitRecord(t, recs)
	s := serverSpan(sr, rec.TraceID)
	if s == nil {
		t.Fatal("no server span")
	}
	if s.Name() != "list secrets" {
		t.Errorf("span name %q", s.Name())
	}
	want := map[string]string{
		"http.request.method": "GET", "url.path": "/api/v1/namespaces/team/secrets", "user_agent.original": "kubectl/v1.37.2 (test)",
		"kproxy.record.id": rec.ID, "k8s.verb": "list", "k8s.api_version": "v1", "k8s.resource": "secrets", "k8s.namespace": "team",
		"kproxy.identity": "token", "enduser.id": "bob", "k8s.user.groups": `["devs","qa"]`, "k8s.audit_id": "audit-1",
		"k8s.apf.flow_schema": "global-default", "k8s.apf.priority_level": "global-default",
		"http.response.status_code": "403", "kproxy.predicted.status": "403", "kproxy.predicted.stage": "authorization",
		"kproxy.predicted.reason": "Forbidden", "kproxy.agreement": "match",
	}
	got := attrs(s)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	for _, k := range []string{"k8s.name", "k8s.api_group", "k8s.subresource", "k8s.user.acting_as"} {
		if v, ok := got[k]; ok {
			t.Errorf("%s = %q: empty values are left out", k, v)
		}
	}
	if s.Status().Code != codes.Error || s.Status().Description != "403 Forbidden" {
		t.Errorf("status %+v, want Error 403 Forbidden", s.Status())
	}
	// The span is the request's, not the replay's: it starts and ends
	// when the record says the exchange did.
	if !s.StartTime().Equal(rec.Start) || s.EndTime().Sub(s.StartTime()) != time.Duration(rec.Latency.TotalNs) {
		t.Errorf("span %v + %v, record %v + %v", s.StartTime(), s.EndTime().Sub(s.StartTime()), rec.Start, time.Duration(rec.Latency.TotalNs))
	}
}

// slowReplay makes the replay outlast the response by far.
type slowReplay struct{ d time.Duration }

func (r slowReplay) Run(context.Context, *stages.Request) stages.Outcome {
	time.Sleep(r.d)
	return stages.Outcome{Predicted: record.Prediction{Status: 200}}
}

// TestServerSpanLastsAsLongAsTheRequest: a replay that takes long does not
// stretch the server span, which still ends after the replay is done.
func TestServerSpanLastsAsLongAsTheRequest(t *testing.T) {
	const replay = 300 * time.Millisecond
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{}`) })
	base, client, sr, recs := tracedProxy(t, ok, slowReplay{replay})
	if got := get(t, client, base+"/api/v1/namespaces/team/configmaps/c"); got != 200 {
		t.Fatalf("status %d", got)
	}
	rec := waitRecord(t, recs)
	s := serverSpan(sr, rec.TraceID)
	if d := s.EndTime().Sub(s.StartTime()); d >= replay {
		t.Errorf("server span lasts %v: the replay's %v is not the request's", d, replay)
	}
	if s.Status().Code == codes.Error {
		t.Errorf("a 200 is an error: %+v", s.Status())
	}
	if got := attrs(s); got["kproxy.agreement"] != "match" || got["k8s.name"] != "c" || got["kproxy.predicted.status"] != "200" {
		t.Errorf("attributes %v", got)
	}
	if _, ok := attrs(s)["kproxy.predicted.stage"]; ok {
		t.Error("a predicted success names a stage")
	}
}

// TestServerSpanOfAnUpstreamFailure: kproxy's own 502 is an error whose
// description says what failed.
func TestServerSpanOfAnUpstreamFailure(t *testing.T) {
	base, client, sr, recs := tracedProxy(t, nil, nil)
	if got := get(t, client, base+"/api/v1/namespaces/team/pods"); got != http.StatusBadGateway {
		t.Fatalf("status %d", got)
	}
	rec := waitRecord(t, recs)
	s := serverSpan(sr, rec.TraceID)
	st := s.Status()
	if st.Code != codes.Error || !strings.HasPrefix(st.Description, "502 Bad Gateway: kproxy could not reach the apiserver") || len(st.Description) > 200 {
		t.Errorf("status %+v", st)
	}
	if got := attrs(s)["kproxy.agreement"]; got != "unknown" {
		t.Errorf("agreement %q with the replay off", got)
	}
	// The upstream span is the server span's child, and an error too.
	for _, c := range sr.Ended() {
		if c.Name() == "upstream" && c.SpanContext().TraceID() == s.SpanContext().TraceID() {
			if c.Parent().SpanID() != s.SpanContext().SpanID() || c.Status().Code != codes.Error {
				t.Errorf("upstream span: parent %s, status %+v", c.Parent().SpanID(), c.Status())
			}
			return
		}
	}
	t.Errorf("no upstream span among %v", names(sr))
}

func names(sr *tracetest.SpanRecorder) []string {
	var n []string
	for _, s := range sr.Ended() {
		n = append(n, s.Name())
	}
	slices.Sort(n)
	return n
}

// TestUpstreamAbortsTheRequest: an apiserver that hangs up without an
// answer (kube-apiserver aborts a request whose handler panicked) is told
// from one kproxy could not reach, and the client's request is aborted
// alike: no answer, as directly (it had been kproxy's 502).
func TestUpstreamAbortsTheRequest(t *testing.T) {
	abort := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) })
	base, client, _, recs := tracedProxy(t, abort, nil)
	resp, err := client.Get(base + "/api/v1/namespaces/team/pods")
	if err == nil {
		resp.Body.Close()
		t.Fatalf("status %d, want the request aborted, as the apiserver aborted it", resp.StatusCode)
	}
	rec := waitRecord(t, recs)
	if !strings.Contains(rec.Actual.Error, "closed the connection without answering") || strings.Contains(rec.Actual.Error, "could not reach") {
		t.Errorf("actual.error %q, want it to say the apiserver hung up", rec.Actual.Error)
	}
	if !rec.Actual.NoAnswer() {
		t.Errorf("a request the apiserver aborted is not a no-answer record: %+v", rec.Actual)
	}
}

// unknownReplay cannot predict, and says why.
type unknownReplay struct{}

func (unknownReplay) Run(context.Context, *stages.Request) stages.Outcome {
	return stages.Outcome{Predicted: record.Prediction{Stage: record.StageUnknown, Message: "cannot predict: storage: the state was read late"}}
}

func (unknownReplay) APFNames(string, string) (string, string) { return "", "" }

// TestServerSpanSaysWhyUnknown: an unknown prediction's span says why,
// as its record does (a probe found only "unknown" in Jaeger).
func TestServerSpanSaysWhyUnknown(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	base, client, sr, recs := tracedProxy(t, ok, unknownReplay{})
	if got := get(t, client, base+"/api/v1/namespaces/team/configmaps"); got != 200 {
		t.Fatalf("status %d", got)
	}
	rec := waitRecord(t, recs)
	s := serverSpan(sr, rec.TraceID)
	if s == nil {
		t.Fatal("no server span")
	}
	if got := attrs(s)["kproxy.unknown.reason"]; got != rec.Predicted.Message || got == "" {
		t.Errorf("kproxy.unknown.reason = %q, want the record's %q", got, rec.Predicted.Message)
	}
}
