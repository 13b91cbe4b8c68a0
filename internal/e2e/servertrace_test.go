package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
	"github.com/kproxy/kproxy/internal/telemetry"
)

// slowWebhook is the validating webhook of TestServerTrace: it sleeps
// 300 ms before it allows.
const (
	slowWebhook     = "slow.servertrace.kproxy.test"
	slowWebhookTime = 300 * time.Millisecond
	serverTraceNS   = "servertrace"
)

// TestServerTrace runs a cluster of its own whose apiserver exports its
// spans to kproxy's OTLP receiver (the shared cluster's apiserver does not
// trace), and kproxy exporting to a Jaeger. It checks that records get
// the apiserver's own layers: a create whose validating webhook sleeps
// 300 ms puts most of its time in that webhook, and the summary names it;
// a LIST shows storage and serialization layers; self times add up to the
// apiserver's total (exactly: every instant is one layer's); the token
// caller in system:masters and the certificate caller (forwarded as
// kproxy's identity, in system:monitoring) get one trace, kproxy's and the
// apiserver's; the other token caller a linked trace; and Jaeger receives
// the apiserver's spans, passed on by kproxy.
func TestServerTrace(t *testing.T) {
	ctx := context.Background()
	ports, err := localcluster.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	receiver := fmt.Sprintf("127.0.0.1:%d", ports[0])
	c, err := localcluster.Start(ctx, localcluster.Options{Log: os.Stderr, TracingEndpoint: receiver})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	admin := kubernetes.NewForConfigOrDie(c.UserConfig("admin"))
	if err := localcluster.GrantKproxy(ctx, admin, "kproxy"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, namespace(serverTraceNS), createOpts); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.EnsureDefaultServiceAccount(ctx, admin, serverTraceNS); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.GrantDevs(ctx, admin, serverTraceNS); err != nil {
		t.Fatal(err)
	}
	registerSlowWebhook(t, admin, slowWebhook, serverTraceNS, slowWebhookTime)
	j, err := localcluster.StartJaeger(ctx, "", "", os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Stop()

	stream := record.NewStream()
	recs, _, unsubscribe := stream.Subscribe(64)
	defer unsubscribe()
	k := startTracedKproxy(t, c, receiver, stream, telemetry.Options{Endpoint: j.OTLPHTTP, Protocol: "http/protobuf", ServiceName: "kproxy-e2e"})
	r := reverseRoute(k)
	next := func(method, path string) *record.Record {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			select {
			case rec := <-recs:
				if rec.Request.Method == method && rec.Request.Path == path {
					return rec
				}
			case <-deadline:
				t.Fatalf("no record of %s %s", method, path)
			}
		}
	}

	// A create: the slow webhook. admin is in system:masters: the
	// apiserver continues kproxy's trace.
	cmPath := "/api/v1/namespaces/" + serverTraceNS + "/configmaps"
	got := do(t, r.client(nil), r.base, request{method: "POST", path: cmPath, user: "admin",
		body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"traced"},"data":{"a":"b"}}`})
	if got.status != http.StatusCreated {
		t.Fatalf("create: %d %s", got.status, got.body)
	}
	create := next("POST", cmPath)
	s := checkServer(t, "create", create)
	top := biggestSelf(s)
	if want := "validating webhook " + slowWebhook; top.Name != want || top.Stage != record.StageValidatingAdmission || top.SelfNs < int64(slowWebhookTime) {
		t.Errorf("create: the biggest self time is %q (%s, %v), want %q over %v; layers:\n%s", top.Name, top.Stage, time.Duration(top.SelfNs), want, slowWebhookTime, layerTable(s))
	}
	if float64(top.SelfNs) < 0.6*float64(s.TotalNs) {
		t.Errorf("create: the webhook has %v of %v, want most of it:\n%s", time.Duration(top.SelfNs), time.Duration(s.TotalNs), layerTable(s))
	}
	if !strings.Contains(s.Summary, "in validating webhook "+slowWebhook+" (timeout 10s)") {
		t.Errorf("create: summary %q does not name the webhook and its timeout", s.Summary)
	}
	if s.TraceID != create.TraceID {
		t.Errorf("create (admin, system:masters): the apiserver's trace %s, kproxy's %s: want one trace", s.TraceID, create.TraceID)
	}
	t.Logf("create: %s\n%s", s.Summary, layerTable(s))

	// A LIST by alice (devs): the apiserver starts its own trace, linked.
	got = do(t, r.client(nil), r.base, request{method: "GET", path: cmPath, user: "alice"})
	if got.status != http.StatusOK {
		t.Fatalf("list: %d %s", got.status, got.body)
	}
	list := next("GET", cmPath)
	ls := checkServer(t, "list", list)
	stages := map[string]bool{}
	for _, l := range ls.Layers {
		stages[l.Stage] = true
	}
	for _, want := range []string{record.StageAuthentication, record.LayerAudit, record.StageFlowControl, record.StageAuthorization, record.StageDecode, record.StageStorage, record.LayerSerialization} {
		if !stages[want] {
			t.Errorf("list: no %s layer:\n%s", want, layerTable(ls))
		}
	}
	if ls.TraceID == list.TraceID {
		t.Errorf("list (alice): the apiserver continued kproxy's trace %s; want its own trace linked to it", list.TraceID)
	}
	t.Logf("list: %s\n%s", ls.Summary, layerTable(ls))

	// A certificate caller: forwarded by impersonation as kproxy, whose
	// identity is in system:monitoring: one trace.
	cfg, err := c.ClientCertConfig("dave", "devs")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(cfg.CertData, cfg.KeyData)
	if err != nil {
		t.Fatal(err)
	}
	got = do(t, r.client(&cert), r.base, request{method: "GET", path: cmPath + "/traced"})
	if got.status != http.StatusOK {
		t.Fatalf("get as dave: %d %s", got.status, got.body)
	}
	get := next("GET", cmPath+"/traced")
	gs := checkServer(t, "get", get)
	if gs.TraceID != get.TraceID {
		t.Errorf("get (certificate, forwarded as kproxy in system:monitoring): the apiserver's trace %s, kproxy's %s: want one trace", gs.TraceID, get.TraceID)
	}

	// Credentials in a query: the apiserver's own spans carry the URL
	// (http.target, url.full), and kproxy passes them on to Jaeger; it
	// redacts them first (probe AB found ?password= there).
	password, accessToken := randomHex(16), randomHex(16)
	queried := cmPath + "?limit=1&password=" + password + "&access_token=" + accessToken
	if got := do(t, r.client(nil), r.base, request{method: "GET", path: queried, user: "admin"}); got.status != http.StatusOK {
		t.Fatalf("list with credentials in the query: %d %s", got.status, got.body)
	}
	withQuery := next("GET", cmPath)
	checkServer(t, "list with credentials in the query", withQuery)

	// A policy's message quoting a Secret's data in free text: the
	// apiserver's span event "Write to database call failed" carries it,
	// and kproxy scrubs it of the body's values before passing it on
	// (probe AE found it in Jaeger).
	pw := "pw-" + randomHex(16)
	quotingPolicy(t, admin, serverTraceNS)
	secretsPath := "/api/v1/namespaces/" + serverTraceNS + "/secrets"
	if got := do(t, r.client(nil), r.base, request{method: "POST", path: secretsPath, user: "admin",
		body: `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"quoted","labels":{"kproxy.test/quoted":"true"}},"stringData":{"pw":"` + pw + `"}}`}); got.status != http.StatusUnprocessableEntity {
		t.Fatalf("a Secret the quoting policy refuses: %d %s", got.status, got.body)
	}
	quoted := next("POST", secretsPath)

	// APF queue wait under load: alice's requests get a priority level
	// of a few seats that borrows none; a burst of creates, each held
	// 300 ms by the webhook, queues, and the records say so.
	apfUnderLoad(t, admin, r, recs, cmPath)

	// Jaeger has the apiserver's spans, passed on by kproxy: the linked
	// trace is the apiserver's alone, the create's is kproxy's and the
	// apiserver's.
	k.stop()
	if names, ok := jaegerOperations(j.QueryURL, ls.TraceID, "List", "cacher.GetList", "SerializeObject"); !ok {
		t.Errorf("Jaeger's trace %s lacks the apiserver's List span: %v", ls.TraceID, names)
	}
	if names, ok := jaegerOperations(j.QueryURL, withQuery.TraceID, "List", "upstream"); !ok {
		t.Errorf("Jaeger's trace %s lacks the apiserver's List span or kproxy's upstream call: %v", withQuery.TraceID, names)
	}
	trace := httpGet(t, j.QueryURL+"/api/traces/"+withQuery.TraceID)
	for what, v := range map[string]string{"?password=": password, "?access_token=": accessToken} {
		if strings.Contains(string(trace), v) {
			t.Errorf("Jaeger's trace %s holds the query's %s value", withQuery.TraceID, what)
		}
	}
	if !strings.Contains(string(trace), "password="+record.Redacted) {
		t.Errorf("Jaeger's trace %s does not show the query's password redacted: the check above may be vacuous", withQuery.TraceID)
	}
	trace = httpGet(t, j.QueryURL+"/api/traces/"+quoted.TraceID)
	if strings.Contains(string(trace), pw) {
		t.Errorf("Jaeger's trace %s holds the Secret's value a policy's message quoted", quoted.TraceID)
	}
	if !strings.Contains(string(trace), "Write to database call failed") || !strings.Contains(string(trace), "pw rejected: "+record.Redacted) {
		t.Errorf("Jaeger's trace %s lacks the apiserver's event with the policy's message, scrubbed: the check above may be vacuous", quoted.TraceID)
	}
	// kproxy's own spans: its server span and the upstream call.
	if names, ok := jaegerOperations(j.QueryURL, create.TraceID, "Call validating webhook", "Create", "upstream"); !ok {
		t.Errorf("Jaeger's trace %s lacks kproxy's or the apiserver's spans (want them in one trace): %v", create.TraceID, names)
	}
}

// checkServer checks what every joined record has and returns its Server.
func checkServer(t *testing.T, what string, rec *record.Record) record.Server {
	t.Helper()
	if rec.Server == nil {
		t.Fatalf("%s: no server layers on the record (audit ID %s, trace %s)", what, rec.Actual.AuditID, rec.TraceID)
	}
	s := *rec.Server
	if s.Source != record.ServerFromTrace || rec.Latency.ServerNs != s.TotalNs || len(s.Layers) < 6 {
		t.Fatalf("%s: server %+v, latency %+v", what, s, rec.Latency)
	}
	// Self times add up to the total exactly: every instant of the
	// apiserver's time is attributed to one layer.
	var sum int64
	for _, l := range s.Layers {
		if l.SelfNs < 0 || l.OffsetNs < 0 || l.OffsetNs+l.DurationNs > s.TotalNs {
			t.Errorf("%s: layer %+v", what, l)
		}
		sum += l.SelfNs
	}
	if sum != s.TotalNs {
		t.Errorf("%s: self times add up to %v, the total is %v", what, time.Duration(sum), time.Duration(s.TotalNs))
	}
	// The apiserver's time is within what kproxy saw upstream (same
	// machine, same clock; 2 ms of slack for the connection's ends).
	if s.TotalNs > rec.Latency.UpstreamNs+int64(2*time.Millisecond) {
		t.Errorf("%s: the apiserver's %v is more than kproxy's upstream %v", what, time.Duration(s.TotalNs), time.Duration(rec.Latency.UpstreamNs))
	}
	if s.Layers[0].Stage != record.StageAuthentication || s.Layers[0].Depth != 0 || s.Summary == "" {
		t.Errorf("%s: first layer %+v, summary %q", what, s.Layers[0], s.Summary)
	}
	return s
}

func biggestSelf(s record.Server) record.ServerLayer {
	var top record.ServerLayer
	for _, l := range s.Layers {
		if l.SelfNs > top.SelfNs {
			top = l
		}
	}
	return top
}

func layerTable(s record.Server) string {
	var b strings.Builder
	for _, l := range s.Layers {
		fmt.Fprintf(&b, "  %-50s %-22s off %-10v dur %-10v self %v\n", strings.Repeat("  ", l.Depth)+l.Name, l.Stage,
			time.Duration(l.OffsetNs).Round(time.Microsecond), time.Duration(l.DurationNs).Round(time.Microsecond), time.Duration(l.SelfNs).Round(time.Microsecond))
	}
	return b.String()
}

// startTracedKproxy starts kproxy in front of c with its OTLP receiver on
// receiver, exporting to tel.
func startTracedKproxy(t *testing.T, c *localcluster.Cluster, receiver string, stream *record.Stream, tel telemetry.Options) *kproxy {
	t.Helper()
	k := startKproxy(t, kproxyOptions{cluster: c, stream: stream, telemetry: tel,
		set: func(o *serve.Options) { o.OTLPReceiverListen = receiver }})
	if k.srv.OTLPReceiverAddr != receiver {
		t.Fatalf("receiver on %s, want %s", k.srv.OTLPReceiverAddr, receiver)
	}
	// The apiserver started before the receiver listened: its exporter
	// connects after a backoff. Its first observation (kproxy's own
	// requests, syncing the replay's state) says it has.
	deadline := time.Now().Add(time.Minute)
	for k.srv.Joiner.Stats().Observations == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the apiserver's spans did not reach kproxy's receiver within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return k
}

// registerSlowWebhook serves a validating webhook named name for the
// creates of configmaps in namespace ns that sleeps for sleep, then
// allows: the slow layer the apiserver's own account must point at.
func registerSlowWebhook(t *testing.T, admin kubernetes.Interface, name, ns string, sleep time.Duration) {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(sleep):
		case <-r.Context().Done():
			return
		}
		reviewAdmission(w, r, func(*admissionv1.AdmissionRequest, *admissionv1.AdmissionResponse) {})
	})
	base, caPEM := serveWebhooks(t, ns+"-webhook", mux)
	url := base + "/slow"
	none, fail, ten := admissionregistrationv1.SideEffectClassNone, admissionregistrationv1.Fail, int32(10)
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kproxy-" + ns},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: name, ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: caPEM, URL: &url},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
			}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
			FailurePolicy:     &fail, SideEffects: &none, TimeoutSeconds: &ten, AdmissionReviewVersions: []string{"v1"},
		}}}
	if _, err := admin.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(context.Background(), vwc, createOpts); err != nil {
		t.Fatal(err)
	}
}

// jaegerOperations polls Jaeger's query API until the trace has every
// operation wanted, and returns its operations.
func jaegerOperations(queryURL, traceID string, want ...string) ([]string, bool) {
	deadline := time.Now().Add(30 * time.Second)
	var names []string
	for time.Now().Before(deadline) {
		names = names[:0]
		resp, err := http.Get(fmt.Sprintf("%s/api/traces/%s", queryURL, traceID))
		if err == nil {
			var body struct {
				Data []struct {
					Spans []struct {
						OperationName string `json:"operationName"`
					} `json:"spans"`
				} `json:"data"`
			}
			if json.NewDecoder(resp.Body).Decode(&body) == nil && len(body.Data) > 0 {
				for _, s := range body.Data[0].Spans {
					names = append(names, s.OperationName)
				}
			}
			resp.Body.Close()
			if !slices.ContainsFunc(want, func(w string) bool { return !slices.Contains(names, w) }) {
				return names, true
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	return names, false
}

// apfUnderLoad sends a burst of slow creates through a narrow priority
// level and expects the APF layer to hold queue wait.
func apfUnderLoad(t *testing.T, admin kubernetes.Interface, r route, recs <-chan *record.Record, cmPath string) {
	t.Helper()
	ctx := context.Background()
	one, zero := int32(1), int32(0)
	plc := &flowcontrolv1.PriorityLevelConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kproxy-narrow"},
		Spec: flowcontrolv1.PriorityLevelConfigurationSpec{Type: flowcontrolv1.PriorityLevelEnablementLimited,
			Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{NominalConcurrencyShares: &one, BorrowingLimitPercent: &zero,
				LimitResponse: flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeQueue,
					Queuing: &flowcontrolv1.QueuingConfiguration{Queues: 1, HandSize: 1, QueueLengthLimit: 100}}}}}
	if _, err := admin.FlowcontrolV1().PriorityLevelConfigurations().Create(ctx, plc, createOpts); err != nil {
		t.Fatal(err)
	}
	fs := &flowcontrolv1.FlowSchema{ObjectMeta: metav1.ObjectMeta{Name: "kproxy-narrow"},
		Spec: flowcontrolv1.FlowSchemaSpec{PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: plc.Name},
			MatchingPrecedence: 100,
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects: []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindUser, User: &flowcontrolv1.UserSubject{Name: "alice"}}},
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{Verbs: []string{"create"}, APIGroups: []string{""},
					Resources: []string{"configmaps"}, Namespaces: []string{serverTraceNS}}},
			}}}}
	if _, err := admin.FlowcontrolV1().FlowSchemas().Create(ctx, fs, createOpts); err != nil {
		t.Fatal(err)
	}
	// The APF controller takes the new objects in within a moment: wait
	// until a create reports the new flow schema.
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		got := do(t, r.client(nil), r.base, request{method: "POST", path: cmPath + "?dryRun=All", user: "alice",
			body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"apf-probe"}}`})
		return got.header.Get("X-Kubernetes-Pf-Flowschema-Uid") != "" && flowSchemaIs(admin, got.header.Get("X-Kubernetes-Pf-Flowschema-Uid"), fs.Name), nil
	}); err != nil {
		t.Fatalf("the flow schema %s never took alice's creates: %v", fs.Name, err)
	}
	const burst = 12
	var wg sync.WaitGroup
	for i := 0; i < burst; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			do(t, r.client(nil), r.base, request{method: "POST", path: cmPath + "?dryRun=All&fieldManager=burst", user: "alice",
				body: fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"apf-%d"}}`, i)})
		}(i)
	}
	wg.Wait()
	var maxWait int64
	var queued *record.Record
	deadline := time.After(30 * time.Second)
	for n := 0; n < burst; {
		select {
		case rec := <-recs:
			if rec.Request.Method != "POST" || rec.Request.Path != cmPath || !strings.Contains(rec.Request.Query, "fieldManager=burst") {
				continue // an earlier request's record
			}
			n++
			if rec.Server == nil {
				t.Errorf("a create of the burst has no server layers (audit ID %s)", rec.Actual.AuditID)
				continue
			}
			for _, l := range rec.Server.Layers {
				if l.Stage == record.StageFlowControl && l.SelfNs > maxWait {
					maxWait, queued = l.SelfNs, rec
				}
			}
		case <-deadline:
			t.Fatalf("only %d of the burst's %d records arrived", n, burst)
		}
	}
	// With a few seats and 12 requests of 300 ms each, some wait at least
	// one webhook call in the queue.
	if maxWait < int64(slowWebhookTime)/2 {
		t.Fatalf("the longest APF self time in the burst is %v: want queue wait of the order of the webhook's %v", time.Duration(maxWait), slowWebhookTime)
	}
	if !strings.Contains(queued.Server.Summary, "APF") {
		t.Errorf("the most queued request's summary does not name APF: %q", queued.Server.Summary)
	}
	t.Logf("APF under load: %s\n%s", queued.Server.Summary, layerTable(*queued.Server))
}

// flowSchemaIs reports whether the flow schema with uid is named name.
func flowSchemaIs(admin kubernetes.Interface, uid, name string) bool {
	fs, err := admin.FlowcontrolV1().FlowSchemas().Get(context.Background(), name, metav1.GetOptions{})
	return err == nil && string(fs.UID) == uid
}

// quotingPolicy makes a ValidatingAdmissionPolicy refusing Secrets
// labelled kproxy.test/quoted in ns, its message quoting their data, and
// waits until the apiserver enforces it.
func quotingPolicy(t *testing.T, admin kubernetes.Interface, ns string) {
	t.Helper()
	ctx := context.Background()
	const name = "quoted.servertrace.kproxy.test"
	fail := admissionregistrationv1.Fail
	vap := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{FailurePolicy: &fail,
			MatchConstraints: &admissionregistrationv1.MatchResources{
				ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kproxy.test/quoted": "true"}},
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"secrets"}},
				}}},
			},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", MessageExpression: "'pw rejected: ' + string(object.data.pw)"}},
		}}
	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, vap, createOpts); err != nil {
		t.Fatal(err)
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}}}
	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, binding, createOpts); err != nil {
		t.Fatal(err)
	}
	probe := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "quoted-probe", Labels: map[string]string{"kproxy.test/quoted": "true"}},
		StringData: map[string]string{"pw": "probe"}}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := admin.CoreV1().Secrets(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsInvalid(err), nil
	})
	if err != nil {
		t.Fatalf("the apiserver did not enforce the quoting policy within 30s: %v", err)
	}
}
