package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
)

// prompt bounds every "promptly" below: generous, since the machine is
// shared; the point is that nothing hangs.
const prompt = 30 * time.Second

// TestFaultsMidRequest breaks things in the middle of requests, on a
// cluster of its own, with kproxy as its own process exporting traces to
// an OTLP endpoint that refuses connections: clients that go away
// mid-LIST and clients whose bodies stop arriving
// (--request-body-idle-timeout ends them), after which kproxy's
// goroutines come back to their level; the apiserver killed while two
// large LISTs (HTTP/1.1 and HTTP/2) stream through kproxy, and while a
// large POST's body is still arriving (the clients get an error or a
// 502, promptly); the apiserver restarted (traffic and predictions
// recover); SIGTERM then ends kproxy promptly despite the collector.
// Every request has exactly one whole record, and no record of an
// interrupted request claims an answer the apiserver did not give.
func TestFaultsMidRequest(t *testing.T) {
	ctx := context.Background()
	c, err := localcluster.Start(ctx, localcluster.Options{Log: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	admin := adminClientFor(c)
	if err := localcluster.GrantKproxy(ctx, admin, "kproxy"); err != nil {
		t.Fatal(err)
	}
	const ns = "midrequest"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, namespace(ns), createOpts); err != nil {
		t.Fatal(err)
	}
	// ~64 MiB of ConfigMaps: more than the buffers between the apiserver
	// and the client can hold (kproxy's upstream socket alone may grow
	// to tcp_rmem's maximum, 32 MiB on some hosts), so a client that
	// stops reading keeps the LIST in flight.
	began := time.Now()
	populate(t, c, ns, 1000, 64<<10)
	t.Logf("populated 1000 ConfigMaps of 64 KiB in %v", time.Since(began).Round(time.Millisecond))

	capture := filepath.Join(t.TempDir(), "capture.jsonl")
	otlp := closedPort(t)
	k := startKproxyProcess(t, processOptions{cluster: c, capture: capture,
		args: []string{"--request-body-idle-timeout=3s"},
		// Batches every 200 ms: the refused exports happen during the test.
		env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + otlp, "OTEL_BSP_SCHEDULE_DELAY=200"}})

	// The HTTP/1.1 client's receive buffer is fixed small (autotuned, it
	// could take most of a LIST); HTTP/2's flow control bounds the other.
	smallBuffer := &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) {
			err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 64<<10)
		}); cerr != nil {
			return cerr
		}
		return err
	}}
	tr1 := &http.Transport{DialContext: smallBuffer.DialContext, TLSClientConfig: &tls.Config{RootCAs: k.pool}}
	tr2 := &http2.Transport{TLSClientConfig: &tls.Config{RootCAs: k.pool}}
	h1, h2 := &http.Client{Transport: tr1}, &http.Client{Transport: tr2}
	ids := &auditIDs{}
	newReq := func(ctx context.Context, what, method, path string, body io.Reader) (*http.Request, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, "https://"+k.addr+path, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+localcluster.TokenOf("admin"))
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		id := ids.add(what)
		req.Header.Set("Audit-Id", id)
		return req, id
	}
	// roundTrip sends a whole request, bounded by prompt.
	roundTrip := func(client *http.Client, what, method, path, body string) (int, string, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, prompt)
		defer cancel()
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, id := newReq(ctx, what, method, path, rd)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("%s %s: reading the body: %v", method, path, err)
		}
		return resp.StatusCode, string(b), id
	}
	listPath := "/api/v1/namespaces/" + ns + "/configmaps"
	if code, body, _ := roundTrip(h1, "warm", "GET", listPath+"/cm-000", ""); code != http.StatusOK {
		t.Fatalf("through kproxy: %d %s", code, body)
	}
	type stream struct {
		name string
		resp *http.Response
	}
	// openList starts a LIST of the ~64 MiB and reads its first MiB.
	openList := func(ctx context.Context, client *http.Client, what string) stream {
		t.Helper()
		req, _ := newReq(ctx, what, "GET", listPath, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", what, resp.StatusCode)
		}
		if _, err := io.CopyN(io.Discard, resp.Body, 1<<20); err != nil {
			t.Fatalf("%s: the first MiB: %v", what, err)
		}
		return stream{what, resp}
	}
	clients := []struct {
		name string
		c    *http.Client
	}{{"h1", h1}, {"h2", h2}}
	// settled waits until kproxy's goroutines are back to at most
	// base's (plus a margin), with nothing replaying.
	settled := func(base state) (state, error) {
		tr1.CloseIdleConnections()
		tr2.CloseIdleConnections()
		var s state
		err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			s = kproxyState(t, k.cmd.Process.Pid, k.metricsAddr)
			return s.queue == 0 && s.busy == 0 && s.goroutines <= base.goroutines+16, nil
		})
		return s, err
	}

	// (d) Clients that go away 1 MiB into a LIST, and clients whose
	// bodies stop arriving (--request-body-idle-timeout=3s ends them):
	// nothing is created, and kproxy's goroutines come back to their
	// level. First, before any kill: the count compares only while the
	// replay's caches keep their watches (after an apiserver restart they
	// come back with a backoff of up to a minute). Eight of each per
	// protocol: one goroutine kept per request would show past the
	// margin.
	const each = 8
	tr1.CloseIdleConnections()
	base := kproxyState(t, k.cmd.Process.Pid, k.metricsAddr)
	for _, cl := range clients {
		for range each {
			lctx, cancel := context.WithCancel(ctx)
			s := openList(lctx, cl.c, "list-abandoned-"+cl.name)
			cancel()
			s.resp.Body.Close()
		}
	}
	type stall struct {
		name string
		res  <-chan postResult
		w    *slowWriter
	}
	var stalls []stall
	for _, cl := range clients {
		for i := range each {
			name := fmt.Sprintf("stalled-%s-%d", cl.name, i)
			res, w := slowPost(cl.c, func(body io.Reader) *http.Request {
				req, _ := newReq(ctx, "body-"+name, "POST", listPath, body)
				return req
			}, name)
			if err := w.wrote(64<<10, prompt); err != nil {
				t.Fatal(err)
			}
			w.pause() // the body stops arriving; the request stays open
			stalls = append(stalls, stall{name, res, w})
		}
	}
	peak := kproxyState(t, k.cmd.Process.Pid, k.metricsAddr)
	for _, s := range stalls {
		select {
		case r := <-s.res:
			t.Logf("%s: the client got status %d %q, error %v", s.name, r.status, strings.TrimSpace(r.body), r.err)
			// The client's own doing: 408, saying so (not a 502 blaming
			// the apiserver, nor a 499).
			if r.err == nil && (r.status != http.StatusRequestTimeout || !strings.Contains(r.body, "stopped arriving")) {
				t.Errorf("%s: %d %q, want 408 saying the body stopped arriving", s.name, r.status, r.body)
			}
		case <-time.After(prompt):
			t.Errorf("%s: kproxy did not end it within %v (--request-body-idle-timeout=3s)", s.name, prompt)
		}
		s.w.stop()
		if _, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, s.name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the ConfigMap whose body stalled (%s): %v, want NotFound", s.name, err)
		}
	}
	after, err := settled(base)
	t.Logf("goroutines: %d before, %d with %d bodies stalled, %d after; open files %d → %d",
		base.goroutines, peak.goroutines, len(stalls), after.goroutines, base.fds, after.fds)
	if err != nil {
		t.Errorf("kproxy's goroutines did not come back after the abandoned LISTs and stalled bodies: %d before, %d after (replay queue %d, busy %d)",
			base.goroutines, after.goroutines, after.queue, after.busy)
	}
	if after.fds > base.fds+16 {
		t.Errorf("kproxy's open files: %d before, %d after", base.fds, after.fds)
	}

	// (a) The apiserver dies while two LISTs stream through kproxy, 1 MiB
	// read of each: the clients see the rest end in an error (a
	// truncated body), promptly.
	killed := []stream{openList(ctx, h1, "list-killed-h1"), openList(ctx, h2, "list-killed-h2")}
	c.KillAPIServer()
	for _, s := range killed {
		n, err, hung := drain(s.resp.Body, prompt)
		switch {
		case hung:
			t.Errorf("%s: the LIST through kproxy did not end within %v of the apiserver's death", s.name, prompt)
		case err == nil:
			t.Errorf("%s: the LIST ended cleanly (%d more bytes) though the apiserver was killed in its middle: a truncated body must not look whole (or the LIST was not in flight: populate more)", s.name, n)
		default:
			t.Logf("%s: %d more bytes, then %v", s.name, n, err)
		}
	}

	// The apiserver back: kproxy forwards again.
	heal := func(what string) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
			code, _, _ := roundTrip(h1, what, "GET", listPath+"/cm-000", "")
			return code == http.StatusOK, nil
		})
		if err != nil {
			t.Fatalf("%s: kproxy did not heal: %v", what, err)
		}
	}
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	heal("heal-after-list")

	// (b) The apiserver dies while a large POST's body is on its way,
	// sent slowly: the client gets an error or kproxy's 502, promptly.
	res, pw := slowPost(h1, func(body io.Reader) *http.Request {
		req, _ := newReq(ctx, "write-killed", "POST", listPath, body)
		return req
	}, "slow-write")
	if err := pw.wrote(256<<10, prompt); err != nil {
		t.Fatal(err)
	}
	c.KillAPIServer()
	select {
	case r := <-res:
		switch {
		case r.err != nil:
			t.Logf("write killed mid-body: the client got %v", r.err)
		case r.status == http.StatusBadGateway && strings.Contains(r.body, "kproxy"):
			t.Logf("write killed mid-body: the client got kproxy's 502: %s", strings.TrimSpace(r.body))
		default:
			t.Errorf("write killed mid-body: %d %q, want an error or kproxy's 502", r.status, r.body)
		}
	case <-time.After(prompt):
		t.Errorf("write killed mid-body: no answer within %v", prompt)
	}
	pw.stop()

	// (c) The apiserver restarted: traffic and predictions recover; the
	// half-sent object was never created.
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	heal("heal-after-write")
	if _, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, "slow-write", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the ConfigMap whose body was cut: %v, want NotFound", err)
	}
	var last *record.Record
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(context.Context) (bool, error) {
		code, _, id := roundTrip(h1, "predict-read", "GET", listPath+"/cm-001", "")
		last = awaitRecord(capture, id)
		return code == http.StatusOK && last != nil && last.Predicted.Status == http.StatusOK && last.Predicted.Stage == "", nil
	})
	if err != nil {
		t.Errorf("read predictions did not recover after the restart: %v; the last read's record: %+v", err, last)
	}
	for _, cl := range clients {
		code, body, id := roundTrip(cl.c, "predict-write", "POST", listPath, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"after-restart-`+cl.name+`"}}`)
		if code != http.StatusCreated {
			t.Errorf("a write after the restart over %s: %d %s", cl.name, code, body)
		} else if r := awaitRecord(capture, id); r == nil || r.Predicted.Status != http.StatusCreated {
			t.Errorf("a write after the restart over %s: predicted %+v, want 201", cl.name, r)
		}
	}
	// Nothing held for the requests the kills cut either (an upper bound
	// only: the caches' watches may still be coming back).
	if after, err := settled(base); err != nil {
		t.Errorf("kproxy's goroutines after the apiserver's deaths: %d, %d before them", after.goroutines, base.goroutines)
	} else {
		t.Logf("goroutines after the apiserver's deaths: %d", after.goroutines)
	}

	// The spans the refusing collector never took are counted, as lost.
	// Its exporter gives a batch up after OTEL_EXPORTER_OTLP_TIMEOUT (10 s).
	var spans map[string]float64
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(context.Context) (bool, error) {
		spans = scrapeSeries(t, k.metricsAddr, "kproxy_otlp_items_total")
		return spans[`{result="failed",signal="traces"}`] > 0, nil
	})
	if err != nil || spans[`{result="exported",signal="traces"}`] != 0 {
		t.Errorf("spans sent to a refusing collector, kproxy_otlp_items_total: %v, want some failed and none exported", spans)
	} else {
		t.Logf("spans sent to a refusing collector: %v", spans)
	}

	// (e) SIGTERM: kproxy exits promptly, though its trace collector
	// refuses every connection.
	took := k.stop(t, serve.ShutdownTimeout+25*time.Second)
	t.Logf("kproxy exited %v after SIGTERM", took.Round(time.Millisecond))
	logs, _ := os.ReadFile(k.logPath)
	if !bytes.Contains(logs, []byte("trace export failed")) {
		t.Errorf("kproxy never tried its OTLP endpoint (no \"trace export failed\" in its log): the test did not exercise a refusing collector\n%s", logs)
	}

	// Every request: exactly one whole record; the interrupted ones claim
	// no answer the apiserver did not give.
	recs := wholeRecords(t, capture)
	byID := map[string][]record.Record{}
	for _, r := range recs {
		byID[r.Actual.AuditID] = append(byID[r.Actual.AuditID], r)
	}
	for _, id := range ids.all() {
		if n := len(byID[id]); n != 1 {
			t.Errorf("request %s: %d records, want 1", id, n)
		}
	}
	if len(recs) != len(ids.all()) {
		t.Errorf("%d records for %d requests", len(recs), len(ids.all()))
	}
	for _, r := range recs {
		what, _, _ := strings.Cut(r.Actual.AuditID, "#")
		interrupted := strings.HasPrefix(what, "list-") || strings.HasPrefix(what, "write-") || strings.HasPrefix(what, "body-")
		if !interrupted {
			continue
		}
		t.Logf("%s: actual %d (error %q), predicted %d at %q (%s)", r.Actual.AuditID, r.Actual.Status, r.Actual.Error,
			r.Predicted.Status, r.Predicted.Stage, r.Predicted.Message)
		if r.Actual.Error == "" {
			t.Errorf("%s: the record does not say the exchange was cut: %+v", r.Actual.AuditID, r.Actual)
		}
		// A LIST the apiserver began answering: 200 is its answer. A
		// write whose body it never had whole: no prediction can be
		// right, only unknown.
		if r.Predicted.Stage != record.StageUnknown && r.Predicted.Status != 0 &&
			(strings.HasPrefix(what, "write-") || strings.HasPrefix(what, "body-") || r.Predicted.Status != http.StatusOK) {
			t.Errorf("%s: predicted %d at %q, a confident answer the apiserver did not give (actual %d, %q)",
				r.Actual.AuditID, r.Predicted.Status, r.Predicted.Stage, r.Actual.Status, r.Actual.Error)
		}
	}
}

// populate creates n ConfigMaps cm-000... of size bytes of data in ns,
// directly (not through kproxy) as admin, 8 at a time, unthrottled:
// client-go's default of 5 a second would take minutes.
func populate(t testing.TB, c *localcluster.Cluster, ns string, n, size int) {
	t.Helper()
	fast := c.UserConfig("admin")
	fast.QPS, fast.Burst = -1, 0
	cs := kubernetes.NewForConfigOrDie(fast)
	data := strings.Repeat("k", size)
	next := make(chan int)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%03d", i)}, Data: map[string]string{"data": data}}
				if _, err := cs.CoreV1().ConfigMaps(ns).Create(context.Background(), cm, createOpts); err != nil {
					errs <- err
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("populate: %v", err)
	}
}

// closedPort is a loopback host:port nothing listens on: connections to
// it are refused.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// drain reads body to its end, for at most limit; hung: it did not end.
func drain(body io.ReadCloser, limit time.Duration) (n int64, err error, hung bool) {
	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := io.Copy(io.Discard, body)
		done <- result{n, err}
	}()
	select {
	case r := <-done:
		body.Close()
		return r.n, r.err, false
	case <-time.After(limit):
		body.Close()
		return 0, nil, true
	}
}

type postResult struct {
	status int
	body   string
	err    error
}

// slowWriter feeds a request body through a pipe: a ConfigMap named
// name whose data comes in 32 KiB pieces, and never ends.
type slowWriter struct {
	pw      *io.PipeWriter
	mu      sync.Mutex
	n       int
	err     error
	paused  bool
	stopped chan struct{}
	once    sync.Once
}

// slowPost sends a POST whose body (made by req) is written slowly, and
// returns where its answer arrives and its writer.
func slowPost(c *http.Client, req func(io.Reader) *http.Request, name string) (<-chan postResult, *slowWriter) {
	pr, pw := io.Pipe()
	w := &slowWriter{pw: pw, stopped: make(chan struct{})}
	r := req(pr)
	res := make(chan postResult, 1)
	go func() {
		resp, err := c.Do(r)
		if err != nil {
			res <- postResult{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		res <- postResult{status: resp.StatusCode, body: string(b), err: err}
	}()
	go func() {
		_, err := io.WriteString(pw, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"`+name+`"},"data":{"big":"`)
		chunk := strings.Repeat("x", 32<<10)
		// Never past 2 MiB (the apiserver takes 3): the body is cut, not
		// refused for its size.
		for err == nil {
			select {
			case <-w.stopped:
				return
			case <-time.After(20 * time.Millisecond):
			}
			w.mu.Lock()
			paused := w.paused || w.n >= 2<<20
			w.mu.Unlock()
			if paused {
				continue
			}
			var n int
			n, err = io.WriteString(pw, chunk)
			w.mu.Lock()
			w.n += n
			w.mu.Unlock()
		}
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
	}()
	return res, w
}

