package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/telemetry"
)

// TestTracing sends requests through kproxy exporting to a real Jaeger
// and reads the traces back from Jaeger's query API: the server span, the
// replay span with one child per stage that applies (the replay span
// names the others), and the upstream span; the server
// span's attributes for a refused request; no span of the apiserver's own
// code in kproxy's trace of a replayed write and read. It runs once per
// OTLP protocol.
func TestTracing(t *testing.T) {
	ctx := context.Background()
	j, err := localcluster.StartJaeger(ctx, "", "", os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Stop()
	for _, proto := range []struct{ name, endpoint, traceID string }{
		{"http/protobuf", j.OTLPHTTP, "4bf92f3577b34da6a3ce929d0e0e4736"},
		{"grpc", j.OTLPGRPC, "5bf92f3577b34da6a3ce929d0e0e4737"},
	} {
		t.Run(proto.name, func(t *testing.T) {
			stream := record.NewStream()
			recs, _, cancel := stream.Subscribe(16)
			defer cancel()
			var log syncBuffer
			k := startKproxy(t, kproxyOptions{stream: stream, log: &log, telemetry: telemetry.Options{
				Endpoint: proto.endpoint, Protocol: proto.name, ServiceName: "kproxy-e2e"}})
			// kproxy says where its traces go.
			if want := "OTLP " + proto.name + " to " + proto.endpoint; !strings.Contains(log.String(), want) {
				t.Errorf("the start log does not say %q:\n%s", want, log.String())
			}
			r := reverseRoute(k)
			// An incoming traceparent is continued.
			parent := "00-" + proto.traceID + "-00f067aa0ba902b7-01"
			// alice (group devs) is allowed by RBAC: the chain asks the
			// masters authorizer, Node and RBAC, and stops there.
			got := do(t, r.client(nil), r.base, request{method: "GET", path: "/api/v1/namespaces/" + testNS + "/configmaps", user: "alice",
				header: http.Header{"Traceparent": {parent}}})
			if got.status != 200 {
				t.Fatalf("status %d", got.status)
			}
			rec := nextRecord(t, recs)
			if rec.TraceID != proto.traceID {
				t.Errorf("trace %s does not continue the incoming traceparent", rec.TraceID)
			}
			// A write: the write path's stages, the admission plugins under
			// their phase.
			cm := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"traced"}}`
			got = do(t, r.client(nil), r.base, request{method: "POST", path: "/api/v1/namespaces/" + testNS + "/configmaps?dryRun=All", user: "admin",
				body: cm, contentType: "application/json"})
			if got.status != 201 {
				t.Fatalf("write: status %d: %s", got.status, got.body)
			}
			var wrec *record.Record
			select {
			case wrec = <-recs:
			case <-time.After(30 * time.Second):
				t.Fatal("no record for the write")
			}
			// A refused request: bob (groups devs, qa) may not list
			// secrets; RBAC and the webhook have no opinion.
			got = do(t, r.client(nil), r.base, request{method: "GET", path: "/api/v1/namespaces/" + testNS + "/secrets", user: "bob"})
			if got.status != 403 {
				t.Fatalf("refused: status %d: %s", got.status, got.body)
			}
			refused := nextRecord(t, recs)
			if refused.Predicted.Status != 403 || refused.Predicted.Stage != record.StageAuthorization {
				t.Fatalf("refused: predicted %+v, want 403 at authorization", refused.Predicted)
			}
			// A create and a get replayed for real (the replay runs the
			// create in dry run).
			name := "traced-" + strings.ReplaceAll(proto.name, "/", "-")
			t.Cleanup(func() {
				_ = adminClient().CoreV1().ConfigMaps(testNS).Delete(context.Background(), name, metav1.DeleteOptions{})
			})
			got = do(t, r.client(nil), r.base, request{method: "POST", path: "/api/v1/namespaces/" + testNS + "/configmaps", user: "admin",
				body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"` + name + `"},"data":{"k":"v"}}`})
			if got.status != 201 {
				t.Fatalf("create: status %d: %s", got.status, got.body)
			}
			crec := nextRecord(t, recs)
			got = do(t, r.client(nil), r.base, request{method: "GET", path: "/api/v1/namespaces/" + testNS + "/configmaps/" + name, user: "admin"})
			if got.status != 200 {
				t.Fatalf("get: status %d: %s", got.status, got.body)
			}
			grec := nextRecord(t, recs)
			k.stop() // flushes spans

			checkRefusedTrace(t, j.QueryURL, refused)
			for _, c := range []struct {
				what, span string
				rec        *record.Record
			}{
				{"create", "create configmaps", crec},
				{"get", "get configmaps", grec},
				{"dry-run create", "create configmaps", wrec},
			} {
				checkOnlyKproxysSpans(t, c.what, jaegerTrace(t, j.QueryURL, c.rec.TraceID, has(c.span, "replay", "storage")))
			}
			wtrace := jaegerTrace(t, j.QueryURL, wrec.TraceID, has(append([]string{"etcd get"}, contractStages...)...))
			var wspans []string
			for _, s := range wtrace {
				wspans = append(wspans, s.OperationName)
			}
			// The storage stage shows etcd's answer for the written key.
			for _, w := range append([]string{"etcd get"}, contractStages...) {
				if !slices.Contains(wspans, w) {
					t.Errorf("write trace %s lacks span %q; has %v", wrec.TraceID, w, wspans)
				}
			}
			// The authenticators before the token's (x509 on this
			// cluster) found nothing to read: no span of their own, named
			// with their time on the stage's span.
			for _, s := range wtrace {
				if s.OperationName != "authentication" {
					continue
				}
				if quiet := s.tag("kproxy.authenticators.no_opinion"); !strings.Contains(quiet, "x509 ") || slices.Contains(wspans, "authenticator x509") {
					t.Errorf("write trace %s: authentication's kproxy.authenticators.no_opinion = %q, want x509 named there and not as a span; spans %v", wrec.TraceID, quiet, wspans)
				}
			}
			// The plugins that admitted without change, quickly, share
			// one span per phase that names each with its time.
			var folded string
			for _, s := range wtrace {
				if strings.HasPrefix(s.OperationName, "admission: ") && strings.HasSuffix(s.OperationName, " more plugins") {
					folded += s.tag("kproxy.admission.plugins") + ", "
				}
			}
			for _, p := range []string{"NamespaceLifecycle", "ResourceQuota", "ValidatingAdmissionPolicy"} {
				if !strings.Contains(folded, p+" ") && !slices.Contains(wspans, "admission "+p) {
					t.Errorf("write trace %s: admission plugin %s has no span and is in no folded span (%q); spans %v", wrec.TraceID, p, folded, wspans)
				}
			}
			if folded == "" {
				t.Errorf("write trace %s: no folded admission span; spans %v", wrec.TraceID, wspans)
			}
			// A read's admission stages do not apply: they have no span,
			// and the replay span names them.
			admission := []string{"mutating-admission", "validation", "validating-admission"}
			want := []string{"list configmaps", "replay", "upstream", "authenticator token-file", "authorizer rbac",
				"etcd3 store list", "etcd range" /* the read, through the apiserver's etcd3 store, and etcd's answer with its latency */}
			for _, s := range contractStages {
				if !slices.Contains(admission, s) {
					want = append(want, s)
				}
			}
			ltrace := jaegerTrace(t, j.QueryURL, rec.TraceID, has(want...))
			var spans []string
			for _, s := range ltrace {
				spans = append(spans, s.OperationName)
			}
			if skipped := findSpan(ltrace, "replay").tag("kproxy.stages.skipped"); skipped != strings.Join(admission, ", ") || slices.ContainsFunc(admission, func(a string) bool { return slices.Contains(spans, a) }) {
				t.Errorf("trace %s: the replay span's kproxy.stages.skipped = %q, want %q, and no span of theirs; spans %v", rec.TraceID, skipped, strings.Join(admission, ", "), spans)
			}
			// The authorizers before RBAC had no opinion and no reason,
			// quickly: named with their time on the stage's span, no span
			// of their own.
			authz := findSpan(ltrace, "authorization")
			for _, quiet := range []string{"kubernetes.io/system-privileged-group", "node"} {
				if tag := authz.tag("kproxy.authorizers.no_opinion"); !strings.Contains(tag, quiet+" ") || slices.Contains(spans, "authorizer "+quiet) {
					t.Errorf("trace %s: authorization's kproxy.authorizers.no_opinion = %q, want %s named there and not as a span; spans %v", rec.TraceID, tag, quiet, spans)
				}
			}
		})
	}
}

