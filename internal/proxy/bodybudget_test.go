package proxy

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/record"
)

// TestBodyBudget holds replays of writes while more arrive: bodies that
// fit the budget are replayed whole; past it, a write still goes upstream
// byte for byte and its record says unknown, naming the budget; once the
// replays end the budget is whole again. Each body is sent both with its
// length declared (reserved at once) and streamed without one (reserved
// as it arrives).
func TestBodyBudget(t *testing.T) {
	const budget = 1 << 20
	const size = 400 << 10 // two fit, the third does not
	var mu sync.Mutex
	got := map[[32]byte]int{}
	up := tlsUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got[sha256.Sum256(b)]++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x","resourceVersion":"5"}}`)
	})

	for _, declared := range []bool{true, false} {
		name := map[bool]string{true: "length declared", false: "streamed"}[declared]
		t.Run(name, func(t *testing.T) {
			replayer := &gatedReplayer{}
			gate := replayer.hold()
			sink := &records{}
			p, err := New(Config{Upstream: up.URL, Passthrough: up.Passthrough, Replayer: replayer, Sink: sink,
				ReplayWorkers: 4, ReplayQueue: 4, ReplayBodyBudget: budget, Metrics: metrics.New(prometheus.NewRegistry())})
			if err != nil {
				t.Fatal(err)
			}
			front := httptest.NewTLSServer(p)
			defer front.Close()
			client := front.Client()
			client.Timeout = 10 * time.Second

			bodies := make([][]byte, 3)
			for i := range bodies {
				bodies[i] = []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"b` + string(rune('0'+i)) + `"},"data":{"v":"` +
					strings.Repeat(string(rune('a'+i)), size) + `"}}`)
				var r io.Reader = bytes.NewReader(bodies[i])
				if !declared {
					r = io.MultiReader(r) // no length: sent chunked
				}
				req, _ := http.NewRequest(http.MethodPost, front.URL+"/api/v1/namespaces/default/configmaps", r)
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					t.Fatalf("write %d: %v (forwarding waited?)", i, err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					t.Fatalf("write %d: status %d", i, resp.StatusCode)
				}
				mu.Lock()
				n := got[sha256.Sum256(bodies[i])]
				mu.Unlock()
				if n == 0 {
					t.Fatalf("write %d did not reach the upstream byte for byte", i)
				}
			}
			// The third was over the budget: recorded at once, unknown.
			poll(t, "the shed write's record", func() bool { return len(sink.list()) == 1 })
			rec := sink.list()[0]
			if rec.Predicted.Stage != record.StageUnknown || rec.Predicted.Message != ShedBodyMessage {
				t.Errorf("over the budget: predicted %+v, want unknown: %q", rec.Predicted, ShedBodyMessage)
			}
			if held := p.bodies.held(); held < 2*size || held > budget {
				t.Errorf("held %d bytes while two replays wait, want the two bodies (%d..%d)", held, 2*size, budget)
			}
			close(gate)
			poll(t, "every record", func() bool { return len(sink.list()) == 3 })
			for _, rec := range sink.list()[1:] {
				if rec.Predicted.Status != http.StatusCreated {
					t.Errorf("a write within the budget: predicted %+v, want its replay", rec.Predicted)
				}
			}
			poll(t, "the budget whole again", func() bool { return p.bodies.held() == 0 })
		})
	}
}

// TestTeeBodyStopsAfterFinish: once the replay has the copy, a late read
// (the transport still sending the body after the exchange ended) does
// not write into it.
func TestTeeBodyStopsAfterFinish(t *testing.T) {
	var got teeResult
	tb := newTeeBody(io.NopCloser(strings.NewReader("abcdef")), 100, 0, &bodyBudget{limit: 1 << 10}, func(r teeResult) { got = r })
	buf := make([]byte, 3)
	if _, err := tb.Read(buf); err != nil {
		t.Fatal(err)
	}
	tb.finish()
	if _, err := tb.Read(buf); err != nil {
		t.Fatal(err)
	}
	if string(got.body) != "abc" || !got.truncated {
		t.Errorf("copy %q truncated=%v, want %q truncated (not read to the end)", got.body, got.truncated, "abc")
	}
	tb.release()
	if held := tb.budget.held(); held != 0 {
		t.Errorf("held %d after release", held)
	}
}

