package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/kproxy/kproxy/internal/flowapi"
	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
	"github.com/kproxy/kproxy/internal/telemetry"
	"github.com/kproxy/kproxy/internal/testfile"
)

// TestSecretSweep is issue 17's secret sweep: traffic through kproxy
// (HTTP/1.1 and HTTP/2, --capture-bodies, the flow API, spans to a real
// Jaeger, kproxy's log at debug) that writes Secrets every way a client
// can, creates a bootstrap token and a TokenRequest and authenticates
// with both, reviews a token, passes access_token in every spelling,
// a WebSocket bearer subprotocol and basic auth, and keeps kubeconfigs in
// ConfigMaps; then every output a user can get from kproxy (the capture,
// the log, the flow API, kproxy explain, kproxy flows, a generated suite,
// a snapshot, kproxy test run's reports, TUI exports, the spans in
// Jaeger) is searched for each known secret value, as it is and
// base64- or URL-encoded. None may appear.
func TestSecretSweep(t *testing.T) {
	began := time.Now()
	ctx := context.Background()
	dir := t.TempDir()
	sw := &sweep{t: t, forms: map[string][]sweepForm{}}
	bin, manifest := kproxyBinary(t, dir)

	// Jaeger takes the traces and, as the collector it is built on,
	// forwards the records kproxy exports as logs to a log store.
	logStore := &otlpLogStore{}
	logSrv := httptest.NewServer(logStore)
	t.Cleanup(logSrv.Close)
	j, err := localcluster.StartJaegerForwardingLogs(ctx, "", "", os.Stderr, logSrv.URL+"/v1/logs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(j.Stop) // after kproxy's cleanup, which flushes spans to it

	// kproxy's log at debug, klog (the replay runs the apiserver's code)
	// routed into it as kproxy serve --log-level debug does.
	var kproxyLog syncBuffer
	debugLog := slog.New(slog.NewTextHandler(&kproxyLog, &slog.HandlerOptions{Level: slog.LevelDebug}))
	serve.RouteKlog(debugLog)
	t.Cleanup(func() {
		serve.RouteKlog(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	})
	capture := filepath.Join(dir, "capture.jsonl")
	const service = "kproxy-e2e"
	k := startKproxy(t, kproxyOptions{capture: capture, captureBodies: true, flowAPI: true, log: &kproxyLog,
		telemetry: telemetry.Options{Endpoint: j.OTLPHTTP, Protocol: "http/protobuf", ServiceName: service},
		set:       func(o *serve.Options) { o.Log, o.OTLPLogs = debugLog, true }})

	t.Cleanup(func() { cleanupSweep(t) })
	echoPolicy(t, "echo", "Deny")
	echoPolicy(t, "warn", "Warn")

	// Known values shared by both protocols.
	kc := sweepKubeconfig{
		token: sw.fresh("kubeconfig token"), password: sw.fresh("kubeconfig password"),
		keyBody: sw.fresh("kubeconfig client key (inside client-key-data)"),
		idToken: sw.fresh("kubeconfig auth-provider id-token"), refresh: sw.fresh("kubeconfig auth-provider refresh-token"),
	}
	sw.add("kubeconfig client-key-data", kc.keyData())
	kubeconfig := kc.text()

	sent := 0
	send := func(r route, q request) exchange {
		t.Helper()
		sent++
		return do(t, r.client(nil), r.base, q)
	}
	bearer := func(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }
	secretsPath := "/api/v1/namespaces/" + testNS + "/secrets"
	cmPath := "/api/v1/namespaces/" + testNS + "/configmaps"
	var saToken, lastBootstrap string
	// A legacy (Secret-based) service-account token, its Secret created
	// directly, used through kproxy below.
	legacy := sw.add("legacy service-account token", legacyToken(t, adminClient(), testNS, "default", "sweep-legacy-token", ""))
	bootstrapped := 0
	recordIDs := map[string]string{} // what -> a path to find its record by

	for _, r := range []route{reverseRoute(k), reverseH2Route(k)} {
		p := "h1"
		if r.h2 {
			p = "h2"
		}
		name := func(s string) string { return "sweep-" + p + "-" + s }
		label := func(s string) string { return s + " (" + r.name + ")" }

		// Secrets: JSON create with data and stringData.
		dataV, strV := sw.fresh(label("Secret data, JSON create")), sw.fresh(label("Secret stringData, JSON create"))
		body := mustJSON(t, map[string]any{"apiVersion": "v1", "kind": "Secret",
			"metadata":   map[string]any{"name": name("json"), "labels": sweepLabels},
			"data":       map[string]any{"password": b64(dataV)},
			"stringData": map[string]any{"other": strV}})
		expectStatus(t, "Secret JSON create "+p, send(r, request{method: "POST", path: secretsPath, body: body, user: "admin"}), 201)
		recordIDs["secret-create-"+p] = secretsPath
		// YAML create.
		yamlV := sw.fresh(label("Secret stringData, YAML create"))
		expectStatus(t, "Secret YAML create "+p, send(r, request{method: "POST", path: secretsPath, user: "admin", contentType: "application/yaml",
			body: "apiVersion: v1\nkind: Secret\nmetadata:\n  name: " + name("yaml") + "\n  labels: {kproxy.test/sweep: \"true\"}\nstringData:\n  token: " + yamlV + "\n"}), 201)
		// Misspelled fields: dropped (Warn, 201) and refused (Strict, 400) by
		// the apiserver, meant as data all the same.
		typoV, strictV := sw.fresh(label("Secret stringdata (misspelled), JSON create")), sw.fresh(label("Secret Data (misspelled), strict JSON create"))
		expectStatus(t, "Secret misspelled create "+p, send(r, request{method: "POST", path: secretsPath, user: "admin",
			body: mustJSON(t, map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": name("typo"), "labels": sweepLabels},
				"stringdata": map[string]any{"pw": typoV}})}), 201)
		expectStatus(t, "Secret misspelled strict create "+p, send(r, request{method: "POST", path: secretsPath + "?fieldValidation=Strict", user: "admin",
			body: mustJSON(t, map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": name("typo-strict"), "labels": sweepLabels},
				"Data": map[string]any{"pw": b64(strictV)}})}), 400)
		// A PUT.
		putV := sw.fresh(label("Secret data, PUT"))
		expectStatus(t, "Secret PUT "+p, send(r, request{method: "PUT", path: secretsPath + "/" + name("json"), user: "admin",
			body: mustJSON(t, map[string]any{"apiVersion": "v1", "kind": "Secret",
				"metadata": map[string]any{"name": name("json"), "labels": sweepLabels}, "data": map[string]any{"password": b64(putV)}})}), 200)
		// The patches: JSON, merge, strategic merge, server-side apply.
		jpV := sw.fresh(label("Secret data, JSON patch"))
		expectStatus(t, "Secret JSON patch "+p, send(r, request{method: "PATCH", path: secretsPath + "/" + name("json"), user: "admin",
			contentType: "application/json-patch+json", body: `[{"op":"replace","path":"/data/password","value":"` + b64(jpV) + `"}]`}), 200)
		mpV := sw.fresh(label("Secret stringData, merge patch"))
		expectStatus(t, "Secret merge patch "+p, send(r, request{method: "PATCH", path: secretsPath + "/" + name("json"), user: "admin",
			contentType: "application/merge-patch+json", body: `{"stringData":{"merged":"` + mpV + `"}}`}), 200)
		smpV := sw.fresh(label("Secret data, strategic merge patch"))
		expectStatus(t, "Secret strategic merge patch "+p, send(r, request{method: "PATCH", path: secretsPath + "/" + name("json"), user: "admin",
			contentType: "application/strategic-merge-patch+json", body: `{"data":{"strategic":"` + b64(smpV) + `"}}`}), 200)
		ssaV := sw.fresh(label("Secret stringData, server-side apply"))
		expectStatus(t, "Secret server-side apply "+p, send(r, request{method: "PATCH", path: secretsPath + "/" + name("ssa") + "?fieldManager=sweep&force=true", user: "admin",
			contentType: "application/apply-patch+yaml",
			body:        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: " + name("ssa") + "\n  labels: {kproxy.test/sweep: \"true\"}\nstringData:\n  ssa: " + ssaV + "\n"}), 201)
		// A server-side apply whose value is not a string (a number, a
		// list): the apiserver refuses it, quoting the value in Go's
		// rendering ("got &value.valueUnstructured{Value:...}"), which
		// had reached the record and the trace (found by a probe).
		numV := sw.add(label("Secret stringData, server-side apply, a number"), randomDigits(15))
		expectStatus(t, "Secret server-side apply of a number "+p, send(r, request{method: "PATCH", path: secretsPath + "/" + name("ssa-num") + "?fieldManager=sweep", user: "admin",
			contentType: "application/apply-patch+yaml",
			body:        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: " + name("ssa-num") + "\nstringData:\n  pin: " + numV + "\n"}), 500)
		listV := sw.fresh(label("Secret stringData, server-side apply, a list"))
		expectStatus(t, "Secret server-side apply of a list "+p, send(r, request{method: "PATCH", path: secretsPath + "/" + name("ssa-list") + "?fieldManager=sweep", user: "admin",
			contentType: "application/apply-patch+yaml",
			body:        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: " + name("ssa-list") + "\nstringData:\n  pins: [\"" + listV + "\"]\n"}), 500)
		// A kubeconfig applied into a ConfigMap as an object, not a
		// string: refused (a ConfigMap holds strings), its token had
		// been recorded (probe AE).
		objTok := sw.fresh(label("kubeconfig token, applied into a ConfigMap as an object"))
		expectStatus(t, "ConfigMap server-side apply of a kubeconfig object "+p, send(r, request{method: "PATCH", path: cmPath + "/" + name("kc-object") + "?fieldManager=sweep", user: "admin",
			contentType: "application/apply-patch+yaml",
			body: "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + name("kc-object") + "\ndata:\n  kubeconfig:\n    apiVersion: v1\n    kind: Config\n" +
				"    users:\n    - name: u\n      user:\n        token: " + objTok + "\n"}), 500)
		// kubectl apply's way: the whole object again in an annotation.
		applyV := sw.fresh(label("Secret data, kubectl-apply style (last-applied annotation)"))
		applied := map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": name("applied"), "namespace": testNS, "labels": sweepLabels},
			"data": map[string]any{"key": b64(applyV)}}
		appliedObj := map[string]any{"apiVersion": "v1", "kind": "Secret", "data": applied["data"],
			"metadata": map[string]any{"name": name("applied"), "labels": sweepLabels, "annotations": map[string]any{lastAppliedAnnotation: mustJSON(t, applied)}}}
		expectStatus(t, "Secret kubectl-apply style create "+p, send(r, request{method: "POST", path: secretsPath, user: "admin", body: mustJSON(t, appliedObj)}), 201)
		// A service-account token Secret, as the token controller writes
		// them.
		saSecretV := sw.fresh(label("service-account token Secret's token"))
		expectStatus(t, "service-account token Secret "+p, send(r, request{method: "POST", path: secretsPath, user: "admin",
			body: mustJSON(t, map[string]any{"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
				"metadata":   map[string]any{"name": name("sa-token"), "labels": sweepLabels, "annotations": map[string]any{"kubernetes.io/service-account.name": "default"}},
				"stringData": map[string]any{"token": saSecretV}})}), 201)
		if ex := send(r, request{method: "GET", path: cmPath + "?limit=2", header: bearer(legacy)}); ex.status == 401 {
			t.Errorf("%s: the legacy service-account token was refused (401)", p)
		}
		// Reads: responses are not captured, but they pass through.
		expectStatus(t, "Secret GET "+p, send(r, request{method: "GET", path: secretsPath + "/" + name("json"), user: "admin"}), 200)
		expectStatus(t, "Secret LIST "+p, send(r, request{method: "GET", path: secretsPath + "?labelSelector=kproxy.test%2Fsweep%3Dtrue", user: "admin"}), 200)

		// A bootstrap token, and a request authenticated with it (the
		// test apiserver runs with --enable-bootstrap-token-auth).
		id, btSecret := randomHex(3), randomHex(8)
		sw.add(label("bootstrap token-secret"), btSecret)
		btToken := sw.add(label("bootstrap token (id.secret)"), id+"."+btSecret)
		lastBootstrap = btToken
		expectStatus(t, "bootstrap token Secret "+p, send(r, request{method: "POST", path: "/api/v1/namespaces/kube-system/secrets", user: "admin",
			body: mustJSON(t, map[string]any{"apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
				"metadata":   map[string]any{"name": "bootstrap-token-" + id, "labels": sweepLabels},
				"stringData": map[string]any{"token-id": id, "token-secret": btSecret, "usage-bootstrap-authentication": "true"}})}), 201)
		deadline := time.Now().Add(20 * time.Second)
		for {
			ex := send(r, request{method: "GET", path: cmPath, header: bearer(btToken)})
			if ex.status != 401 {
				bootstrapped++
				recordIDs["bootstrap-"+p] = cmPath
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s: the bootstrap token was still refused (401) after 20s: that part of the sweep did not run", p)
				break
			}
			time.Sleep(250 * time.Millisecond)
		}

		// A TokenRequest: its response holds a token; then the token
		// authenticates a request through kproxy.
		tr := send(r, request{method: "POST", path: "/api/v1/namespaces/" + testNS + "/serviceaccounts/default/token", user: "admin",
			body: `{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":3600}}`})
		var trResp struct {
			Status struct {
				Token string `json:"token"`
			} `json:"status"`
		}
		if tr.status != 201 || json.Unmarshal(tr.body, &trResp) != nil || trResp.Status.Token == "" {
			t.Fatalf("TokenRequest %s: status %d, no token", p, tr.status)
		}
		tok := trResp.Status.Token
		sw.add(label("TokenRequest token"), tok)
		if parts := strings.Split(tok, "."); len(parts) == 3 {
			sw.add(label("TokenRequest token's signature"), parts[2])
		}
		if saToken == "" {
			saToken = tok
		}
		if ex := send(r, request{method: "GET", path: cmPath + "?limit=1", header: bearer(tok)}); ex.status == 401 {
			t.Errorf("%s: the TokenRequest's token was refused (401)", p)
		}
		recordIDs["satoken-"+p] = cmPath + "?limit=1"

		// TokenReviews: of a made-up token, and of the real one.
		reviewV := sw.fresh(label("TokenReview spec.token"))
		for _, rt := range []string{reviewV, tok} {
			expectStatus(t, "TokenReview "+p, send(r, request{method: "POST", path: "/apis/authentication.k8s.io/v1/tokenreviews", user: "admin",
				body: `{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":"` + rt + `"}}`}), 201)
		}
		// Misspelled: the apiserver reads spec.token alone and refuses it
		// as missing, but the value is a token all the same.
		misspelled := sw.fresh(label("TokenReview spec.Token, misspelled"))
		expectStatus(t, "TokenReview spec.Token "+p, send(r, request{method: "POST", path: "/apis/authentication.k8s.io/v1/tokenreviews", user: "admin",
			body: `{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"Token":"` + misspelled + `"}}`}), 400)

		// access_token in the query, every spelling.
		for _, q := range []struct{ label, query string }{
			{"?access_token=", "access_token="},
			{"?a=1&access_token=", "a=1&access_token="},
			{"?a=1;access_token=", "a=1;access_token="},
			{"?access%5Ftoken=", "access%5Ftoken="},
			{"?ACCESS_TOKEN=", "ACCESS_TOKEN="},
		} {
			v := sw.fresh(label("query " + q.label))
			send(r, request{method: "GET", path: cmPath + "?" + q.query + v})
		}
		// Basic auth.
		pass := sw.fresh(label("basic-auth password"))
		userPass := sw.add(label("basic-auth user:password"), "sweep-user:"+pass)
		send(r, request{method: "GET", path: cmPath, header: http.Header{"Authorization": {"Basic " + b64(userPass)}}})

		// Kubeconfigs in ConfigMaps: JSON and YAML creates, the three
		// patches, and kubectl apply's annotation.
		cm := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": name("kc"), "labels": sweepLabels},
			"data": map[string]any{"config": kubeconfig, "plain": "kept"}}
		expectStatus(t, "ConfigMap with a kubeconfig, JSON "+p, send(r, request{method: "POST", path: cmPath, user: "admin", body: mustJSON(t, cm)}), 201)
		recordIDs["cm-create-"+p] = cmPath
		expectStatus(t, "ConfigMap with a kubeconfig, YAML "+p, send(r, request{method: "POST", path: cmPath, user: "admin", contentType: "application/yaml",
			body: "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + name("kc-yaml") + "\n  labels: {kproxy.test/sweep: \"true\"}\ndata:\n  config: |\n" + indentLines(kubeconfig, "    ")}), 201)
		expectStatus(t, "ConfigMap merge patch "+p, send(r, request{method: "PATCH", path: cmPath + "/" + name("kc"), user: "admin",
			contentType: "application/merge-patch+json", body: mustJSON(t, map[string]any{"data": map[string]any{"merged": kubeconfig}})}), 200)
		expectStatus(t, "ConfigMap JSON patch "+p, send(r, request{method: "PATCH", path: cmPath + "/" + name("kc"), user: "admin",
			contentType: "application/json-patch+json", body: mustJSON(t, []any{map[string]any{"op": "add", "path": "/data/patched", "value": kubeconfig}})}), 200)
		expectStatus(t, "ConfigMap strategic merge patch "+p, send(r, request{method: "PATCH", path: cmPath + "/" + name("kc"), user: "admin",
			contentType: "application/strategic-merge-patch+json", body: mustJSON(t, map[string]any{"data": map[string]any{"strategic": kubeconfig}})}), 200)
		cmApplied := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": name("kc-applied"), "namespace": testNS},
			"data": map[string]any{"config": kubeconfig}}
		cmAppliedObj := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "data": cmApplied["data"],
			"metadata": map[string]any{"name": name("kc-applied"), "labels": sweepLabels, "annotations": map[string]any{lastAppliedAnnotation: mustJSON(t, cmApplied)}}}
		expectStatus(t, "ConfigMap kubectl-apply style "+p, send(r, request{method: "POST", path: cmPath, user: "admin", body: mustJSON(t, cmAppliedObj)}), 201)
		expectStatus(t, "ConfigMap GET "+p, send(r, request{method: "GET", path: cmPath + "/" + name("kc"), user: "admin"}), 200)

		// A Helm release as helm's ConfigMap driver stores it (its
		// labels, its name), then patched by name alone, which carries
		// no label to tell it by (found by probes X and AB: a chart's
		// rendered Secret was recoverable from data.release).
		release := "sh.helm.release.v1." + name("rel") + ".v1"
		expectStatus(t, "Helm release ConfigMap "+p, send(r, request{method: "POST", path: cmPath, user: "admin",
			body: mustJSON(t, map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
				"metadata": map[string]any{"name": release, "labels": map[string]any{"owner": "helm", "name": name("rel"), "status": "deployed", "version": "1", "kproxy.test/sweep": "true"}},
				"data":     map[string]any{"release": sw.fresh(label("Helm release, ConfigMap driver"))}})}), 201)
		expectStatus(t, "Helm release merge patch "+p, send(r, request{method: "PATCH", path: cmPath + "/" + release, user: "admin",
			contentType: "application/merge-patch+json", body: `{"data":{"release":"` + sw.fresh(label("Helm release, merge patch by name")) + `"}}`}), 200)
		expectStatus(t, "Helm release JSON patch "+p, send(r, request{method: "PATCH", path: cmPath + "/" + release, user: "admin",
			contentType: "application/json-patch+json", body: `[{"op":"replace","path":"/data/release","value":"` + sw.fresh(label("Helm release, JSON patch by name")) + `"}]`}), 200)
		// kubectl apply's way: the release again in the annotation.
		appliedRelease := "sh.helm.release.v1." + name("rel-applied") + ".v1"
		helmLabels := map[string]any{"owner": "helm", "name": name("rel-applied"), "kproxy.test/sweep": "true"}
		relApplied := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": appliedRelease, "namespace": testNS, "labels": helmLabels},
			"data": map[string]any{"release": sw.fresh(label("Helm release, kubectl-apply style (last-applied annotation)"))}}
		expectStatus(t, "Helm release kubectl-apply style "+p, send(r, request{method: "POST", path: cmPath, user: "admin",
			body: mustJSON(t, map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "data": relApplied["data"],
				"metadata": map[string]any{"name": appliedRelease, "labels": helmLabels, "annotations": map[string]any{lastAppliedAnnotation: mustJSON(t, relApplied)}}})}), 201)
		// Refusals that echo a body or the stored object (probe AD): a
		// merge patch that does not decode quotes the patched object,
		// every stored value with it (the Secret's data, the ConfigMap's
		// kubeconfig, the Helm release); YAML's invalid map key renders
		// the key's values; a body that does not parse is quoted by its
		// first 30 bytes in hex.
		expectStatus(t, "Secret merge patch that does not decode "+p, send(r, request{method: "PATCH", path: secretsPath + "/" + name("json"), user: "admin",
			contentType: "application/merge-patch+json", body: `{"data":{"bad":"not base64!"}}`}), 422)
		expectStatus(t, "ConfigMap merge patch that does not decode "+p, send(r, request{method: "PATCH", path: cmPath + "/" + name("kc"), user: "admin",
			contentType: "application/merge-patch+json", body: `{"binaryData":{"bad":"not base64!"}}`}), 422)
		expectStatus(t, "Helm release merge patch that does not decode "+p, send(r, request{method: "PATCH", path: cmPath + "/" + release, user: "admin",
			contentType: "application/merge-patch+json", body: `{"binaryData":{"bad":"not base64!"}}`}), 422)
		expectStatus(t, "Secret YAML with a map as a key "+p, send(r, request{method: "POST", path: secretsPath, user: "admin", contentType: "application/yaml",
			body: "apiVersion: v1\nkind: Secret\nmetadata: {name: " + name("mapkey") + "}\nstringData:\n  {pw: " + sw.fresh(label("Secret YAML map key")) + "}: x\n"}), 400)
		hexV := sw.fresh(label("Secret stringData, YAML that does not parse"))
		sw.add(label("Secret stringData, YAML that does not parse, in hex"), hex.EncodeToString([]byte("stringData: {pw: " + hexV)[:30]))
		expectStatus(t, "Secret YAML that does not parse "+p, send(r, request{method: "POST", path: secretsPath, user: "admin", contentType: "application/yaml",
			body: "stringData: {pw: " + hexV + "}\nkind: Secret\napiVersion: v1\nbad: [\n"}), 400)
		reviewHex := sw.fresh(label("TokenReview YAML that does not parse"))
		sw.add(label("TokenReview YAML that does not parse, in hex"), hex.EncodeToString([]byte("spec: {token: " + reviewHex)[:30]))
		expectStatus(t, "TokenReview YAML that does not parse "+p, send(r, request{method: "POST", path: "/apis/authentication.k8s.io/v1/tokenreviews", user: "admin", contentType: "application/yaml",
			body: "spec: {token: " + reviewHex + "}\nkind: TokenReview\napiVersion: authentication.k8s.io/v1\nbad: [\n"}), 400)
		// A policy whose message quotes the Secret's data in free text
		// (probe AE): no echo pattern knows it; the body's values are
		// scrubbed.
		expectStatus(t, "Secret refused by a policy quoting it "+p, send(r, request{method: "POST", path: secretsPath, user: "admin",
			body: mustJSON(t, map[string]any{"apiVersion": "v1", "kind": "Secret",
				"metadata":   map[string]any{"name": name("policy-echo"), "labels": map[string]any{"kproxy.test/sweep-echo": "true"}},
				"stringData": map[string]any{"pw": sw.fresh(label("Secret stringData quoted by a policy's message"))}})}), 422)
		// The stored value, quoted for a patch that only adds the
		// policy's label (probe AG: the body carries no secret to
		// scrub by; the replay's admission is given the stored one).
		storedV := sw.fresh(label("Secret's stored data, quoted by a policy refusing a label patch"))
		expectStatus(t, "Secret to patch under the policy "+p, send(r, request{method: "POST", path: secretsPath, user: "admin",
			body: mustJSON(t, map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": name("policy-stored"), "labels": sweepLabels},
				"stringData": map[string]any{"pw": storedV}})}), 201)
		expectStatus(t, "Secret label patch refused by a policy quoting its stored data "+p, send(r, request{method: "PATCH", path: secretsPath + "/" + name("policy-stored"), user: "admin",
			contentType: "application/merge-patch+json", body: `{"metadata":{"labels":{"kproxy.test/sweep-echo":"true"}}}`}), 422)
		// A protobuf body (client-go's encoding for built-in types):
		// its values had been looked for as YAML (probe AG).
		pbV := sw.fresh(label("Secret stringData in a protobuf body, quoted by a policy"))
		expectStatus(t, "protobuf Secret refused by a policy quoting it "+p, send(r, request{method: "POST", path: secretsPath, user: "admin",
			contentType: "application/vnd.kubernetes.protobuf", body: protobufSecret(t, name("policy-pb"), map[string]string{"kproxy.test/sweep-echo": "true"}, pbV)}), 422)
		// base64 wrapped over lines, as base64(1) prints it: the
		// apiserver decodes it alike, the policy quotes it on one line.
		wrappedV := sw.add(label("Secret data wrapped over lines, quoted by a policy"), randomHex(48))
		enc := b64(wrappedV)
		expectStatus(t, "Secret with wrapped base64 refused by a policy quoting it "+p, send(r, request{method: "POST", path: secretsPath, user: "admin",
			body: mustJSON(t, map[string]any{"apiVersion": "v1", "kind": "Secret",
				"metadata": map[string]any{"name": name("policy-wrapped"), "labels": map[string]any{"kproxy.test/sweep-echo": "true"}},
				"data":     map[string]any{"pw": enc[:76] + "\n" + enc[76:]}})}), 422)
		// The same message as a warning, on a Secret created.
		expectStatus(t, "Secret warned of by a policy quoting it "+p, send(r, request{method: "POST", path: secretsPath, user: "admin",
			body: mustJSON(t, map[string]any{"apiVersion": "v1", "kind": "Secret",
				"metadata":   map[string]any{"name": name("policy-warn"), "labels": map[string]any{"kproxy.test/sweep-warn": "true", "kproxy.test/sweep": "true"}},
				"stringData": map[string]any{"pw": sw.fresh(label("Secret stringData quoted by a policy's warning"))}})}), 201)
		// Headers named as credentials, which a proxy subresource passes
		// to its backend (probe Y: X-Api-Key was kept verbatim), and a
		// body posted through one: the backend's, not an object.
		send(r, request{method: "GET", path: cmPath + "?limit=1", user: "admin",
			header: http.Header{"X-Api-Key": {sw.fresh(label("X-Api-Key header"))}, "X-Auth-Token": {sw.fresh(label("X-Auth-Token header"))}}})
		send(r, request{method: "POST", path: "/api/v1/namespaces/" + testNS + "/services/sweep-backend:80/proxy/login", user: "admin",
			body: `{"user":"sweep","password":"` + sw.fresh(label("body posted through a proxy subresource")) + `"}`})
	}

	// WebSocket upgrades (HTTP/1.1 only): the bearer subprotocol with the
	// real token and a made-up one, and access_token, which the apiserver
	// reads on WebSocket requests.
	wsBad := sw.fresh("WebSocket bearer subprotocol token")
	wsQuery := sw.fresh("WebSocket ?access_token=")
	for _, ws := range []struct{ query, token string }{
		{"watch=true", saToken},
		{"watch=true", wsBad},
		{"watch=true&access_token=" + wsQuery, ""},
	} {
		sent++
		websocketRequest(t, reverseRoute(k), cmPath+"?"+ws.query, ws.token)
	}

	// kubectl, as a user runs it through kproxy (HTTP/2): apply twice
	// (create, then a patch with the last-applied annotation), create
	// secret generic, and a ConfigMap holding a kubeconfig.
	kubectlRan := runSweepKubectl(t, k, dir, sw, kubeconfig)

	// The flow API, live: the list, one flow, re-runs, the stream, and
	// kproxy flows --connect.
	recs := waitCaptureAtLeast(t, capture, sent)
	list := httpGet(t, k.apiURL+flowapi.PathFlows+"?limit=10000")
	sw.check("flow API GET /api/v1/flows", list)
	var fl flowapi.FlowList
	if err := json.Unmarshal(list, &fl); err != nil {
		t.Fatalf("flow list: %v", err)
	}
	if len(fl.Items) < sent {
		t.Errorf("the flow API lists %d flows, want at least the %d requests sent", len(fl.Items), sent)
	}
	for _, what := range []string{"secret-create-h1", "secret-create-h2", "satoken-h1", "bootstrap-h2", "cm-create-h1"} {
		path, ok := recordIDs[what]
		if !ok {
			continue
		}
		id := findRecord(recs, what, path)
		if id == "" {
			t.Errorf("no record for %s", what)
			continue
		}
		sw.check("flow API GET /api/v1/flows/{id} ("+what+")", httpGet(t, k.apiURL+flowapi.PathFlows+"/"+id))
		sw.check("flow API POST /api/v1/flows/{id}/replay ("+what+")", httpPost(t, k.apiURL+flowapi.PathFlows+"/"+id+"/replay"))
	}
	sw.check("flow API GET /api/v1/flows/stream", readStream(k.apiURL+flowapi.PathStream+"?backlog=10000", 3*time.Second))
	stdout, stderr, _ := runBin(t, bin, nil, "flows", "--connect", k.apiURL, "-o", "json")
	sw.check("kproxy flows --connect -o json (stdout)", stdout)
	sw.check("kproxy flows --connect -o json (stderr)", stderr)

	k.stop() // flushes the capture and the spans
	raw, err := os.ReadFile(capture)
	if err != nil {
		t.Fatal(err)
	}
	sw.check("capture file", raw)
	recs = readRecords(t, raw)
	sw.check("kproxy's log (debug)", []byte(kproxyLog.String()))
	if kproxyLog.String() == "" {
		t.Error("kproxy logged nothing: the log sweep would be vacuous")
	}
	checkSweepRecords(t, recs, sent)

	// The records as OTLP logs, as the log store got them through the
	// collector (protobuf on the wire, as it stays in a store).
	var logBytes []byte
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		var n int
		n, logBytes = logStore.received()
		return n >= len(recs), nil
	})
	if err != nil {
		t.Errorf("the log store got fewer records as logs than the %d captured", len(recs))
	}
	sw.check("records as OTLP logs (through the collector)", logBytes)

	// Jaeger: every trace of the run, with all its spans.
	traces, spans, traceIDs := jaegerServiceTraces(t, j.QueryURL, service, began, recs)
	sw.check("Jaeger traces JSON", traces)
	if spans == 0 {
		t.Error("Jaeger returned no spans: the span sweep would be vacuous")
	}

	// The CLI, as a user runs it.
	upstream, err := cluster.UpstreamKubeconfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	explainSecret := sw.fresh("kproxy explain -f Secret body (JSON)")
	explainYAML := sw.fresh("kproxy explain -f Secret body (YAML)")
	explainReview := sw.fresh("kproxy explain -f TokenReview body")
	files := map[string]string{
		"secret.json":       mustJSON(t, map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": "sweep-explain"}, "data": map[string]any{"k": b64(explainSecret)}, "stringData": map[string]any{"s": explainSecret}}),
		"secret.yaml":       "apiVersion: v1\nkind: Secret\nmetadata:\n  name: sweep-explain-yaml\nstringData:\n  s: " + explainYAML + "\n",
		"tokenrequest.json": `{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":3600}}`,
		"tokenreview.json":  `{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":"` + explainReview + `"}}`,
		"configmap.json":    mustJSON(t, map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "sweep-explain-kc"}, "data": map[string]any{"config": kubeconfig}}),
	}
	for f, b := range files {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	common := []string{"--upstream-kubeconfig", upstream, "--apiserver-manifest", manifest, "--log-level", "debug"}
	for _, e := range []struct {
		what string
		args []string
	}{
		{"a Secret create, -o json", []string{"POST", secretsPath, "-f", filepath.Join(dir, "secret.json"), "--token", tokenOf("admin"), "-o", "json"}},
		{"a Secret create", []string{"POST", secretsPath, "-f", filepath.Join(dir, "secret.json"), "--token", tokenOf("admin")}},
		{"a YAML Secret create, -o yaml", []string{"POST", secretsPath, "-f", filepath.Join(dir, "secret.yaml"), "--token", tokenOf("admin"), "-o", "yaml"}},
		{"a TokenRequest with the TokenRequest's token", []string{"POST", "/api/v1/namespaces/" + testNS + "/serviceaccounts/default/token", "-f", filepath.Join(dir, "tokenrequest.json"), "--token", saToken, "-o", "json"}},
		{"a TokenRequest", []string{"POST", "/api/v1/namespaces/" + testNS + "/serviceaccounts/default/token", "-f", filepath.Join(dir, "tokenrequest.json"), "--token", tokenOf("admin")}},
		{"a TokenReview", []string{"POST", "/apis/authentication.k8s.io/v1/tokenreviews", "-f", filepath.Join(dir, "tokenreview.json"), "--token", tokenOf("admin"), "-o", "json"}},
		{"a ConfigMap with a kubeconfig", []string{"POST", cmPath, "-f", filepath.Join(dir, "configmap.json"), "--token", tokenOf("admin"), "-o", "json"}},
		{"a read with an access_token, -o json", []string{"GET", cmPath + "?access_token=" + wsQuery, "-o", "json"}},
		{"a read with an access_token", []string{"GET", cmPath + "?a=1;access_token=" + wsQuery}},
		{"a read with the bootstrap token", []string{"GET", cmPath, "--token", lastBootstrap, "-o", "yaml"}},
	} {
		stdout, stderr, code := runBin(t, bin, nil, append(append([]string{"explain"}, e.args...), common...)...)
		if code != 0 && code != 3 && code != 4 {
			t.Errorf("kproxy explain %s: exit status %d\n%s", e.what, code, sw.scrub(lastLines(string(stderr), 10)))
		}
		if len(stdout) == 0 {
			t.Errorf("kproxy explain %s printed nothing", e.what)
		}
		sw.check("kproxy explain "+e.what+" (stdout)", stdout)
		sw.check("kproxy explain "+e.what+" (stderr)", stderr)
	}
	for _, o := range []string{"json", "wide"} {
		stdout, stderr, code := runBin(t, bin, nil, "flows", capture, "-o", o)
		if code != 0 || len(stdout) == 0 {
			t.Errorf("kproxy flows -o %s: exit status %d, %d bytes", o, code, len(stdout))
		}
		sw.check("kproxy flows FILE -o "+o+" (stdout)", stdout)
		sw.check("kproxy flows FILE -o "+o+" (stderr)", stderr)
	}

	suite := filepath.Join(dir, "suite", "recorded.yaml")
	if err := os.MkdirAll(filepath.Dir(suite), 0o755); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := runBin(t, bin, nil, "test", "generate", "--from", capture, "-o", suite)
	if code != 0 {
		t.Fatalf("kproxy test generate: exit status %d\n%s", code, sw.scrub(lastLines(string(stderr), 20)))
	}
	sw.check("kproxy test generate (stdout)", stdout)
	sw.check("kproxy test generate (stderr)", stderr)
	suiteYAML, err := os.ReadFile(suite)
	if err != nil {
		t.Fatal(err)
	}
	sw.check("generated suite", suiteYAML)
	loaded, err := testfile.Load(suite)
	if err != nil || len(loaded) != 1 {
		t.Fatalf("the generated suite does not load: %v", err)
	}
	cases := len(loaded[0].Cases)
	if cases < 40 {
		t.Errorf("the generated suite has %d cases, want at least 40", cases)
	}

	snap := filepath.Join(dir, "snap")
	stdout, stderr, code = runBin(t, bin, nil, "snapshot", "-o", snap, "--kubeconfig", upstream, "--apiserver-manifest", manifest, "--for", suite)
	if code != 0 {
		t.Fatalf("kproxy snapshot: exit status %d\n%s", code, sw.scrub(lastLines(string(stderr), 20)))
	}
	sw.check("kproxy snapshot (stdout)", stdout)
	sw.check("kproxy snapshot (stderr)", stderr)
	snapFiles := sw.checkDir("snapshot", snap)
	cms, err := os.ReadFile(filepath.Join(snap, "objects", "core", "v1", "configmaps.yaml"))
	if err != nil || !bytes.Contains(cms, []byte("sweep-h1-kc")) || !bytes.Contains(cms, []byte(record.Redacted)) {
		t.Errorf("the snapshot lacks the ConfigMaps with kubeconfigs the suite names (%v): the snapshot sweep would not cover them", err)
	}

	junit := filepath.Join(dir, "junit.xml")
	summary := filepath.Join(dir, "step-summary.md")
	for _, run := range []struct {
		what string
		env  []string
		args []string
	}{
		{"-o json --junit", nil, []string{"-o", "json", "--junit", junit}},
		{"-o wide", nil, []string{"-o", "wide"}},
		{"-o github", []string{"GITHUB_STEP_SUMMARY=" + summary}, []string{"-o", "github"}},
	} {
		stdout, stderr, code := runBin(t, bin, run.env, append(append([]string{"test", "run", "--engine", "local", "--snapshot", snap}, run.args...), suite)...)
		if code != 0 && code != 1 {
			t.Errorf("kproxy test run %s: exit status %d\n%s", run.what, code, sw.scrub(lastLines(string(stderr), 20)))
		}
		sw.check("kproxy test run "+run.what+" (stdout)", stdout)
		sw.check("kproxy test run "+run.what+" (stderr)", stderr)
	}
	for name, f := range map[string]string{"JUnit report": junit, "GitHub step summary": summary} {
		b, err := os.ReadFile(f)
		if err != nil || len(b) == 0 {
			t.Errorf("%s: %v (%d bytes)", name, err, len(b))
		}
		sw.check(name, b)
	}

	// TUI exports, as a person makes them.
	harFile, jsonlFile := filepath.Join(dir, "export.har"), filepath.Join(dir, "export.jsonl")
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Logf("tmux is not installed: the TUI exports are not swept")
	} else {
		term := startTmux(t, 160, 40, bin+" tui "+capture)
		term.waitFor("the list", testNS)
		for _, e := range []struct{ name, format, file string }{
			{"TUI export (HAR)", "har", harFile}, {"TUI export (JSONL)", "jsonl", jsonlFile},
		} {
			term.keys(":", "export "+e.format+" "+e.file, "Enter")
			var b []byte
			for deadline := time.Now().Add(30 * time.Second); len(b) == 0 && time.Now().Before(deadline); {
				time.Sleep(200 * time.Millisecond)
				b, _ = os.ReadFile(e.file)
			}
			if len(b) == 0 {
				t.Errorf("%s: nothing written:\n%s", e.name, sw.scrub(term.screen()))
			}
			sw.check(e.name, b)
		}
		term.keys("q")
	}

	fromKubectl, reruns := 0, 0
	for _, r := range recs {
		if r.RerunOf != "" {
			reruns++
		}
		if ua := r.Request.Headers["User-Agent"]; len(ua) > 0 && strings.HasPrefix(ua[0], "kubectl") {
			fromKubectl++
		}
	}
	if kubectlRan && fromKubectl == 0 {
		t.Error("kubectl ran, but no record comes from it")
	}
	t.Logf("sent %d requests by hand and %d by kubectl, %d bootstrap-token-authenticated; %d capture records (%d re-runs), %d flows listed; %d spans in %d traces; %d generated cases; %d snapshot files; %d known values in %d forms",
		sent, fromKubectl, bootstrapped, len(recs), reruns, len(fl.Items), spans, traceIDs, cases, snapFiles, len(sw.labels), sw.formCount())
	for _, o := range sw.outputs {
		t.Logf("swept %-70s %9d bytes", o.name, o.bytes)
	}
	t.Logf("the sweep took %s", time.Since(began).Round(time.Second))
}