func nextRecord(t *testing.T, recs <-chan *record.Record) *record.Record {
	t.Helper()
	select {
	case rec := <-recs:
		return rec
	case <-time.After(30 * time.Second):
		t.Fatal("no record")
		return nil
	}
}

// checkRefusedTrace holds the server span of a request RBAC refused to
// what an operator searches for it by.
func checkRefusedTrace(t *testing.T, queryURL string, rec *record.Record) {
	t.Helper()
	spans := jaegerTrace(t, queryURL, rec.TraceID, has("list secrets", "replay", "authorization"))
	server := findSpan(spans, "list secrets")
	want := map[string]string{
		"span.kind": "server", "enduser.id": "bob", "kproxy.identity": "token",
		"k8s.audit_id": rec.Actual.AuditID, "kproxy.record.id": rec.ID,
		"k8s.verb": "list", "k8s.resource": "secrets", "k8s.namespace": testNS,
		"http.request.method": "GET", "url.path": "/api/v1/namespaces/" + testNS + "/secrets",
		"kproxy.predicted.status": "403", "kproxy.predicted.stage": "authorization",
		"http.response.status_code": "403", "kproxy.agreement": "match",
		"k8s.apf.flow_schema": rec.Actual.FlowSchema, "k8s.apf.priority_level": rec.Actual.PriorityLevel,
		"otel.status_code": "ERROR", "otel.status_description": "403 Forbidden",
	}
	if rec.Actual.AuditID == "" || rec.Actual.FlowSchema == "" {
		t.Errorf("the record lacks the audit ID or the flow schema: %+v", rec.Actual)
	}
	for k, v := range want {
		if got := server.tag(k); got != v {
			t.Errorf("refused request's server span: %s = %q, want %q", k, got, v)
		}
	}
	if g := server.tag("k8s.user.groups"); !strings.Contains(g, "devs") || !strings.Contains(g, "qa") {
		t.Errorf("refused request's server span: k8s.user.groups = %q, want devs and qa", g)
	}
	if got := findSpan(spans, "authorization").tag("otel.status_code"); got != "ERROR" {
		t.Errorf("the authorization stage that refused has status %q, want ERROR", got)
	}
}

