package e2e

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestApiserverAbortIsMirrored: kube-apiserver v1.37.2 panics on a
// protobuf body sent to a custom resource (its handler has no protobuf
// serializer for it) and aborts the request: over HTTP/2 the stream is
// reset, over HTTP/1.1 the connection closed, no answer. Through kproxy
// the client had got kproxy's 502 instead (found by a probe); its request
// is aborted alike now, and the record says the apiserver hung up.
func TestApiserverAbortIsMirrored(t *testing.T) {
	crd := filepath.Join(t.TempDir(), "crd.yaml")
	if err := os.WriteFile(crd, []byte(`apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: aborts.abort.kproxy.test}
spec:
  group: abort.kproxy.test
  names: {kind: Abort, plural: aborts}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	applyManifest(t, "apply", "-f", crd)
	t.Cleanup(func() { applyManifest(t, "delete", "-f", crd, "--wait=false") })
	applyManifest(t, "wait", "--for=condition=Established", "--timeout=60s", "crd/aborts.abort.kproxy.test")

	r, recs := recordedKproxy(t)
	path := "/apis/abort.kproxy.test/v1/namespaces/" + testNS + "/aborts"
	h2 := r
	h2.name, h2.h2 = "reverse-h2", true
	direct := directRoute()
	for _, rt := range []route{r, h2} {
		direct.h2 = rt.h2
		send := func(via route) error {
			req, _ := http.NewRequest("POST", via.base+path, bytes.NewReader([]byte("k8s\x00junk")))
			req.Header.Set("Content-Type", "application/vnd.kubernetes.protobuf")
			req.Header.Set("Authorization", "Bearer "+tokenOf("admin"))
			resp, err := via.client(nil).Do(req)
			if err == nil {
				resp.Body.Close()
				t.Logf("%s: %d", via.name, resp.StatusCode)
			}
			return err
		}
		if err := send(direct); err == nil {
			t.Fatalf("directly (h2 %v): the apiserver answered a protobuf body to a custom resource; this test needs the request aborted", rt.h2)
		}
		if err := send(rt); err == nil {
			t.Errorf("through kproxy (h2 %v): an answer, where directly the request was aborted", rt.h2)
		}
		rec := nextRecord(t, recs)
		if !strings.Contains(rec.Actual.Error, "closed the connection without answering") || !rec.Actual.NoAnswer() {
			t.Errorf("through kproxy (h2 %v): actual %+v, want the apiserver's hang-up, no answer", rt.h2, rec.Actual)
		}
	}
}