// wrote waits until n bytes of data have gone into the request.
func (w *slowWriter) wrote(n int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		w.mu.Lock()
		got, err := w.n, w.err
		w.mu.Unlock()
		if got >= n {
			return nil
		}
		if err != nil {
			return fmt.Errorf("slow body: %d bytes written, then %v", got, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("slow body: not %d bytes written within %v", n, limit)
}

// pause stops the body, without ending it.
func (w *slowWriter) pause() {
	w.mu.Lock()
	w.paused = true
	w.mu.Unlock()
}

// stop ends the writer; the body ends in an error (never completed).
func (w *slowWriter) stop() {
	w.once.Do(func() {
		close(w.stopped)
		w.pw.CloseWithError(errors.New("test: body abandoned"))
	})
}

// auditIDs hands out the Audit-ID of every request sent: what#n.
type auditIDs struct {
	mu  sync.Mutex
	ids []string
}

func (a *auditIDs) add(what string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	id := fmt.Sprintf("%s#%d", what, len(a.ids))
	a.ids = append(a.ids, id)
	return id
}

func (a *auditIDs) all() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.ids...)
}

// awaitRecord waits (up to prompt) for the capture's record of an
// Audit-ID; nil if none came.
func awaitRecord(capture, id string) *record.Record {
	var r *record.Record
	_ = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, prompt, true, func(context.Context) (bool, error) {
		b, _ := os.ReadFile(capture)
		for _, l := range bytes.Split(b, []byte("\n")) {
			var rec record.Record
			if bytes.Contains(l, []byte(id)) && json.Unmarshal(l, &rec) == nil && rec.Actual.AuditID == id {
				r = &rec
				return true, nil
			}
		}
		return false, nil
	})
	return r
}

