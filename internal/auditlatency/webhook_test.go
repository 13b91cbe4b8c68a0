package auditlatency

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/servertrace"
)

// post sends body to h as the apiserver's audit webhook backend does.
func post(h http.Handler, body []byte) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/audit?timeout=30s", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, */*")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// runWebhook runs w until the test ends.
func runWebhook(t *testing.T, w *Webhook) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func TestWebhookRealBatch(t *testing.T) {
	body, err := os.ReadFile(webhookBatch)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan servertrace.Observation, 16)
	w := NewWebhook(func(o servertrace.Observation) { got <- o }, WebhookOptions{})
	runWebhook(t, w)
	rec := post(w, body)
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	want := map[string]string{
		"90b6069c-df9b-4687-b66c-0ec0d963187b": "858ms: 703ms in validating webhooks, 151ms in mutating webhooks, 2.9ms not itemised",
		"49febd1f-6eee-441a-bae7-e2a9d02fbec8": "858ms: 702ms in validating webhooks, 154ms in mutating webhooks, 2.7ms not itemised",
	}
	for range want {
		select {
		case o := <-got:
			s, ok := want[o.AuditID]
			if !ok {
				t.Fatalf("observation for %q, want one of %v", o.AuditID, want)
			}
			delete(want, o.AuditID)
			if o.Server.Source != record.ServerFromAudit || o.Server.Summary != s || o.TraceID != "" || o.Links != nil {
				t.Errorf("%s: %+v, want summary %q", o.AuditID, o, s)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no observation for %v", want)
		}
	}
	if c := w.Counts(); c != (Counts{Events: 7, Observations: 2}) {
		t.Errorf("counts %+v, want 7 events, 2 observations", c)
	}
}

func TestWebhookRefuses(t *testing.T) {
	body, err := os.ReadFile(webhookBatch)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		method string
		body   []byte
		max    int64
		status int
		says   string
	}{
		{name: "not JSON", body: []byte("hello"), status: http.StatusBadRequest, says: "not an audit.k8s.io/v1 EventList"},
		{name: "cut short", body: body[:len(body)/2], status: http.StatusBadRequest, says: "not an audit.k8s.io/v1 EventList"},
		{name: "another kind", body: []byte(`{"apiVersion":"audit.k8s.io/v1","kind":"Policy","rules":[{"level":"Metadata"}]}`),
			status: http.StatusBadRequest, says: "Kind=Policy, want an audit.k8s.io/v1 EventList"},
		{name: "no kind", body: []byte(`{"items":[]}`), status: http.StatusBadRequest, says: "Kind"},
		{name: "oversize", body: body, max: 1 << 10, status: http.StatusRequestEntityTooLarge, says: "--audit-webhook-truncate-enabled"},
		{name: "GET", method: http.MethodGet, status: http.StatusMethodNotAllowed, says: "--audit-webhook-config-file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			offered := 0
			w := NewWebhook(func(servertrace.Observation) { offered++ }, WebhookOptions{MaxBodyBytes: c.max})
			var rec *httptest.ResponseRecorder
			if c.method == "" {
				rec = post(w, c.body)
			} else {
				rec = httptest.NewRecorder()
				w.ServeHTTP(rec, httptest.NewRequest(c.method, "/", nil))
			}
			if rec.Code != c.status || !strings.Contains(rec.Body.String(), c.says) {
				t.Errorf("status %d %q, want %d saying %q", rec.Code, rec.Body, c.status, c.says)
			}
			if n := w.Counts(); n.Observations != 0 || (c.method == "" && n.Skipped != 1) {
				t.Errorf("counts %+v, want one skipped body", n)
			}
		})
	}
}

// TestWebhookNeverWaits: with the joiner not taking observations, the
// apiserver is still answered at once; what does not fit is counted.
func TestWebhookNeverWaits(t *testing.T) {
	body, err := os.ReadFile(webhookBatch)
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	w := NewWebhook(func(servertrace.Observation) { <-release }, WebhookOptions{Queue: 1})
	runWebhook(t, w) // Run takes the first observation and blocks in offer
	t.Cleanup(func() { close(release) })
	for range 3 {
		if rec := post(w, body); rec.Code != http.StatusOK {
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
	}
	c := w.Counts()
	if c.Events != 21 || c.Observations+c.Dropped != 6 || c.Observations > 2 {
		t.Errorf("counts %+v: want 21 events with 6 observations, at most 2 taken (one offered, one queued), the others dropped", c)
	}
}