// apiserverInternals are names of spans and events the apiserver's own
// code makes (its handlers, its etcd3 store, its HTTP filter): the replay
// runs that code, but did none of that work.
var apiserverInternals = []string{"SerializeObject", "Write to database", "Create etcd3", "Get etcd3", "List etcd3", "KubernetesAPI",
	"Create", "Get", "List", "Update", "Patch", "Delete"}

// checkOnlyKproxysSpans: kproxy's trace holds kproxy's spans only, with
// no events (kproxy adds none: any would be the apiserver's, like "Write
// to database call succeeded"), and every one below the server and
// upstream spans is marked as the replay's.
func checkOnlyKproxysSpans(t *testing.T, what string, spans []jaegerSpan) {
	t.Helper()
	for _, s := range spans {
		if s.service != "kproxy-e2e" {
			continue
		}
		for _, bad := range apiserverInternals {
			if s.OperationName == bad || (len(bad) > 6 && strings.Contains(s.OperationName, bad)) {
				t.Errorf("%s: kproxy's trace has the apiserver's span %q", what, s.OperationName)
			}
		}
		var events []string
		for _, l := range s.Logs {
			for _, f := range l.Fields {
				if f.Key == "event" {
					events = append(events, fmt.Sprint(f.Value))
				}
			}
		}
		if len(s.Logs) > 0 {
			t.Errorf("%s: span %q has events %q", what, s.OperationName, events)
		}
		if s.tag("span.kind") != "server" && s.OperationName != "upstream" && s.tag("kproxy.replay") != "true" {
			t.Errorf("%s: span %q is not marked kproxy.replay=true", what, s.OperationName)
		}
	}
}

type jaegerSpan struct {
	OperationName string     `json:"operationName"`
	Tags          []jaegerKV `json:"tags"`
	Logs          []struct {
		Fields []jaegerKV `json:"fields"`
	} `json:"logs"`
	ProcessID string `json:"processID"`
	service   string
}

type jaegerKV struct {
	Key   string `json:"key"`
	Value any    `json:"value"`
}

// tag is a tag's value as text ("" when absent).
func (s jaegerSpan) tag(key string) string {
	for _, kv := range s.Tags {
		if kv.Key == key {
			return fmt.Sprint(kv.Value)
		}
	}
	return ""
}

func findSpan(spans []jaegerSpan, name string) jaegerSpan {
	for _, s := range spans {
		if s.OperationName == name {
			return s
		}
	}
	return jaegerSpan{}
}

// has is a trace that holds spans of these names.
func has(names ...string) func([]jaegerSpan) bool {
	return func(spans []jaegerSpan) bool {
		for _, n := range names {
			if findSpan(spans, n).OperationName == "" {
				return false
			}
		}
		return true
	}
}

// jaegerTrace polls Jaeger's query API for a trace until ready says it is
// all there.
func jaegerTrace(t *testing.T, queryURL, traceID string, ready func([]jaegerSpan) bool) []jaegerSpan {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get(fmt.Sprintf("%s/api/traces/%s", queryURL, traceID))
		if err == nil {
			var body struct {
				Data []struct {
					Spans     []jaegerSpan `json:"spans"`
					Processes map[string]struct {
						ServiceName string `json:"serviceName"`
					} `json:"processes"`
				} `json:"data"`
			}
			d := json.NewDecoder(resp.Body)
			d.UseNumber() // 403, not 403.0
			err = d.Decode(&body)
			resp.Body.Close()
			if err == nil && len(body.Data) > 0 && ready(body.Data[0].Spans) {
				spans := body.Data[0].Spans
				for i := range spans {
					spans[i].service = body.Data[0].Processes[spans[i].ProcessID].ServiceName
				}
				return spans
			}
			last = fmt.Sprintf("status %d, %d traces", resp.StatusCode, len(body.Data))
			if len(body.Data) > 0 {
				var names []string
				for _, sp := range body.Data[0].Spans {
					names = append(names, sp.OperationName)
				}
				last += fmt.Sprintf("; its spans %v", names)
			}
		} else {
			last = err.Error()
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("trace %s not in Jaeger after 30s (%s)", traceID, last)
	return nil
}