// TestFreeTextScrubbedOrWithheld: a policy's refusal and warning quoting
// a Secret's value in free text are scrubbed of the body's values; when
// the body was over the budget and not kept, nothing is left to scrub
// them by, and the text is withheld (a Secret quoted by a policy reached
// records otherwise).
func TestFreeTextScrubbedOrWithheld(t *testing.T) {
	const budget = 64 << 10
	up := tlsUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		// The policy quotes the value base64-encoded, as CEL renders a
		// Secret's data.
		_, v, _ := strings.Cut(string(b), `"pw":"`)
		v, _, _ = strings.Cut(v, `"`)
		quoted := "pw rejected: " + base64.StdEncoding.EncodeToString([]byte(v))
		w.Header().Set("Warning", `299 - "`+quoted+`"`)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Invalid","code":422,"message":"secrets \"s\" is forbidden: `+quoted+`"}`)
	})
	replayer := &gatedReplayer{}
	close(replayer.hold()) // replays run at once
	sink := &records{}
	p, err := New(Config{Upstream: up.URL, Passthrough: up.Passthrough, Replayer: replayer, Sink: sink,
		ReplayWorkers: 2, ReplayQueue: 2, ReplayBodyBudget: budget, Metrics: metrics.New(prometheus.NewRegistry())})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewTLSServer(p)
	defer front.Close()
	for _, c := range []struct {
		name, value string
		pad         int
	}{
		{"kept", "kept-secret-value-1", 0},
		{"over the budget", "dropped-secret-value-2", 2 * budget},
	} {
		body := `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","annotations":{"pad":"` + strings.Repeat("x", c.pad) + `"}},"stringData":{"pw":"` + c.value + `"}}`
		resp, err := front.Client().Post(front.URL+"/api/v1/namespaces/default/secrets", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if !strings.Contains(resp.Header.Get("Warning"), "pw rejected: "+base64.StdEncoding.EncodeToString([]byte(c.value))) {
			t.Fatalf("%s: the client's Warning header was changed: %q", c.name, resp.Header.Get("Warning"))
		}
		var rec *record.Record
		poll(t, c.name+": the record", func() bool {
			for _, r := range sink.list() {
				if strings.Contains(r.Request.Path, "secrets") && r.ID != "" && (c.pad == 0) == (r.Predicted.Message != ShedBodyMessage) {
					rec = r
					return true
				}
			}
			return false
		})
		j, _ := json.Marshal(rec)
		if strings.Contains(string(j), base64.StdEncoding.EncodeToString([]byte(c.value))) {
			t.Errorf("%s: the record holds the quoted value: %s", c.name, j)
		}
		texts := append([]string{rec.Actual.Message}, append(rec.Actual.Warnings, rec.Actual.Headers["Warning"]...)...)
		for _, s := range texts {
			if c.pad == 0 && !strings.Contains(s, "pw rejected: "+record.Redacted) {
				t.Errorf("%s: %q, want the value scrubbed from the policy's words", c.name, s)
			}
			if c.pad > 0 && s != withheldText {
				t.Errorf("%s: %q, want it withheld", c.name, s)
			}
		}
	}
}

// TestUnreplayedSecretWriteWithheld: a patch of a Secret whose replay was
// shed: a policy's words may quote the stored Secret's data, which only
// the replay reads, so they are withheld; the apiserver's own words (a
// 404) are kept.
func TestUnreplayedSecretWriteWithheld(t *testing.T) {
	up := tlsUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodPost:
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x","resourceVersion":"5"}}`)
		case strings.HasSuffix(r.URL.Path, "/missing"):
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":"secrets \"missing\" not found"}`)
		default:
			w.Header().Set("Warning", `299 - "stored pw: c3RvcmVkLXNlY3JldA=="`)
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Invalid","code":422,"message":"secrets \"s\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'p' denied request: stored pw: c3RvcmVkLXNlY3JldA=="}`)
		}
	})
	replayer := &gatedReplayer{}
	gate := replayer.hold()
	defer close(gate)
	sink := &records{}
	p, err := New(Config{Upstream: up.URL, Passthrough: up.Passthrough, Replayer: replayer, Sink: sink,
		ReplayWorkers: 1, ReplayQueue: 1, Metrics: metrics.New(prometheus.NewRegistry())})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewTLSServer(p)
	defer front.Close()
	send := func(method, path, body string) {
		t.Helper()
		req, _ := http.NewRequest(method, front.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/merge-patch+json")
		resp, err := front.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// Two writes fill the worker and the queue; the patches are shed.
	send(http.MethodPost, "/api/v1/namespaces/default/configmaps", `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a"}}`)
	send(http.MethodPost, "/api/v1/namespaces/default/configmaps", `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"b"}}`)
	send(http.MethodPatch, "/api/v1/namespaces/default/secrets/s", `{"metadata":{"labels":{"a":"b"}}}`)
	send(http.MethodPatch, "/api/v1/namespaces/default/secrets/missing", `{"metadata":{"labels":{"a":"b"}}}`)
	poll(t, "the shed patches' records", func() bool { return len(sink.list()) == 2 })
	for _, rec := range sink.list() {
		if rec.Predicted.Stage != record.StageUnknown {
			t.Fatalf("%s: predicted %+v, want it shed", rec.Request.Path, rec.Predicted)
		}
		j, _ := json.Marshal(rec)
		if strings.Contains(string(j), "c3RvcmVkLXNlY3JldA") {
			t.Errorf("%s: the record holds the policy's quote of the stored value: %s", rec.Request.Path, j)
		}
		if strings.HasSuffix(rec.Request.Path, "/missing") {
			if rec.Actual.Message != `secrets "missing" not found` {
				t.Errorf("the apiserver's own 404 was changed: %q", rec.Actual.Message)
			}
			continue
		}
		if rec.Actual.Message != withheldUnreplayedText || len(rec.Actual.Warnings) != 1 || rec.Actual.Warnings[0] != withheldUnreplayedText {
			t.Errorf("the policy's words: %q, warnings %q, want them withheld", rec.Actual.Message, rec.Actual.Warnings)
		}
	}
}
