package snapshot

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testSnapshot writes a small snapshot: configmaps whole, pods by name
// (one absent), secrets withheld, and one served document.
func testSnapshot(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(ManifestFile, `apiVersion: kproxy.dev/v1alpha1
kind: Snapshot
taken: "2026-12-01T00:00:00Z"
resourceVersion: "100"
resources:
- {version: v1, resource: configmaps, kind: ConfigMap, namespaced: true, collected: all, file: objects/core/v1/configmaps.yaml}
- {version: v1, resource: pods, kind: Pod, namespaced: true, collected: named, file: objects/core/v1/pods.yaml, absent: [a/gone]}
- {version: v1, resource: secrets, kind: Secret, namespaced: true, collected: withheld}
- {version: v1, resource: services, kind: Service, namespaced: true}
- {group: admissionregistration.k8s.io, version: v1, resource: validatingadmissionpolicies, kind: ValidatingAdmissionPolicy, collected: all, file: objects/vap.yaml}
- {version: v1, resource: namespaces, kind: Namespace, collected: all, file: objects/core/v1/namespaces.yaml}
`)
	write("objects/core/v1/namespaces.yaml", "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: sre}}\n")
	write("objects/core/v1/configmaps.yaml", `apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: ConfigMap, metadata: {name: one, namespace: a, labels: {app: x}, resourceVersion: "10"}, data: {k: v}}
- {apiVersion: v1, kind: ConfigMap, metadata: {name: two, namespace: a, resourceVersion: "11"}}
- {apiVersion: v1, kind: ConfigMap, metadata: {name: one, namespace: b, labels: {app: "y"}, resourceVersion: "12"}}
`)
	write("objects/core/v1/pods.yaml", "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: web, namespace: a}, spec: {nodeName: n1}}\n")
	write("objects/vap.yaml", "apiVersion: v1\nkind: List\nitems: []\n")
	write("served/docs.json", `[{"path":"/version","status":200,"contentType":"application/json","etag":"\"v1\"","body":"{\"gitVersion\":\"v1.37.2\"}"}]`)
	return dir
}

