package e2e

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
	"github.com/kproxy/kproxy/internal/stages"
)

// TestAnonymousOffAndMaxInFlight runs a second real apiserver with
// --anonymous-auth=false and --enable-priority-and-fairness=false (the
// shared one has both on) and checks that kproxy, handed that apiserver's
// flags, predicts its 401s for requests without credentials and explains
// max-in-flight instead of APF.
func TestAnonymousOffAndMaxInFlight(t *testing.T) {
	ctx := context.Background()
	c, err := localcluster.Start(ctx, localcluster.Options{Log: os.Stderr,
		ExtraAPIServerFlags: []string{"--anonymous-auth=false", "--enable-priority-and-fairness=false", "--max-requests-inflight=123"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	if err := localcluster.GrantKproxy(ctx, adminClientFor(c), "kproxy"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kc, err := c.UpstreamKubeconfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	apiserver, _, err := stages.APIServerOptionsFromArgs(c.APIServerFlags)
	if err != nil {
		t.Fatal(err)
	}
	stream := record.NewStream()
	recs, _, cancel := stream.Subscribe(64)
	defer cancel()
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	s, err := serve.New(sctx, &serve.Options{UpstreamKubeconfig: kc, Listen: "127.0.0.1:0", Mode: "reverse",
		PKIDir: dir + "/pki", APIServer: apiserver, Stream: stream,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(sctx) }()
	defer func() { stop(); <-done }()
	r := route{name: "reverse", base: "https://" + s.Addr, tls: tlsTrusting(s.CA)}
	for i, path := range []string{"/api/v1/namespaces/default/pods", "/healthz", "/version"} {
		id := "anon-off-" + string(rune('a'+i))
		ex := do(t, r.client(nil), r.base, request{method: "GET", path: path, header: http.Header{"Audit-Id": {id}}})
		if ex.status != 401 {
			t.Fatalf("%s without credentials: the apiserver answered %d, want 401", path, ex.status)
		}
		rec := waitRecord(t, recs, id)
		p, a := rec.Predicted, rec.Actual
		if p.Status != a.Status || p.Stage != "authentication" || p.Reason != a.Reason || p.Message != a.Message {
			t.Errorf("%s: predicted %+v, actual %+v", path, p, a)
		}
		if an := stageNamed(rec, "authentication"); an.Explanation == "" {
			t.Errorf("%s: no authentication explanation", path)
		}
	}
	ex := do(t, r.client(nil), r.base, request{method: "GET", path: "/api/v1/namespaces", user: "admin", header: http.Header{"Audit-Id": {"max-in-flight"}}})
	if ex.status != 200 || ex.header.Get("X-Kubernetes-Pf-Flowschema-Uid") != "" {
		t.Fatalf("with APF off: status %d, APF header %q", ex.status, ex.header.Get("X-Kubernetes-Pf-Flowschema-Uid"))
	}
	fc := stageNamed(waitRecord(t, recs, "max-in-flight"), "flowcontrol")
	if fc.Outcome != record.Pass || !strings.Contains(fc.Explanation, "--max-requests-inflight=123") {
		t.Errorf("flowcontrol with APF off: %s %q", fc.Outcome, fc.Explanation)
	}
}
