package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/kproxy/kproxy/internal/stages"
)

// answerReplayer keeps the answer each replay was handed.
type answerReplayer struct {
	mu      sync.Mutex
	answers map[string]stages.Answer
}

func (r *answerReplayer) Run(ctx context.Context, req *stages.Request) stages.Outcome {
	a, _ := req.Actual(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answers[req.HTTP.Method+" "+req.HTTP.URL.Path] = a
	return stages.Outcome{}
}

// TestGetAnswerHandedToReplay: the replay of a get answered 200 is handed
// the whole body with its content type (it takes the object from there);
// nothing else hands it a body.
func TestGetAnswerHandedToReplay(t *testing.T) {
	const cm = `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"cm","namespace":"default","resourceVersion":"7"}}`
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasSuffix(r.URL.Path, "/missing"):
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
		case r.Method == http.MethodPost:
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, cm)
		default:
			_, _ = io.WriteString(w, cm[:40]) // in two writes, as a stream would
			_, _ = io.WriteString(w, cm[40:])
		}
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	rp := &answerReplayer{answers: map[string]stages.Answer{}}
	p, err := New(Config{Upstream: u, Passthrough: http.DefaultTransport, Replayer: rp})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(p)
	defer front.Close()
	const base = "/api/v1/namespaces/default/configmaps"
	for _, r := range []struct{ method, path string }{
		{"GET", base + "/cm"}, {"GET", base + "/missing"}, {"GET", "/api/v1/namespaces/default/pods/p/status"}, {"POST", base},
	} {
		req, _ := http.NewRequest(r.method, front.URL+r.path, strings.NewReader(""))
		if r.method == "POST" {
			req.Body = io.NopCloser(strings.NewReader(cm))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	p.Drain()
	rp.mu.Lock()
	defer rp.mu.Unlock()
	cases := []struct {
		key      string
		status   int
		body, rv string
	}{
		{"GET " + base + "/cm", 200, cm, ""},
		{"GET " + base + "/missing", 404, "", ""},
		{"GET /api/v1/namespaces/default/pods/p/status", 200, "", ""}, // a subresource: not the object's own answer
		{"POST " + base, 201, "", "7"},                                // a write: its resourceVersion, not its body
	}
	for _, c := range cases {
		a, ok := rp.answers[c.key]
		switch {
		case !ok:
			t.Errorf("%s: not replayed", c.key)
		case a.Status != c.status || string(a.Body) != c.body || a.ResourceVersion != c.rv:
			t.Errorf("%s: answer %d %q rv %q, want %d %q rv %q", c.key, a.Status, a.Body, a.ResourceVersion, c.status, c.body, c.rv)
		case c.body != "" && a.ContentType != "application/json":
			t.Errorf("%s: content type %q, want the answer's", c.key, a.ContentType)
		}
	}
}