func TestServer(t *testing.T) {
	s, err := Load(testSnapshot(t))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(NewServer(s))
	defer srv.Close()
	for _, tc := range []struct {
		name, method, path string
		status             int
		body               []string
	}{
		{"get", "GET", "/api/v1/namespaces/a/configmaps/one", 200, []string{`"name":"one"`, `"k":"v"`}},
		{"get absent from a whole collection", "GET", "/api/v1/namespaces/a/configmaps/nope", 404, []string{`"reason":"NotFound"`}},
		{"get a named object", "GET", "/api/v1/namespaces/a/pods/web", 200, []string{`"nodeName":"n1"`}},
		{"get a name asked for and absent", "GET", "/api/v1/namespaces/a/pods/gone", 404, nil},
		{"get a name never asked for: unknown, not 404", "GET", "/api/v1/namespaces/a/pods/other", 503, []string{"kproxy snapshot --for"}},
		{"a secret: unknown", "GET", "/api/v1/namespaces/a/secrets/s", 503, []string{"never written"}},
		{"list secrets: empty", "GET", "/api/v1/namespaces/a/secrets", 200, []string{`"kind":"SecretList"`, `"items":[]`}},
		{"list all namespaces", "GET", "/api/v1/configmaps", 200, []string{`"namespace":"a"`, `"namespace":"b"`, `"resourceVersion":"100"`}},
		{"list a namespace", "GET", "/api/v1/namespaces/b/configmaps", 200, []string{`"labels":{"app":"y"}`}},
		{"label selector", "GET", "/api/v1/configmaps?labelSelector=app%3Dx", 200, []string{`"app":"x"`}},
		{"field selector", "GET", "/api/v1/configmaps?fieldSelector=metadata.name%3Dtwo", 200, []string{`"name":"two"`}},
		{"bad selector", "GET", "/api/v1/configmaps?labelSelector=%3D%3D", 400, nil},
		{"list a partial collection: unknown", "GET", "/api/v1/namespaces/a/pods", 503, nil},
		{"not collected: unknown", "GET", "/api/v1/namespaces/a/services/x", 503, nil},
		{"a cluster-scoped group resource", "GET", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies", 200, []string{`"kind":"ValidatingAdmissionPolicyList"`}},
		{"not served", "GET", "/apis/example.com/v1/widgets", 404, nil},
		// Its own path resolves with namespace = name (a probe: 404).
		{"a namespace by its own path", "GET", "/api/v1/namespaces/sre", 200, []string{`"name":"sre"`}},
		{"a namespace absent", "GET", "/api/v1/namespaces/nope", 404, nil},
		{"a served document", "GET", "/version", 200, []string{"v1.37.2"}},
		{"a document not kept: unknown", "GET", "/healthz", 503, []string{"does not hold /healthz"}},
		{"read-only", "POST", "/api/v1/namespaces/a/configmaps", 405, []string{"read-only"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, srv.URL+tc.path, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			for _, w := range tc.body {
				if !strings.Contains(string(b), w) {
					t.Errorf("body does not contain %s: %s", w, b)
				}
			}
			if tc.name == "label selector" && strings.Contains(string(b), `"app":"y"`) {
				t.Errorf("the selector let app=y through: %s", b)
			}
		})
	}
	t.Run("conditional document", func(t *testing.T) {
		req, _ := http.NewRequest("GET", srv.URL+"/version", nil)
		req.Header.Set("If-None-Match", `"v1"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotModified {
			t.Errorf("status %d, want 304", resp.StatusCode)
		}
	})
}

// TestWatchList: informers' watch-list gets every object, then the
// bookmark that ends the initial events, then nothing.
func TestWatchList(t *testing.T) {
	s, err := Load(testSnapshot(t))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(NewServer(s))
	defer srv.Close()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(srv.URL + "/api/v1/configmaps?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var types []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var ev struct {
			Type   string
			Object struct {
				Metadata struct {
					Annotations map[string]string
				}
			}
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("%v: %s", err, sc.Text())
		}
		types = append(types, ev.Type)
		if ev.Type == "BOOKMARK" && ev.Object.Metadata.Annotations["k8s.io/initial-events-end"] != "true" {
			t.Error("the bookmark does not end the initial events")
		}
	}
	if got := strings.Join(types, ","); got != "ADDED,ADDED,ADDED,BOOKMARK" {
		t.Errorf("events %s", got)
	}
}

func TestOverlay(t *testing.T) {
	dir := testSnapshot(t)
	s, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	ov := filepath.Join(t.TempDir(), "ov.yaml")
	if err := os.WriteFile(ov, []byte(`apiVersion: v1
kind: ConfigMap
metadata: {name: two, namespace: a}
data: {new: value}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: one, namespace: b, annotations: {kproxy.dev/overlay: absent}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: p}
spec: {}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	defaulted := 0
	changes, err := s.Apply(ov, func(o map[string]any) (map[string]any, error) { defaulted++; return o, nil })
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(changes, "; "); got != "replaced ConfigMap a/two; removed ConfigMap b/one; added ValidatingAdmissionPolicy p" {
		t.Errorf("changes: %s", got)
	}
	if defaulted != 2 {
		t.Errorf("defaulted %d objects, want the 2 that are not removed", defaulted)
	}
	cm, _ := s.Resource("", "v1", "configmaps")
	if o, ok := s.Get(cm, "a", "two"); !ok || !strings.Contains(string(o.Raw), `"new":"value"`) || !strings.Contains(string(o.Raw), `"resourceVersion":"101"`) {
		t.Errorf("replaced object: %v %s", ok, o.Raw)
	}
	if _, ok := s.Get(cm, "b", "one"); ok {
		t.Error("the absent object is still there")
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	_ = os.WriteFile(bad, []byte("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: s}\n"), 0o644)
	_, err = s.Apply(bad, nil)
	if err == nil || !strings.Contains(err.Error(), "does not serve example.com/v1 Widget") || !strings.Contains(err.Error(), "Secrets are never part of a snapshot") || !strings.Contains(err.Error(), "document 2") {
		t.Errorf("bad overlay: %v", err)
	}
}

func TestLoadErrors(t *testing.T) {
	if _, err := Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "kproxy snapshot -o") {
		t.Errorf("an empty directory: %v", err)
	}
	dir := t.TempDir()
	_ = os.WriteFile(filepath.Join(dir, ManifestFile), []byte("apiVersion: v1\nkind: Pod\n"), 0o644)
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "want kproxy.dev/v1alpha1 Snapshot") {
		t.Errorf("not a snapshot: %v", err)
	}
}
