package proxy

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/decode"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/stages"
)

const lastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"

// captureBodySeeds are the conformance corpus's write bodies (JSON and
// YAML, patches of every type) and Secrets and TokenReviews in each
// encoding the apiserver accepts.
func captureBodySeeds(f *testing.F) [][]byte {
	f.Helper()
	var seeds [][]byte
	files, err := filepath.Glob(filepath.Join("..", "..", "testdata", "conformance", "*", "*.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		var cases []struct {
			Body string `json:"body"`
		}
		if yaml.Unmarshal(b, &cases) != nil {
			continue
		}
		for _, c := range cases {
			if c.Body != "" {
				seeds = append(seeds, []byte(c.Body))
			}
		}
	}
	if fuzzFlag() {
		seeds = spreadSeeds(seeds, 16)
	}
	secret := &corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "ns", Annotations: map[string]string{lastAppliedAnnotation: `{"data":{"password":"aHVudGVyMg=="}}`}},
		Data:       map[string][]byte{"password": []byte("hunter2-hunter2")}, StringData: map[string]string{"token": "t0k3n-t0k3n-t0k3n"}}
	for _, enc := range []runtime.Encoder{protobuf.NewSerializer(scheme.Scheme, scheme.Scheme), cbor.NewSerializer(scheme.Scheme, scheme.Scheme)} {
		b, err := runtime.Encode(enc, secret)
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, b)
	}
	j, err := json.Marshal(secret)
	if err != nil {
		f.Fatal(err)
	}
	y, err := yaml.JSONToYAML(j)
	if err != nil {
		f.Fatal(err)
	}
	seeds = append(seeds, j, y)
	for _, s := range []string{
		`[{"op":"add","path":"/data/password","value":"aHVudGVyMg=="},{"op":"copy","from":"/data/a","path":"/data/b"}]`,
		`{"data":{"password":"aHVudGVyMg==","$patch":"replace"},"stringData":null}`,
		`{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":"eyJhbGciOi.secret.sig","audiences":["x"]}}`,
		"kind: Secret\napiVersion: v1\nstringData: {password: hunter2-hunter2}\n---\nkind: Secret\nstringData: {b: c}\n",
		`"just a string"`, `null`, `42`, `{"kind":"Secret","data":"not a map","stringData":["a"]}`,
	} {
		seeds = append(seeds, []byte(s))
	}
	return seeds
}

// FuzzCaptureBody captures arbitrary request bodies as kproxy serve
// --capture-bodies does, for a write to a given resource. It checks that
// capturing never panics; that a write's body is either captured as JSON
// or said not to be; and that on secrets (and of any body of kind
// Secret) no data or stringData value, last-applied copy or JSON patch
// value survives, on tokenreviews no token: the values the body carried,
// read independently, appear nowhere in the record.
func FuzzCaptureBody(f *testing.F) {
	resources := []string{"secrets", "configmaps", "tokenreviews", "pods", ""}
	for i, s := range captureBodySeeds(f) {
		f.Add(s, resources[i%len(resources)], uint8(i))
		f.Add(s, "secrets", uint8(i))
	}
	f.Fuzz(func(t *testing.T, body []byte, resource string, verb uint8) {
		v := []string{"create", "update", "patch", "delete"}[verb%4]
		hr, _ := http.NewRequest(http.MethodPost, "https://kproxy/api/v1/namespaces/ns/objects", nil)
		req := &stages.Request{HTTP: hr, Body: body,
			Info: &apirequest.RequestInfo{IsResourceRequest: true, Verb: v, APIVersion: "v1", Namespace: "ns", Resource: resource}}
		var rec record.Request
		captureBody(&rec, req)
		if len(body) == 0 {
			if rec.Body != nil || rec.BodyNote != "" {
				t.Fatalf("an empty body is captured as %q (%q)", rec.Body, rec.BodyNote)
			}
			return
		}
		if (rec.Body == nil) == (rec.BodyNote == "") {
			t.Fatalf("body %q is captured as %q with note %q", body, rec.Body, rec.BodyNote)
		}
		if rec.Body == nil {
			return
		}
		if !json.Valid(rec.Body) {
			t.Fatalf("body %q is captured as invalid JSON %q", body, rec.Body)
		}
		for _, s := range secretValues(body, resource) {
			if len(s) >= 6 && bytes.Contains(rec.Body, []byte(s)) && !strings.Contains(record.Redacted, s) {
				t.Fatalf("the captured body of a write to %q repeats the secret %q:\nbody:     %q\ncaptured: %s", resource, s, body, rec.Body)
			}
		}
	})
}

// secretValues reads a body independently of the capture and lists what
// must not reach a record: a Secret's data and stringData values (as
// sent, and base64-encoded as a record would carry bytes), the
// last-applied copy, JSON patch values on secrets, a TokenReview's token.
func secretValues(body []byte, resource string) []string {
	var out []string
	add := func(v any) {
		switch v := v.(type) {
		case string:
			out = append(out, v)
			if j, err := json.Marshal(v); err == nil {
				out = append(out, strings.Trim(string(j), `"`))
			}
		case nil, bool, float64:
		default:
			if j, err := json.Marshal(v); err == nil {
				out = append(out, string(j))
			}
		}
	}
	if d, err := decode.Payload(body); err == nil && d.Object != nil {
		switch o := d.Object.(type) {
		case *corev1.Secret:
			for _, b := range o.Data {
				add(base64.StdEncoding.EncodeToString(b))
			}
			for _, s := range o.StringData {
				add(s)
			}
			add(o.Annotations[lastAppliedAnnotation])
			return out
		}
	}
	var v any
	j, err := yaml.YAMLToJSON(body)
	if err != nil || json.Unmarshal(j, &v) != nil {
		return nil
	}
	switch b := v.(type) {
	case map[string]any:
		kind, _ := b["kind"].(string)
		switch {
		case resource == "secrets" || kind == "Secret":
			for _, field := range []string{"data", "stringData"} {
				if m, ok := b[field].(map[string]any); ok {
					for _, x := range m {
						add(x)
					}
				} else {
					add(b[field])
				}
			}
			if md, ok := b["metadata"].(map[string]any); ok {
				if ann, ok := md["annotations"].(map[string]any); ok {
					add(ann[lastAppliedAnnotation])
				}
			}
		case resource == "tokenreviews" || kind == "TokenReview":
			if spec, ok := b["spec"].(map[string]any); ok {
				add(spec["token"])
			}
		}
	case []any:
		if resource == "secrets" {
			for _, op := range b {
				if m, ok := op.(map[string]any); ok {
					add(m["value"])
				}
			}
		}
	default:
		if resource == "secrets" || resource == "tokenreviews" {
			add(b)
		}
	}
	return out
}

// fuzzFlag reports a run with -fuzz (rather than go test's seed run).
func fuzzFlag() bool {
	fl := flag.Lookup("test.fuzz")
	return fl != nil && fl.Value.String() != ""
}

// spreadSeeds is n of seeds, spread evenly: with the Kubernetes packages
// instrumented, each seed's baseline coverage takes tens of milliseconds.
func spreadSeeds(seeds [][]byte, n int) [][]byte {
	if len(seeds) <= n {
		return seeds
	}
	out := make([][]byte, 0, n)
	for i := range n {
		out = append(out, seeds[i*len(seeds)/n])
	}
	return out
}
