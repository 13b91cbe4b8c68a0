package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kproxy/kproxy/internal/auditlatency"
	"github.com/kproxy/kproxy/internal/flowview"
	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
)

// The validating webhook of TestAuditLatency sleeps past the apiserver's
// 500ms threshold: only then does it annotate the audit event.
const (
	auditSlowWebhook     = "slow.auditlatency.kproxy.test"
	auditSlowWebhookTime = auditlatency.Threshold + 200*time.Millisecond
	auditLatencyNS       = "audit-latency"
)

// TestAuditLatency runs a cluster of its own whose apiserver audits every
// request at level Metadata to both its backends: a JSON audit log, and
// an audit webhook pointed at kproxy's --audit-webhook-listen. Through a
// kproxy reading each in turn, a create held up by a validating webhook
// that sleeps 700ms gets server.source "audit", with most of its time in
// the validating webhooks layer; a fast read is written at once, without
// waiting for annotations the apiserver never writes for it.
func TestAuditLatency(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	ports, err := localcluster.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	hook := fmt.Sprintf("127.0.0.1:%d", ports[0])
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The webhook backend's kubeconfig names kproxy's address, plain HTTP
	// on loopback.
	hookConfig := filepath.Join(dir, "audit-webhook.kubeconfig")
	if err := localcluster.WriteKubeconfig(hookConfig, "http://"+hook+"/audit", nil, ""); err != nil {
		t.Fatal(err)
	}
	auditLog := filepath.Join(dir, "audit.log")
	c, err := localcluster.Start(ctx, localcluster.Options{Log: os.Stderr, ExtraAPIServerFlags: []string{
		"--audit-policy-file=" + policy,
		"--audit-log-path=" + auditLog, "--audit-log-format=json",
		"--audit-webhook-config-file=" + hookConfig,
		// Batches every 250ms rather than every 30s, within the time a
		// record waits; and, while kproxy is not listening yet, retries
		// after 100ms rather than 10s.
		"--audit-webhook-batch-max-wait=250ms", "--audit-webhook-initial-backoff=100ms",
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	admin := kubernetes.NewForConfigOrDie(c.UserConfig("admin"))
	if err := localcluster.GrantKproxy(ctx, admin, "kproxy"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, namespace(auditLatencyNS), createOpts); err != nil {
		t.Fatal(err)
	}
	registerSlowWebhook(t, admin, auditSlowWebhook, auditLatencyNS, auditSlowWebhookTime)

	for _, src := range []struct {
		name  string
		set   func(*serve.Options)
		check func(*testing.T, *serve.Server)
	}{
		{"audit log", func(o *serve.Options) { o.AuditLogFollow = auditLog }, nil},
		{"audit webhook", func(o *serve.Options) { o.AuditWebhookListen = hook }, func(t *testing.T, s *serve.Server) {
			if s.AuditWebhookURL != "http://"+hook {
				t.Fatalf("audit webhook on %s, want http://%s", s.AuditWebhookURL, hook)
			}
		}},
	} {
		t.Run(src.name, func(t *testing.T) {
			stream := record.NewStream()
			recs, _, unsubscribe := stream.Subscribe(256)
			defer unsubscribe()
			s, stop := startAuditKproxy(t, c, stream, src.set)
			defer stop()
			if src.check != nil {
				src.check(t, s)
			}
			r := route{name: "reverse", base: "https://" + s.Addr, tls: tlsTrusting(s.CA)}
			id := "audit-latency-" + strings.ReplaceAll(src.name, " ", "-")
			cmPath := "/api/v1/namespaces/" + auditLatencyNS + "/configmaps"

			// A fast read first: written at once.
			sent := time.Now()
			ex := do(t, r.client(nil), r.base, request{method: "GET", path: cmPath, user: "admin", header: http.Header{"Audit-Id": {id + "-read"}}})
			if ex.status != http.StatusOK {
				t.Fatalf("list: %d %s", ex.status, ex.body)
			}
			read := waitRecord(t, recs, id+"-read")
			if read.Server != nil || time.Since(sent) > 3*time.Second {
				t.Errorf("a fast read waited %v (server %+v): it cannot get audit latency annotations", time.Since(sent), read.Server)
			}

			ex = do(t, r.client(nil), r.base, request{method: "POST", path: cmPath, user: "admin", header: http.Header{"Audit-Id": {id}},
				body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"` + id + `"},"data":{"a":"b"}}`})
			if ex.status != http.StatusCreated {
				t.Fatalf("create: %d %s", ex.status, ex.body)
			}
			checkAuditServer(t, waitRecord(t, recs, id))
		})
	}
}

// checkAuditServer checks the record of the slow create.
func checkAuditServer(t *testing.T, rec *record.Record) {
	t.Helper()
	s := rec.Server
	if s == nil {
		t.Fatalf("the slow create's record has no server account (latency %+v)", rec.Latency)
	}
	if s.Source != record.ServerFromAudit || s.TraceID != "" || rec.Latency.ServerNs != s.TotalNs {
		t.Errorf("server: source %q, trace %q, total %d, latency.serverNs %d", s.Source, s.TraceID, s.TotalNs, rec.Latency.ServerNs)
	}
	if s.TotalNs < int64(auditSlowWebhookTime) || s.TotalNs > rec.Latency.UpstreamNs {
		t.Errorf("server total %v: want at least the webhook's %v and at most kproxy's upstream time %v",
			time.Duration(s.TotalNs), auditSlowWebhookTime, time.Duration(rec.Latency.UpstreamNs))
	}
	var self int64
	top := record.ServerLayer{}
	for _, l := range s.Layers {
		self += l.SelfNs
		if l.SelfNs > top.SelfNs {
			top = l
		}
		if l.OffsetNs != 0 || l.Depth != 0 {
			t.Errorf("layer %q has an offset or depth, which audit annotations do not give", l.Name)
		}
	}
	if self != s.TotalNs {
		t.Errorf("self times add up to %v, want the total %v", time.Duration(self), time.Duration(s.TotalNs))
	}
	if top.Name != "validating webhooks" || top.Stage != record.StageValidatingAdmission ||
		top.SelfNs < int64(auditSlowWebhookTime) || top.SelfNs*2 < s.TotalNs {
		t.Errorf("the biggest layer is %q (%s, %v of %v), want validating webhooks over %v and most of the time",
			top.Name, top.Stage, time.Duration(top.SelfNs), time.Duration(s.TotalNs), auditSlowWebhookTime)
	}
	if want := flowview.Duration(s.TotalNs) + ": " + flowview.Duration(top.SelfNs) + " in validating webhooks"; !strings.HasPrefix(s.Summary, want) {
		t.Errorf("summary %q, want it to start %q", s.Summary, want)
	}
	stages := map[string]bool{}
	for _, l := range s.Layers {
		stages[l.Stage] = true
	}
	for _, st := range []string{record.StageAuthentication, record.StageAuthorization, record.LayerSerialization, record.LayerOther} {
		if !stages[st] {
			t.Errorf("no %s layer; layers: %+v", st, s.Layers)
		}
	}
	t.Logf("%s: %s", rec.Actual.AuditID, s.Summary)
	if t.Failed() {
		t.Logf("server account: %+v", *s)
	}
}

// startAuditKproxy starts kproxy in front of c with set's audit source.
func startAuditKproxy(t *testing.T, c *localcluster.Cluster, stream *record.Stream, set func(*serve.Options)) (*serve.Server, func()) {
	t.Helper()
	k := startKproxy(t, kproxyOptions{cluster: c, stream: stream, set: func(o *serve.Options) {
		o.ServerTraceWait = 10 * time.Second
		set(o)
	}})
	return k.srv, k.stop
}
