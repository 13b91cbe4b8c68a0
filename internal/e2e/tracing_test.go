package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/telemetry"
)

// TestTracing sends a request through kproxy exporting to a real Jaeger
// and reads the trace back from Jaeger's query API: the server span, the
// replay span with one child per stage, and the upstream span. It runs
// once per OTLP protocol.
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
			k := startKproxy(t, kproxyOptions{stream: stream, telemetry: telemetry.Options{
				Endpoint: proto.endpoint, Protocol: proto.name, ServiceName: "kproxy-e2e"}})
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
			var rec *record.Record
			select {
			case rec = <-recs:
			case <-time.After(30 * time.Second):
				t.Fatal("no record")
			}
			if rec.TraceID != proto.traceID {
				t.Errorf("trace %s does not continue the incoming traceparent", rec.TraceID)
			}
			// A write: the write path's stages, each admission plugin its
			// own span under its phase.
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
			k.stop() // flushes spans
			wspans := jaegerSpans(t, j.QueryURL, wrec.TraceID)
			// The storage stage reads the written key straight from etcd.
			for _, w := range append([]string{"admission NamespaceLifecycle", "admission ResourceQuota", "admission ValidatingAdmissionPolicy", "etcd get"}, contractStages...) {
				if !slices.Contains(wspans, w) {
					t.Errorf("write trace %s lacks span %q; has %v", wrec.TraceID, w, wspans)
				}
			}
			spans := jaegerSpans(t, j.QueryURL, rec.TraceID)
			want := append([]string{"list configmaps", "replay", "upstream", "authenticator token-file",
				"authorizer kubernetes.io/system-privileged-group", "authorizer node", "authorizer rbac",
				"etcd3 store list", "etcd range" /* the read, through the apiserver's etcd3 store, and etcd's answer with its latency */}, contractStages...)
			for _, w := range want {
				if !slices.Contains(spans, w) {
					t.Errorf("trace %s lacks span %q; has %v", rec.TraceID, w, spans)
				}
			}
		})
	}
}

// jaegerSpans polls Jaeger's query API for a trace's operation names.
func jaegerSpans(t *testing.T, queryURL, traceID string) []string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get(fmt.Sprintf("%s/api/traces/%s", queryURL, traceID))
		if err == nil {
			var body struct {
				Data []struct {
					Spans []struct {
						OperationName string `json:"operationName"`
					} `json:"spans"`
				} `json:"data"`
			}
			err = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			if err == nil && len(body.Data) > 0 && len(body.Data[0].Spans) >= 18 {
				var names []string
				for _, s := range body.Data[0].Spans {
					names = append(names, s.OperationName)
				}
				return names
			}
			last = fmt.Sprintf("status %d, %d traces", resp.StatusCode, len(body.Data))
		} else {
			last = err.Error()
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("trace %s not in Jaeger after 30s (%s)", traceID, last)
	return nil
}
