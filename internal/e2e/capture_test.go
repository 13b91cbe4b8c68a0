package e2e

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/record"
)

// contractStages are the stage names of contract.md, in order.
var contractStages = []string{"authentication", "impersonation", "flowcontrol", "authorization", "decode",
	"mutating-admission", "validation", "validating-admission", "storage"}

// TestCapture checks that capture records follow the contract and that no
// secret (a bearer token, a Secret's values) reaches the capture file.
func TestCapture(t *testing.T) {
	capture := filepath.Join(t.TempDir(), "capture.jsonl")
	// With --capture-bodies: the bodies are recorded, their secrets not.
	k := startKproxy(t, kproxyOptions{capture: capture, captureBodies: true})
	r := reverseRoute(k)
	const secretValue = "hunter2-very-secret-value"
	secretB64 := base64.StdEncoding.EncodeToString([]byte(secretValue))
	secret := `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"t-capture"},"data":{"password":"` + secretB64 + `"},"stringData":{"other":"` + secretValue + `"}}`
	reqs := []request{
		{method: "POST", path: "/api/v1/namespaces/" + testNS + "/secrets", body: secret, user: "admin"},
		{method: "GET", path: "/api/v1/namespaces/" + testNS + "/secrets/t-capture", user: "admin"},
		{method: "PATCH", path: "/api/v1/namespaces/" + testNS + "/secrets/t-capture", user: "admin", contentType: "application/json-patch+json",
			body: `[{"op":"replace","path":"/data/password","value":"` + secretB64 + `"}]`},
		{method: "POST", path: "/api/v1/namespaces/" + testNS + "/configmaps?dryRun=All", user: "admin", contentType: "application/yaml",
			body:   "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: t-capture-cm\ndata:\n  visible: kept\n",
			header: http.Header{"Impersonate-User": {"alice"}, "Impersonate-Group": {"devs"}}},
		{method: "POST", path: "/apis/authentication.k8s.io/v1/tokenreviews", user: "admin",
			body: `{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":"` + tokenOf("alice") + `"}}`},
		{method: "GET", path: "/api/v1/namespaces/" + testNS + "/secrets", user: "alice"},
		{method: "GET", path: "/api/v1/namespaces/" + testNS + "/configmaps?access_token=" + tokenOf("admin"), user: "bad"},
		{method: "DELETE", path: "/api/v1/namespaces/" + testNS + "/secrets/t-capture", user: "admin"},
	}
	for _, q := range reqs {
		do(t, r.client(nil), r.base, q)
	}
	k.stop() // flushes the capture
	recs := readCapture(t, capture, len(reqs))

	raw, err := os.ReadFile(capture)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{secretValue, secretB64, tokenOf("admin"), tokenOf("alice"), tokenOf("bad")} {
		if bytes.Contains(raw, []byte(s)) {
			t.Errorf("capture contains a secret: %q", s)
		}
	}

	checkRequiredFields(t, raw)
	hex32 := regexp.MustCompile(`^[0-9a-f]{32}$`)
	outcomes := []string{record.Pass, record.Reject, record.Skip, record.Error}
	for _, rec := range recs {
		if rec.ID == "" || rec.Start.IsZero() || !hex32.MatchString(rec.TraceID) {
			t.Errorf("record %+v: id, start and a 32-hex traceID are required", rec)
		}
		if rec.Actual.AuditID == "" {
			t.Errorf("record %s: no actual.auditID", rec.ID)
		}
		var names []string
		for _, s := range rec.Stages {
			names = append(names, s.Name)
			if !slices.Contains(outcomes, s.Outcome) {
				t.Errorf("record %s: stage %s outcome %q", rec.ID, s.Name, s.Outcome)
			}
		}
		if !slices.Equal(names, contractStages) {
			t.Errorf("record %s: stages %v, want the nine contract stages in order", rec.ID, names)
		}
		// Authentication and authorization are replayed: their
		// rejections are predicted exactly. Resource reads and writes are
		// replayed through the resource handler and predicted exactly too;
		// of non-resource requests only discovery and /version are
		// replayed, the rest (health, OpenAPI) is an honest unknown.
		switch rec.Actual.Status {
		case 401, 403:
			want := record.Prediction{Status: rec.Actual.Status, Stage: map[int]string{401: "authentication", 403: "authorization"}[rec.Actual.Status],
				Reason: rec.Actual.Reason, Message: rec.Actual.Message, FlowSchema: rec.Actual.FlowSchema, PriorityLevel: rec.Actual.PriorityLevel}
			if rec.Actual.Status == 401 {
				want.FlowSchema, want.PriorityLevel = "", "" // rejected before APF
			}
			if rec.Predicted != want {
				t.Errorf("record %s: predicted %+v, actual %+v", rec.ID, rec.Predicted, rec.Actual)
			}
		default:
			p, a := rec.Predicted, rec.Actual
			switch {
			case rec.Request.Resource == "" && p.Stage == record.StageUnknown:
				if p.Status != 0 || !strings.Contains(p.Message, "not modelled") {
					t.Errorf("record %s: predicted %+v, want unknown with a reason", rec.ID, p)
				}
			case p.Status != a.Status || p.Reason != a.Reason || !record.SameMessage(p.Message, a.Message):
				t.Errorf("record %s (%s %s): predicted %+v, actual %+v", rec.ID, rec.Request.Method, rec.Request.Path, p, a)
			}
		}
		if rec.Latency.TotalNs <= 0 || rec.Latency.UpstreamNs <= 0 {
			t.Errorf("record %s: latency %+v", rec.ID, rec.Latency)
		}
	}
	byPath := func(method, path string) *record.Record {
		for i := range recs {
			if recs[i].Request.Method == method && recs[i].Request.Path == path {
				return &recs[i]
			}
		}
		t.Fatalf("no record for %s %s", method, path)
		return nil
	}
	created := byPath("POST", "/api/v1/namespaces/"+testNS+"/secrets")
	if created.Actual.Status != 201 || created.Request.Verb != "create" || created.Request.Resource != "secrets" || created.Request.Namespace != testNS {
		t.Errorf("create record: %+v", created.Request)
	}
	denied := byPath("GET", "/api/v1/namespaces/"+testNS+"/secrets")
	if denied.Actual.Status != 403 || denied.Actual.Reason != "Forbidden" || !strings.Contains(denied.Actual.Message, `User "alice" cannot list resource "secrets"`) {
		t.Errorf("denied record actual: %+v", denied.Actual)
	}
	if denied.Actual.FlowSchemaUID == "" {
		t.Errorf("denied record has no APF flow schema UID: %+v", denied.Actual)
	}
	if !strings.Contains(string(created.Request.Body), `"password":"REDACTED"`) || !strings.Contains(string(created.Request.Body), `"name":"t-capture"`) {
		t.Errorf("the Secret's body: %s (want it, its values redacted)", created.Request.Body)
	}
	if h := created.Request.Headers["Authorization"]; len(h) != 1 || h[0] != "Bearer "+record.Redacted {
		t.Errorf("the create's Authorization header in the record: %q, want the scheme and %s", h, record.Redacted)
	}
	if created.Actual.Headers["Audit-Id"] == nil {
		t.Errorf("the create's response headers lack Audit-Id: %v", created.Actual.Headers)
	}
	if patched := byPath("PATCH", "/api/v1/namespaces/"+testNS+"/secrets/t-capture"); !strings.Contains(string(patched.Request.Body), `"value":"REDACTED"`) {
		t.Errorf("the JSON patch of a Secret: %s", patched.Request.Body)
	}
	cm := byPath("POST", "/api/v1/namespaces/"+testNS+"/configmaps")
	if !strings.Contains(string(cm.Request.Body), `"visible":"kept"`) || cm.Request.Impersonate == nil ||
		cm.Request.Impersonate.User != "alice" || len(cm.Request.Impersonate.Groups) != 1 {
		t.Errorf("a YAML ConfigMap, impersonating: body %s, impersonate %+v", cm.Request.Body, cm.Request.Impersonate)
	}
	if get := byPath("GET", "/api/v1/namespaces/"+testNS+"/secrets/t-capture"); get.Request.Body != nil {
		t.Errorf("a read has a body: %s", get.Request.Body)
	}
	unauth := byPath("GET", "/api/v1/namespaces/"+testNS+"/configmaps")
	if unauth.Actual.Status != 401 || !strings.Contains(unauth.Request.Query, record.Redacted) {
		t.Errorf("401 record: actual %+v query %q", unauth.Actual, unauth.Request.Query)
	}
}

