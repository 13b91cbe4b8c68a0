package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/localcluster"
)

var createOpts = metav1.CreateOptions{}

func namespace(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

func tokenOf(name string) string {
	switch name {
	case "":
		return ""
	case "bad":
		return "not-a-valid-token"
	}
	return localcluster.TokenOf(name)
}

// exchange is what a client saw for one request.
type exchange struct {
	status  int
	header  http.Header
	body    []byte
	norm    string // body with volatile fields removed
	rawBody bool   // body is not JSON
}

type request struct {
	method, path, body, contentType, accept, user string
	header                                        http.Header
}

func do(t testing.TB, c *http.Client, base string, r request) exchange {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), r.method, base+r.path, strings.NewReader(r.body))
	if err != nil {
		t.Fatal(err)
	}
	if r.body != "" {
		ct := r.contentType
		if ct == "" {
			ct = "application/json"
		}
		req.Header.Set("Content-Type", ct)
	}
	if r.accept != "" {
		req.Header.Set("Accept", r.accept)
	}
	if tok := tokenOf(r.user); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", r.method, r.path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		// What came before the cut, to tell kproxy's doing from the
		// apiserver's (a reverse proxy cuts the body where its upstream did).
		t.Fatalf("%s %s: read body: %v after %d bytes of a %s %d answer (Content-Length %q, Content-Encoding %q, Transfer-Encoding %v, uncompressed by the client %v, Audit-Id %q)",
			r.method, r.path, err, len(b), resp.Proto, resp.StatusCode, resp.Header.Get("Content-Length"), resp.Header.Get("Content-Encoding"),
			resp.TransferEncoding, resp.Uncompressed, resp.Header.Get("Audit-Id"))
	}
	ex := exchange{status: resp.StatusCode, header: resp.Header, body: b}
	ex.norm, ex.rawBody = normalize(b)
	return ex
}

// volatile are fields that differ between two otherwise identical
// requests: every write makes a new uid, resourceVersion and timestamps.
var volatile = map[string]bool{
	"resourceVersion": true, "uid": true, "creationTimestamp": true, "time": true,
	"deletionTimestamp": true, "continue": true,
}

// normalize drops volatile fields from a JSON body and re-encodes it
// canonically; other bodies are returned as they are.
func normalize(b []byte) (string, bool) {
	var v any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return string(b), true
	}
	v = strip(stripAge(v))
	out, _ := json.Marshal(v)
	return string(out), false
}

// stripAge blanks a Table's Age cells: the apiserver computes them from
// its clock when it answers, so two answers a second apart differ there.
func stripAge(v any) any {
	t, ok := v.(map[string]any)
	if !ok || t["kind"] != "Table" {
		return v
	}
	cols, _ := t["columnDefinitions"].([]any)
	rows, _ := t["rows"].([]any)
	for i, c := range cols {
		if m, _ := c.(map[string]any); m["name"] != "Age" {
			continue
		}
		for _, r := range rows {
			row, _ := r.(map[string]any)
			if cells, _ := row["cells"].([]any); i < len(cells) {
				cells[i] = "(age)"
			}
		}
	}
	return v
}

func strip(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if volatile[k] {
				delete(x, k)
				continue
			}
			x[k] = strip(e)
		}
	case []any:
		for i := range x {
			x[i] = strip(x[i])
		}
		// managedFields entries written in the same second have no
		// defined order; sort them by manager and operation.
		sort.SliceStable(x, func(i, j int) bool { return managerKey(x[i]) < managerKey(x[j]) })
	}
	return v
}

func managerKey(v any) string {
	m, ok := v.(map[string]any)
	if !ok {
		return ""
	}
	mgr, _ := m["manager"].(string)
	op, _ := m["operation"].(string)
	return mgr + "/" + op
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func ignoreAlreadyExists(err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}
