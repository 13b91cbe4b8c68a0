package telemetry

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	logspb "go.opentelemetry.io/proto/otlp/logs/v1"
	"google.golang.org/protobuf/proto"

	"github.com/kproxy/kproxy/internal/record"
)

// logsReceiver is an OTLP/HTTP logs endpoint decoding what it receives
// with the OTLP protos, as a collector does.
type logsReceiver struct {
	mu      sync.Mutex
	records []*logspb.LogRecord
	service string
}

func (r *logsReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	b, _ := io.ReadAll(req.Body)
	var msg collogs.ExportLogsServiceRequest
	if req.URL.Path != "/v1/logs" || proto.Unmarshal(b, &msg) != nil {
		http.Error(w, "not an OTLP logs export", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	for _, rl := range msg.ResourceLogs {
		for _, a := range rl.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				r.service = a.GetValue().GetStringValue()
			}
		}
		for _, sl := range rl.ScopeLogs {
			r.records = append(r.records, sl.LogRecords...)
		}
	}
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&collogs.ExportLogsServiceResponse{})
	_, _ = w.Write(out)
}

func TestRecordLogsChoice(t *testing.T) {
	for _, tc := range []struct {
		name    string
		on      bool
		env     map[string]string
		want    string // DescribeLogs contains
		wantErr string
	}{
		{"off by default, even with a traces endpoint", false, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "only with --otlp-logs", ""},
		{"the standard variable", false, map[string]string{"OTEL_LOGS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "to http://c:4318", ""},
		{"the flag", true, map[string]string{"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://logs:4318/v1/logs"}, "to http://logs:4318/v1/logs", ""},
		{"none", false, map[string]string{"OTEL_LOGS_EXPORTER": "none"}, "OTEL_LOGS_EXPORTER=none", ""},
		{"grpc is named with the fix", true, map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "", "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL=http/protobuf"},
		{"an unknown exporter", false, map[string]string{"OTEL_LOGS_EXPORTER": "console"}, "", `OTEL_LOGS_EXPORTER="console" is not supported`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			getenv := func(k string) string { return tc.env[k] }
			_, err := logsChoice(Options{}, LogsOptions{On: tc.on}, getenv)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := DescribeLogs(Options{}, LogsOptions{On: tc.on}, getenv); !strings.Contains(got, tc.want) {
				t.Errorf("DescribeLogs = %q, want it to say %q", got, tc.want)
			}
		})
	}
}

// TestRecordLogsExport exports records to an OTLP/HTTP receiver and reads
// them back: one log record each, the record's JSON as the body, its
// trace ID, its fields as attributes, a disagreement as a warning.
func TestRecordLogsExport(t *testing.T) {
	recv := &logsReceiver{}
	srv := httptest.NewServer(recv)
	defer srv.Close()
	ctx := context.Background()
	logs, err := SetupRecordLogs(ctx, Options{Endpoint: srv.URL, ServiceName: "kproxy-test"}, LogsOptions{On: true}, func(string) string { return "" })
	if err != nil || logs == nil {
		t.Fatalf("SetupRecordLogs: %v, %v", logs, err)
	}
	traceID := "4bf92f3577b34da6a3ce929d0e0e4736"
	recs := []*record.Record{
		{ID: "a", Start: time.Unix(1700000000, 0), TraceID: traceID, Replica: "r1",
			Request:   record.Request{Method: "GET", Path: "/api/v1/namespaces/default/pods/p", User: "dev", Verb: "get", Resource: "pods", Namespace: "default"},
			Predicted: record.Prediction{Status: 403, Stage: "authorization", Reason: "Forbidden"},
			Actual:    record.Actual{Status: 403, Reason: "Forbidden"}},
		{ID: "b", Start: time.Unix(1700000001, 0), TraceID: traceID,
			Request:   record.Request{Method: "POST", Path: "/api/v1/namespaces/default/configmaps", Verb: "create", Resource: "configmaps"},
			Predicted: record.Prediction{Status: 201},
			Actual:    record.Actual{Status: 422, Reason: "Invalid"}},
	}
	for _, r := range recs {
		logs.Write(r)
	}
	if err := logs.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	recv.mu.Lock()
	defer recv.mu.Unlock()
	if len(recv.records) != len(recs) || recv.service != "kproxy-test" {
		t.Fatalf("received %d log records from service %q, want %d from kproxy-test", len(recv.records), recv.service, len(recs))
	}
	for i, lr := range recv.records {
		var back record.Record
		if err := json.Unmarshal([]byte(lr.GetBody().GetStringValue()), &back); err != nil || back.ID != recs[i].ID {
			t.Errorf("log %d: body is not record %s: %v", i, recs[i].ID, err)
		}
		if got := hex.EncodeToString(lr.TraceId); got != traceID {
			t.Errorf("log %d: trace ID %q, want %q", i, got, traceID)
		}
		if lr.EventName != RecordLogEventName {
			t.Errorf("log %d: event name %q", i, lr.EventName)
		}
		attrs := map[string]string{}
		for _, a := range lr.Attributes {
			attrs[a.Key] = a.GetValue().GetStringValue()
			if a.GetValue().GetIntValue() != 0 {
				attrs[a.Key] = strings.TrimSpace(a.GetValue().String())
			}
		}
		if attrs["kproxy.record.id"] != recs[i].ID || attrs["url.path"] != recs[i].Request.Path {
			t.Errorf("log %d: attributes %v", i, attrs)
		}
	}
	if sev := recv.records[0].SeverityNumber; sev != logspb.SeverityNumber_SEVERITY_NUMBER_INFO {
		t.Errorf("an agreeing record's severity %v, want INFO", sev)
	}
	if sev := recv.records[1].SeverityNumber; sev != logspb.SeverityNumber_SEVERITY_NUMBER_WARN {
		t.Errorf("a disagreeing record's severity %v, want WARN", sev)
	}
}
