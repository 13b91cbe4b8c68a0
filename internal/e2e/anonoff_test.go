package e2e

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"testing"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
	"github.com/kproxy/kproxy/internal/stages"
)

// TestAnonymousOff runs a second real apiserver with --anonymous-auth=false
// (the shared one allows anonymous requests) and checks that kproxy,
// handed that apiserver's flags, predicts its 401s for requests without
// credentials.
func TestAnonymousOff(t *testing.T) {
	ctx := context.Background()
	c, err := localcluster.Start(ctx, localcluster.Options{Log: os.Stderr, ExtraAPIServerFlags: []string{"--anonymous-auth=false"}})
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
}