func readCapture(t *testing.T, path string, want int) []record.Record {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		var recs []record.Record
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			var r record.Record
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatalf("capture line is not a record: %v\n%s", err, sc.Text())
			}
			recs = append(recs, r)
		}
		f.Close()
		if len(recs) >= want || time.Now().After(deadline) {
			if len(recs) != want {
				t.Fatalf("capture has %d records, want %d", len(recs), want)
			}
			return recs
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// required lists the contract's required fields, by object.
var required = map[string][]string{
	"":          {"id", "start", "request", "predicted", "actual", "stages", "latency", "traceID"},
	"request":   {"method", "path", "query", "user", "groups", "verb", "apiGroup", "apiVersion", "resource", "subresource", "namespace", "name"},
	"predicted": {"status", "stage", "reason", "message"},
	"actual":    {"status", "reason", "message", "auditID", "flowSchema", "priorityLevel"},
	"latency":   {"totalNs", "upstreamNs", "replayNs"},
	"stage":     {"name", "outcome", "durationNs", "explanation"},
}

// checkRequiredFields reads the capture as raw JSON, so a field the Go
// struct would silently zero-fill is caught when it is missing.
func checkRequiredFields(t *testing.T, raw []byte) {
	t.Helper()
	for i, line := range bytes.Split(bytes.TrimSpace(raw), []byte("\n")) {
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		has := func(obj map[string]any, where string) {
			for _, k := range required[where] {
				if _, ok := obj[k]; !ok {
					t.Errorf("line %d: %q lacks required field %q", i, where, k)
				}
			}
		}
		has(m, "")
		for _, k := range []string{"request", "predicted", "actual", "latency"} {
			obj, _ := m[k].(map[string]any)
			has(obj, k)
		}
		stages, _ := m["stages"].([]any)
		for _, s := range stages {
			obj, _ := s.(map[string]any)
			has(obj, "stage")
		}
		if _, err := time.Parse(time.RFC3339Nano, m["start"].(string)); err != nil {
			t.Errorf("line %d: start %v is not RFC3339Nano", i, m["start"])
		}
	}
}
