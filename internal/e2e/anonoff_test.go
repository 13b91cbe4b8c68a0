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

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// TestNonDefaultFlags runs a second real apiserver with
// --anonymous-auth=false, --enable-priority-and-fairness=false (the shared
// one has both on) and a --runtime-config that serves a beta version and
// stops serving a resource, and checks that kproxy, handed that
// apiserver's flags, predicts its 401s for requests without credentials,
// explains max-in-flight instead of APF, and serves what it serves.
func TestNonDefaultFlags(t *testing.T) {
	ctx := context.Background()
	c, err := localcluster.Start(ctx, localcluster.Options{Log: os.Stderr,
		ExtraAPIServerFlags: []string{"--anonymous-auth=false", "--enable-priority-and-fairness=false", "--max-requests-inflight=123",
			"--runtime-config=admissionregistration.k8s.io/v1beta1=true,apps/v1/daemonsets=false"}})
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
	apiserver, _, err := apiserver.OptionsFromArgs(c.APIServerFlags)
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
		if p.Status != a.Status || p.Stage != record.StageAuthentication || p.Reason != a.Reason || p.Message != a.Message {
			t.Errorf("%s: predicted %+v, actual %+v", path, p, a)
		}
		if an := stageNamed(rec, record.StageAuthentication); an.Explanation == "" {
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
	// --runtime-config: a beta version served, a resource not served, as
	// the apiserver merges them; the shared apiserver answers 404 and 200
	// to the same (the storage corpus).
	for _, c := range []struct {
		id, method, path, body string
		status                 int
	}{
		{"rc-beta", "GET", "/apis/admissionregistration.k8s.io/v1beta1/mutatingadmissionpolicies", "", 200},
		{"rc-beta-create", "POST", "/apis/admissionregistration.k8s.io/v1beta1/mutatingadmissionpolicies?dryRun=All",
			`{"apiVersion":"admissionregistration.k8s.io/v1beta1","kind":"MutatingAdmissionPolicy","metadata":{"name":"p"},"spec":{"matchConstraints":{"resourceRules":[{"apiGroups":[""],"apiVersions":["v1"],"operations":["CREATE"],"resources":["configmaps"]}]},"reinvocationPolicy":"Never","mutations":[{"patchType":"ApplyConfiguration","applyConfiguration":{"expression":"Object{}"}}]}}`, 201},
		// Enabled, but past its removal release: not served either.
		{"rc-removed", "GET", "/apis/admissionregistration.k8s.io/v1beta1/validatingadmissionpolicies", "", 404},
		{"rc-off", "GET", "/apis/apps/v1/namespaces/default/daemonsets", "", 404},
		{"rc-off-create", "POST", "/apis/apps/v1/namespaces/default/daemonsets?dryRun=All", `{"apiVersion":"apps/v1","kind":"DaemonSet","metadata":{"name":"d"}}`, 404},
	} {
		ex := do(t, r.client(nil), r.base, request{method: c.method, path: c.path, body: c.body, user: "admin", header: http.Header{"Audit-Id": {c.id}}})
		if ex.status != c.status {
			t.Fatalf("%s %s: the apiserver answered %d, want %d: %s", c.method, c.path, ex.status, c.status, ex.body)
		}
		rec := waitRecord(t, recs, c.id)
		if p, a := rec.Predicted, rec.Actual; p.Status != a.Status || p.Reason != a.Reason || p.Message != a.Message {
			t.Errorf("%s %s with --runtime-config: predicted %+v, actual %+v", c.method, c.path, p, a)
		}
	}
}
