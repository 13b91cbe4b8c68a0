package e2e

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestShutdown: kproxy told to stop (SIGTERM) with --shutdown-delay
// answers /readyz 503 at once and serves on through the delay, so a load
// balancer takes it out before connections are refused (found by a
// probe: /readyz went 503 as the listener closed); then it drains, and a
// watch still open after the drain is recorded as cut by kproxy, not by
// its client (over HTTP/2 it had said "the client closed its
// connection").
func TestShutdown(t *testing.T) {
	capture := filepath.Join(t.TempDir(), "capture.jsonl")
	k := startKproxyProcess(t, processOptions{capture: capture, args: []string{"--shutdown-delay=3s", "--log-level=info"}})
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: k.pool}, ForceAttemptHTTP2: true}}
	get := func(ctx context.Context, path string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", "https://"+k.addr+path, nil)
		req.Header.Set("Authorization", "Bearer "+tokenOf("admin"))
		return c.Do(req)
	}
	watch, err := get(context.Background(), "/api/v1/namespaces/"+testNS+"/configmaps?watch=1&labelSelector=case%3Dt-shutdown")
	if err != nil || watch.StatusCode != 200 || watch.ProtoMajor != 2 {
		t.Fatalf("watch through kproxy: %v %v", watch, err)
	}
	watched := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, watch.Body); close(watched) }()

	if err := k.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		resp, err := http.Get("http://" + k.metricsAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz did not answer 503 within 2s of SIGTERM (last: %v %v)", resp, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Not ready, and still serving: a new connection's request is answered.
	fresh := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: k.pool}}}
	req, _ := http.NewRequest("GET", "https://"+k.addr+"/api/v1/namespaces/"+testNS+"/configmaps?limit=1", nil)
	req.Header.Set("Authorization", "Bearer "+tokenOf("admin"))
	if resp, err := fresh.Do(req); err != nil || resp.StatusCode != 200 {
		t.Errorf("a request on a new connection during --shutdown-delay: %v %v, want 200", resp, err)
	} else {
		resp.Body.Close()
	}
	select {
	case <-k.exited:
	case <-time.After(60 * time.Second):
		t.Fatal("kproxy did not exit within 60s of SIGTERM")
	}
	<-watched
	b, err := os.ReadFile(capture)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := parseCapture(b)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range recs {
		if r.Request.Verb != "watch" {
			continue
		}
		found = true
		if !strings.Contains(r.Actual.Error, "kproxy is shutting down") {
			t.Errorf("the watch kproxy cut at its shutdown: recorded error %q, want it to say kproxy was shutting down", r.Actual.Error)
		}
	}
	if !found {
		t.Errorf("no record of the watch in %d records", len(recs))
	}
	logs, _ := os.ReadFile(k.logPath)
	if !strings.Contains(string(logs), "--shutdown-delay") {
		t.Errorf("kproxy's log does not say it is stopping:\n%s", logs)
	}
}