// wholeRecords reads a capture: it must end with a newline, and each of
// its lines must be a whole record.
func wholeRecords(t *testing.T, path string) []record.Record {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := parseCapture(b)
	if err != nil {
		t.Fatalf("capture %s: %v", path, err)
	}
	return recs
}

// parseCapture parses a capture's bytes, refusing a partial line.
func parseCapture(b []byte) ([]record.Record, error) {
	if len(b) > 0 && b[len(b)-1] != '\n' {
		i := bytes.LastIndexByte(b, '\n')
		return nil, fmt.Errorf("a partial line at its end: %.200q", b[i+1:])
	}
	var recs []record.Record
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 64<<20)
	for i := 1; sc.Scan(); i++ {
		var r record.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("line %d is not a whole record: %v: %.200q", i, err, sc.Bytes())
		}
		recs = append(recs, r)
	}
	return recs, sc.Err()
}

// kproxyProcess is kproxy run as its own process, as deployed: its
// goroutines are its own (go_goroutines on --metrics-listen), and it
// stops on SIGTERM.
type kproxyProcess struct {
	cmd         *exec.Cmd
	addr        string
	metricsAddr string
	logPath     string
	pool        *x509.CertPool
	exited      chan struct{}
	waitErr     error
}

type processOptions struct {
	// cluster is the cluster kproxy goes in front of (nil: the shared
	// one); capture its --capture; args more flags; env more environment.
	cluster *localcluster.Cluster
	capture string
	args    []string
	env     []string
	// wrap, when set, runs kproxy's command line appended to it (it must
	// exec it: the process started is kproxy's).
	wrap []string
}