// protobufSecret is a Secret in the apiserver's protobuf encoding.
func protobufSecret(t *testing.T, name string, labels map[string]string, pw string) string {
	t.Helper()
	sec := &corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, StringData: map[string]string{"pw": pw}}
	var buf bytes.Buffer
	if err := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme).Encode(sec, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// echoPolicy makes a ValidatingAdmissionPolicy for Secrets labelled
// kproxy.test/sweep-LABEL, its message quoting their data, bound with
// the action given (Deny: refused 422; Warn: created, the message a
// Warning header), and waits until the apiserver enforces it.
func echoPolicy(t *testing.T, label, action string) {
	t.Helper()
	direct := directRoute()
	dc := direct.client(nil)
	name := "sweep-" + label + ".kproxy.test"
	selector := "kproxy.test/sweep-" + label
	policy := `{"apiVersion":"admissionregistration.k8s.io/v1","kind":"ValidatingAdmissionPolicy","metadata":{"name":"` + name + `"},
"spec":{"failurePolicy":"Fail","matchConstraints":{"resourceRules":[{"apiGroups":[""],"apiVersions":["v1"],"operations":["CREATE","UPDATE"],"resources":["secrets"]}],
"objectSelector":{"matchLabels":{"` + selector + `":"true"}}},
"validations":[{"expression":"false","messageExpression":"'pw rejected: ' + string(object.data.pw)"}]}}`
	binding := `{"apiVersion":"admissionregistration.k8s.io/v1","kind":"ValidatingAdmissionPolicyBinding","metadata":{"name":"` + name + `"},
"spec":{"policyName":"` + name + `","validationActions":["` + action + `"]}}`
	for _, o := range []struct{ path, body string }{
		{"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies", policy},
		{"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings", binding},
	} {
		if got := do(t, dc, direct.base, request{method: "POST", path: o.path, user: "admin", body: o.body}); got.status != 201 {
			t.Fatalf("create %s: %d %s", o.path, got.status, got.body)
		}
		t.Cleanup(func() { do(t, dc, direct.base, request{method: "DELETE", path: o.path + "/" + name, user: "admin"}) })
	}
	probe := `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"sweep-` + label + `-probe","labels":{"` + selector + `":"true"}},"data":{"pw":"cHJvYmU="}}`
	enforced := func() bool {
		got := do(t, dc, direct.base, request{method: "POST", path: "/api/v1/namespaces/" + testNS + "/secrets?dryRun=All", user: "admin", body: probe})
		if action == "Warn" {
			return got.status == 201 && strings.Contains(strings.Join(got.header.Values("Warning"), "\n"), "pw rejected")
		}
		return got.status == 422
	}
	deadline := time.Now().Add(30 * time.Second)
	for !enforced() {
		if time.Now().After(deadline) {
			t.Fatalf("the apiserver did not enforce the %s policy (%s) within 30s", label, action)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// sweepLabels mark what the sweep creates, for the cleanup.
var sweepLabels = map[string]any{"kproxy.test/sweep": "true"}

const lastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"

// sweep holds the known secret values and the outputs searched for them.
type sweep struct {
	t       *testing.T
	labels  []string
	forms   map[string][]sweepForm
	outputs []struct {
		name  string
		bytes int
	}
}

type sweepForm struct{ how, s string }

// fresh is a new random value, known by label.
func (s *sweep) fresh(label string) string { return s.add(label, randomHex(16)) }

// add makes v a known value.
func (s *sweep) add(label, v string) string {
	if _, ok := s.forms[label]; !ok {
		s.labels = append(s.labels, label)
	}
	s.forms[label] = secretForms(v)
	return v
}

// scrub replaces every known value in text by its label, for failure
// messages that quote an output.
func (s *sweep) scrub(text string) string {
	for _, l := range s.labels {
		for _, f := range s.forms[l] {
			text = strings.ReplaceAll(text, f.s, "<"+l+">")
		}
	}
	return text
}

func (s *sweep) formCount() int {
	n := 0
	for _, f := range s.forms {
		n += len(f)
	}
	return n
}

// check searches one output for every known value, in every form. A
// failure names the output, the value's label and the form, never the
// value.
func (s *sweep) check(name string, data []byte) {
	s.t.Helper()
	s.outputs = append(s.outputs, struct {
		name  string
		bytes int
	}{name, len(data)})
	for _, l := range s.labels {
		for _, f := range s.forms[l] {
			if i := bytes.Index(data, []byte(f.s)); i >= 0 {
				s.t.Errorf("%s holds the %s (%s), in: %q", name, l, f.how, leakContext(data, i, len(f.s)))
				break
			}
		}
	}
}

// leakContext is what surrounds a leaked value at data[i:i+n], the
// value itself masked: where it leaked says why.
func leakContext(data []byte, i, n int) string {
	lo, hi := max(0, i-200), min(len(data), i+n+80)
	return string(data[lo:i]) + "<LEAK>" + string(data[i+n:hi])
}

// checkDir checks every file under dir; it returns how many there were.
func (s *sweep) checkDir(name, dir string) int {
	s.t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		s.check(name+"/"+rel, b)
		n++
		return nil
	})
	if err != nil {
		s.t.Errorf("%s: %v", name, err)
	}
	if n == 0 {
		s.t.Errorf("%s: no files", name)
	}
	return n
}

// secretForms are the ways a value can be written out: as it is, URL-
// and JSON-escaped, and base64-encoded (standard and URL alphabets) at
// each of the three alignments it can have inside a longer encoded text:
// the characters that depend on the value alone.
func secretForms(v string) []sweepForm {
	if v == "" {
		return nil
	}
	forms := []sweepForm{{"as is", v}}
	seen := map[string]bool{v: true}
	addForm := func(how, f string) {
		if len(f) >= 12 && !seen[f] {
			seen[f] = true
			forms = append(forms, sweepForm{how, f})
		}
	}
	addForm("URL-encoded", url.QueryEscape(v))
	addForm("URL-path-encoded", url.PathEscape(v))
	if j, err := json.Marshal(v); err == nil {
		addForm("JSON-escaped", string(j[1:len(j)-1]))
	}
	for k := range 3 {
		enc := base64.StdEncoding.EncodeToString(append(make([]byte, k), v...))
		lo, hi := (8*k+5)/6, 8*(k+len(v))/6
		core := enc[lo:hi]
		addForm(fmt.Sprintf("base64 at offset %d", k), core)
		addForm(fmt.Sprintf("base64url at offset %d", k), strings.NewReplacer("+", "-", "/", "_").Replace(core))
	}
	return forms
}

// randomDigits is n random decimal digits, the first not 0 (a YAML
// number).
func randomDigits(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	for i := range b {
		b[i] = '0' + b[i]%10
	}
	if b[0] == '0' {
		b[0] = '7'
	}
	return string(b)
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func indentLines(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n") + "\n"
}

// expectStatus fails when a request the sweep depends on did not do what
// it should; it never prints the body (it may hold a secret), only a
// Status's reason.
func expectStatus(t *testing.T, what string, ex exchange, want int) {
	t.Helper()
	if ex.status == want {
		return
	}
	var st metav1.Status
	_ = json.Unmarshal(ex.body, &st)
	t.Errorf("%s: status %d (%s), want %d", what, ex.status, st.Reason, want)
}

// sweepKubeconfig is a realistic kubeconfig with known credentials.
type sweepKubeconfig struct{ token, password, keyBody, idToken, refresh string }

func (k sweepKubeconfig) keyData() string {
	return b64("-----BEGIN EC PRIVATE KEY-----\n" + k.keyBody + "\n-----END EC PRIVATE KEY-----\n")
}

func (k sweepKubeconfig) text() string {
	return `apiVersion: v1
kind: Config
clusters:
- name: sweep
  cluster:
    server: https://sweep.example:6443
    certificate-authority-data: ` + b64("-----BEGIN CERTIFICATE-----\nnot a secret\n-----END CERTIFICATE-----\n") + `
users:
- name: sweep-admin
  user:
    token: ` + k.token + `
    client-certificate-data: ` + b64("-----BEGIN CERTIFICATE-----\nnot a secret either\n-----END CERTIFICATE-----\n") + `
    client-key-data: ` + k.keyData() + `
- name: sweep-basic
  user:
    username: sweep
    password: ` + k.password + `
- name: sweep-oidc
  user:
    auth-provider:
      name: oidc
      config:
        client-id: kubectl
        idp-issuer-url: https://issuer.sweep.example
        id-token: ` + k.idToken + `
        refresh-token: ` + k.refresh + `
contexts:
- name: sweep
  context:
    cluster: sweep
    user: sweep-admin
current-context: sweep
`
}

// websocketRequest sends a WebSocket upgrade through kproxy, with token
// (when set) in the bearer subprotocol, and closes the connection at
// once.
func websocketRequest(t *testing.T, r route, path, token string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), "GET", r.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", base64.StdEncoding.EncodeToString([]byte(randomHex(8))))
	protocols := "v4.channel.k8s.io"
	if token != "" {
		protocols = bearerProtocol(token) + ", " + protocols
	}
	req.Header.Set("Sec-WebSocket-Protocol", protocols)
	resp, err := r.client(nil).Do(req)
	if err != nil {
		t.Fatalf("WebSocket %s: %v", path, err)
	}
	resp.Body.Close()
}

// runSweepKubectl runs kubectl through kproxy, when the test has it.
func runSweepKubectl(t *testing.T, k *kproxy, dir string, sw *sweep, kubeconfig string) bool {
	t.Helper()
	kubectl, err := localcluster.Binary(os.Getenv("KPROXY_BIN_DIR"), "kubectl")
	if err != nil {
		t.Logf("no kubectl (%v): the sweep sends kubectl's requests by hand only", err)
		return false
	}
	kcfg := filepath.Join(dir, "through-kproxy.kubeconfig")
	if err := localcluster.WriteKubeconfig(kcfg, "https://"+k.addr, k.caPEM, localcluster.TokenOf("admin")); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) {
		t.Helper()
		out, err := exec.Command(kubectl, append([]string{"--kubeconfig", kcfg, "-n", testNS}, args...)...).CombinedOutput()
		if err != nil {
			t.Errorf("kubectl %s: %v\n%s", args[0], err, sw.scrub(lastLines(string(out), 5)))
		}
	}
	secretFile := filepath.Join(dir, "kubectl-secret.yaml")
	for i, label := range []string{"kubectl apply Secret (create)", "kubectl apply Secret (patch)"} {
		v := sw.fresh(label)
		yaml := fmt.Sprintf("apiVersion: v1\nkind: Secret\nmetadata:\n  name: sweep-kubectl\n  labels: {kproxy.test/sweep: \"true\"}\nstringData:\n  k%d: %s\n", i, v)
		if err := os.WriteFile(secretFile, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		run("apply", "-f", secretFile)
	}
	run("create", "secret", "generic", "sweep-kubectl-generic", "--from-literal=k="+sw.fresh("kubectl create secret generic --from-literal"))
	cmFile := filepath.Join(dir, "kubectl-cm.yaml")
	if err := os.WriteFile(cmFile, []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: sweep-kubectl-kc\n  labels: {kproxy.test/sweep: \"true\"}\ndata:\n  config: |\n"+indentLines(kubeconfig, "    ")), 0o600); err != nil {
		t.Fatal(err)
	}
	run("apply", "-f", cmFile)
	return true
}

func cleanupSweep(t *testing.T) {
	cs := adminClient()
	ctx := context.Background()
	sel := metav1.ListOptions{LabelSelector: "kproxy.test/sweep=true"}
	for _, ns := range []string{testNS, "kube-system"} {
		if err := cs.CoreV1().Secrets(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
			t.Logf("cleanup: %v", err)
		}
	}
	if err := cs.CoreV1().ConfigMaps(testNS).DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		t.Logf("cleanup: %v", err)
	}
	for _, name := range []string{"sweep-kubectl-generic", "sweep-legacy-token"} {
		_ = ignoreNotFound(cs.CoreV1().Secrets(testNS).Delete(ctx, name, metav1.DeleteOptions{}))
	}
}

// waitCaptureAtLeast waits until the capture holds at least n records.
func waitCaptureAtLeast(t *testing.T, path string, n int) []record.Record {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		raw, _ := os.ReadFile(path)
		recs := readRecords(t, raw)
		if len(recs) >= n {
			return recs
		}
		if time.Now().After(deadline) {
			t.Fatalf("the capture has %d records, want at least %d", len(recs), n)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func readRecords(t *testing.T, raw []byte) []record.Record {
	t.Helper()
	var recs []record.Record
	for _, line := range bytes.Split(raw, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var r record.Record
		if err := json.Unmarshal(line, &r); err != nil {
			continue // a line being written
		}
		recs = append(recs, r)
	}
	return recs
}

// findRecord is the id of the first record of path (path and query) that
// fits what.
func findRecord(recs []record.Record, what, path string) string {
	p, q, _ := strings.Cut(path, "?")
	for _, r := range recs {
		if r.Request.Path != p || r.Request.Query != q {
			continue
		}
		switch {
		case strings.HasPrefix(what, "secret-create"), strings.HasPrefix(what, "cm-create"):
			if r.Request.Method != "POST" || !strings.Contains(string(r.Request.Body), `"sweep-`+what[len(what)-2:]) {
				continue
			}
		case strings.HasPrefix(what, "bootstrap"):
			if !strings.HasPrefix(r.Request.User, "system:bootstrap:") {
				continue
			}
		case strings.HasPrefix(what, "satoken"):
			if !strings.HasPrefix(r.Request.User, "system:serviceaccount:") {
				continue
			}
		}
		return r.ID
	}
	return ""
}

// checkSweepRecords: the capture really holds what the sweep sent, the
// bodies captured with their secrets redacted and the rest kept.
func checkSweepRecords(t *testing.T, recs []record.Record, sent int) {
	t.Helper()
	if len(recs) < sent {
		t.Errorf("the capture has %d records, want at least the %d requests sent", len(recs), sent)
	}
	redactedBodies, kubeconfigs, queries := 0, 0, 0
	for _, r := range recs {
		b := string(r.Request.Body)
		if strings.Contains(b, record.Redacted) {
			redactedBodies++
		}
		if strings.Contains(b, "https://sweep.example:6443") && strings.Contains(b, "sweep-admin") {
			kubeconfigs++
		}
		if strings.Contains(strings.ToLower(r.Request.Query), "token="+strings.ToLower(record.Redacted)) {
			queries++
		}
	}
	// Per protocol: 9 Secret writes, the bootstrap Secret, 2 TokenReviews,
	// 6 ConfigMap writes with kubeconfigs.
	if redactedBodies < 2*18 {
		t.Errorf("%d captured bodies have redacted values, want at least %d", redactedBodies, 2*18)
	}
	if kubeconfigs < 2*6 {
		t.Errorf("%d captured bodies keep the non-secret parts of a kubeconfig, want at least %d", kubeconfigs, 2*6)
	}
	if queries < 2*5 {
		t.Errorf("%d captured queries have a redacted access_token, want at least %d", queries, 2*5)
	}
}

// jaegerServiceTraces fetches every trace of service since began from
// Jaeger's query API, raw, once it has one for every record; it returns
// the JSON, the number of spans and of traces.
func jaegerServiceTraces(t *testing.T, queryURL, service string, began time.Time, recs []record.Record) ([]byte, int, int) {
	t.Helper()
	want := map[string]bool{}
	for _, r := range recs {
		if r.TraceID != "" {
			want[r.TraceID] = true
		}
	}
	u := fmt.Sprintf("%s/api/traces?service=%s&limit=100000&start=%d&end=%d", queryURL, url.QueryEscape(service),
		began.Add(-time.Minute).UnixMicro(), time.Now().Add(time.Minute).UnixMicro())
	deadline := time.Now().Add(60 * time.Second)
	var raw []byte
	var spans, missing int
	var traces map[string]bool
	for {
		raw = httpGet(t, u)
		var body struct {
			Data []struct {
				TraceID string            `json:"traceID"`
				Spans   []json.RawMessage `json:"spans"`
			} `json:"data"`
		}
		if err := json.Unmarshal(raw, &body); err != nil {
			t.Fatalf("Jaeger's answer: %v", err)
		}
		spans, traces, missing = 0, map[string]bool{}, 0
		for _, d := range body.Data {
			spans += len(d.Spans)
			traces[d.TraceID] = true
		}
		for id := range want {
			if !traces[id] {
				missing++
			}
		}
		if missing == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if missing > 0 {
		t.Errorf("Jaeger lacks %d of the %d traces of the captured records", missing, len(want))
	}
	return raw, spans, len(traces)
}

func httpGet(t *testing.T, u string) []byte {
	t.Helper()
	resp, err := http.Get(u) //nolint:gosec // a URL the test built
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: status %d, %v", u, resp.StatusCode, err)
	}
	return b
}

func httpPost(t *testing.T, u string) []byte {
	t.Helper()
	resp, err := http.Post(u, "application/json", nil) //nolint:gosec // a URL the test built
	if err != nil {
		t.Fatalf("POST %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Errorf("POST %s: status %d", u, resp.StatusCode)
	}
	return b
}

// readStream reads an event stream for d.
func readStream(u string, d time.Duration) []byte {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return b
}

// runBin runs the kproxy binary; it returns stdout, stderr and the exit
// status.
func runBin(t *testing.T, bin string, env []string, args ...string) ([]byte, []byte, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	code := exitStatus(cmd.Run())
	if code < 0 {
		t.Fatalf("kproxy %s did not run", args[0])
	}
	return stdout.Bytes(), stderr.Bytes(), code
}
