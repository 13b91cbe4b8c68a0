package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
)

// TestFaultsHeal breaks the control plane under kproxy, on a cluster of
// its own, and checks that kproxy fails cleanly and heals: started while
// the apiserver is down (predictions unknown, then right once it is up),
// the apiserver killed mid-watch (the watch ends, no hang), requests
// during the outage (a clean 502, promptly), the apiserver restarted
// (traffic and predictions recover), etcd unreachable and back (the
// apiserver's own errors pass through, then it heals). Throughout, every
// request is recorded exactly once, as a whole line.
func TestFaultsHeal(t *testing.T) {
	ctx := context.Background()
	c, err := localcluster.Start(ctx, localcluster.Options{Log: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	if err := localcluster.GrantKproxy(ctx, adminClientFor(c), "kproxy"); err != nil {
		t.Fatal(err)
	}
	// At start: kproxy comes up while the apiserver is down.
	c.KillAPIServer()
	capture := filepath.Join(t.TempDir(), "capture.jsonl")
	k := startKproxy(t, kproxyOptions{cluster: c, capture: capture, set: func(o *serve.Options) { o.SyncTimeout = 2 * time.Second }})
	defer k.stop()

	h1 := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: k.ca}}}
	h2 := &http.Client{Transport: &http2.Transport{TLSClientConfig: &tls.Config{RootCAs: k.ca}}}
	sent := 0
	do := func(client *http.Client, method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, "https://"+k.addr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+localcluster.TokenOf("admin"))
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		sent++
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v (after %v)", method, path, err, time.Since(start))
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}

	// The outage: a clean 502 naming the upstream, promptly.
	start := time.Now()
	if code, body := do(h1, "GET", "/api/v1/namespaces/default/configmaps", ""); code != http.StatusBadGateway || !strings.Contains(body, "kproxy") {
		t.Errorf("with the apiserver down: %d %q, want a 502 from kproxy", code, body)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("the 502 took %v", d)
	}

	// The apiserver comes up: traffic and, once the replay's informers
	// have synced, predictions recover.
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	heal := func(what string) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
			code, _ := do(h1, "GET", "/api/v1/namespaces/default/configmaps", "")
			return code == http.StatusOK, nil
		})
		if err != nil {
			t.Fatalf("%s: kproxy did not heal: %v", what, err)
		}
	}
	heal("apiserver started after kproxy")

	// Mid-watch: a watch through kproxy (HTTP/2) sees an event, then the
	// apiserver dies; the watch must end.
	wreq, _ := http.NewRequest("GET", "https://"+k.addr+"/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=600", nil)
	wreq.Header.Set("Authorization", "Bearer "+localcluster.TokenOf("admin"))
	sent++
	wresp, err := h2.Do(wreq)
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan string, 16)
	watchEnded := make(chan struct{})
	go func() {
		defer close(watchEnded)
		sc := bufio.NewScanner(wresp.Body)
		for sc.Scan() {
			var ev struct{ Type string }
			_ = json.Unmarshal(sc.Bytes(), &ev)
			events <- ev.Type
		}
	}()
	if code, body := do(h1, "POST", "/api/v1/namespaces/default/configmaps", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"fault-1"}}`); code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	select {
	case typ := <-events:
		if typ != "ADDED" {
			t.Errorf("first watch event %q, want ADDED", typ)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no watch event through kproxy")
	}
	c.KillAPIServer()
	select {
	case <-watchEnded:
	case <-time.After(30 * time.Second):
		t.Fatal("the watch through kproxy did not end when the apiserver died")
	}
	wresp.Body.Close()
	if code, _ := do(h1, "POST", "/api/v1/namespaces/default/configmaps", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"fault-2"}}`); code != http.StatusBadGateway {
		t.Errorf("a write with the apiserver down: %d, want 502", code)
	}
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	heal("apiserver restarted")
	if code, body := do(h1, "POST", "/api/v1/namespaces/default/configmaps", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"fault-3"}}`); code != http.StatusCreated {
		t.Errorf("a write after the restart: %d %s", code, body)
	}

	// etcd unreachable: the apiserver answers errors of its own, which
	// kproxy passes on; etcd back: it heals.
	// (A write then waits in the apiserver for etcd, up to its own
	// request timeout, as it would without kproxy: the client gives up
	// first, and kproxy must not keep anything for it.)
	c.KillEtcd()
	short := &http.Client{Timeout: 5 * time.Second, Transport: h1.Transport}
	req, _ := http.NewRequest("POST", "https://"+k.addr+"/api/v1/namespaces/default/configmaps", strings.NewReader(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"fault-etcd"}}`))
	req.Header.Set("Authorization", "Bearer "+localcluster.TokenOf("admin"))
	req.Header.Set("Content-Type", "application/json")
	sent++
	if resp, err := short.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode < 500 {
			t.Errorf("a write with etcd down: %d, want the apiserver's 5xx (or no answer yet)", resp.StatusCode)
		}
	}
	if err := c.StartEtcd(ctx); err != nil {
		t.Fatal(err)
	}
	heal("etcd restarted")
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(context.Context) (bool, error) {
		code, _ := do(h1, "POST", "/api/v1/namespaces/default/configmaps", fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"fault-4-%d"}}`, sent))
		return code == http.StatusCreated, nil
	})
	if err != nil {
		t.Errorf("writes did not recover after etcd came back: %v", err)
	}

	// Predictions are right again: a read whose answer kproxy must know.
	attempt := 0
	var last *record.Record
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(context.Context) (bool, error) {
		attempt++
		id := fmt.Sprintf("fault-read-%d", attempt)
		req, _ := http.NewRequest("GET", "https://"+k.addr+"/api/v1/namespaces/default/configmaps/fault-3", nil)
		req.Header.Set("Authorization", "Bearer "+localcluster.TokenOf("admin"))
		req.Header.Set("Audit-Id", id)
		sent++
		resp, err := h1.Do(req)
		if err != nil {
			return false, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		last = nil
		_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			last = recordByAuditID(t, capture, id)
			return last != nil, nil
		})
		return last != nil && last.Predicted.Status == http.StatusOK && last.Actual.Status == http.StatusOK, nil
	})
	if err != nil {
		t.Errorf("predictions did not recover: the last read's record: %+v", last)
	}

	k.stop()
	b, err := os.ReadFile(capture)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	ids := map[string]bool{}
	for i, l := range lines {
		var r record.Record
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("capture line %d is not a whole record: %v", i+1, err)
		}
		if ids[r.ID] {
			t.Errorf("record %s twice", r.ID)
		}
		ids[r.ID] = true
		if r.Actual.Status == http.StatusBadGateway && r.Predicted.Stage != record.StageUnknown && r.Predicted.Status != http.StatusBadGateway {
			// kproxy's own 502 is not the apiserver's answer: a prediction
			// for it is fine, but it must not claim the apiserver decided.
			t.Logf("record %s: kproxy answered 502, predicted %d at %s", r.ID, r.Predicted.Status, r.Predicted.Stage)
		}
	}
	if len(ids) != sent {
		t.Errorf("%d records for %d requests", len(ids), sent)
	}
}

// recordByAuditID is the capture's record of that Audit-ID (nil: none yet).
func recordByAuditID(t *testing.T, path, id string) *record.Record {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, id) {
			continue
		}
		var r record.Record
		if json.Unmarshal([]byte(l), &r) == nil && r.Actual.AuditID == id {
			return &r
		}
	}
	return nil
}