// startKproxyProcess builds kproxy, starts it in front of the cluster and
// waits until it is ready.
func startKproxyProcess(t *testing.T, o processOptions) *kproxyProcess {
	t.Helper()
	dir := t.TempDir()
	bin, manifest := kproxyBinary(t, dir)
	c := o.cluster
	if c == nil {
		c = cluster
	}
	if err := c.WriteManifest(manifest); err != nil {
		t.Fatal(err)
	}
	upstream, err := c.UpstreamKubeconfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	ports, err := localcluster.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	k := &kproxyProcess{addr: "127.0.0.1:" + strconv.Itoa(ports[0]), metricsAddr: "127.0.0.1:" + strconv.Itoa(ports[1]),
		logPath: filepath.Join(dir, "kproxy.log"), exited: make(chan struct{})}
	argv := append([]string{bin, "serve", "--listen=" + k.addr, "--upstream-kubeconfig=" + upstream, "--apiserver-manifest=" + manifest,
		"--pki-dir=" + filepath.Join(dir, "pki"), "--metrics-listen=" + k.metricsAddr, "--api-listen=off", "--log-level=warn"}, o.args...)
	if o.capture != "" {
		argv = append(argv, "--capture="+o.capture)
	}
	argv = append(append([]string(nil), o.wrap...), argv...)
	k.cmd = exec.Command(argv[0], argv[1:]...)
	k.cmd.Env = append(os.Environ(), o.env...)
	logf, err := os.Create(k.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	k.cmd.Stdout, k.cmd.Stderr = logf, logf
	// Dies with the test binary, should the test be killed.
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := k.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { k.waitErr = k.cmd.Wait(); close(k.exited) }()
	t.Cleanup(func() {
		select {
		case <-k.exited:
		default:
			_ = k.cmd.Process.Kill()
			<-k.exited
		}
	})
	var notReady string
	err = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		select {
		case <-k.exited:
			return false, fmt.Errorf("kproxy exited: %v", k.waitErr)
		default:
		}
		resp, err := http.Get("http://" + k.metricsAddr + "/readyz")
		if err != nil {
			notReady = err.Error()
			return false, nil //nolint:nilerr // not listening yet: poll again
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		notReady = fmt.Sprintf("/readyz %d: %s", resp.StatusCode, b)
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		logs, _ := os.ReadFile(k.logPath)
		t.Fatalf("kproxy not ready: %v (last: %s); its log:\n%s", err, notReady, logs)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "pki", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	k.pool = x509.NewCertPool()
	k.pool.AppendCertsFromPEM(caPEM)
	return k
}

// stop sends SIGTERM and waits for kproxy to exit (failing the test past
// limit); it returns how long that took.
func (k *kproxyProcess) stop(t *testing.T, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	if err := k.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-k.exited:
	case <-time.After(limit):
		t.Fatalf("kproxy did not exit within %v of SIGTERM", limit)
	}
	if k.waitErr != nil {
		logs, _ := os.ReadFile(k.logPath)
		t.Errorf("kproxy exited with %v\n%s", k.waitErr, logs)
	}
	return time.Since(start)
}
