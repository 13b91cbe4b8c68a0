package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
)

// TestConnectNeverReachesKubelets: the replay of logs, exec, attach,
// port-forward and the proxy subresources runs the apiserver's location
// code, and stops where the apiserver would connect to a kubelet. A
// listener stands in for the kubelet (none can run here) and counts
// connections: the apiserver's, and never one from kproxy.
func TestConnectNeverReachesKubelets(t *testing.T) {
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var dials atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			dials.Add(1)
			c.Close() // not a kubelet: the apiserver gets an error
		}
	}()
	pod := kubeletNode(t, "kubelet-sentinel", "on-sentinel", ln.Addr().(*net.TCPAddr).Port)

	// A pod naming a node that does not exist: the apiserver answers 404
	// for the node (found by a probe: said unknown, "the replay found it:
	// it was created after this request", of a pod there for minutes).
	ghost := pod.DeepCopy()
	ghost.Name, ghost.Spec.NodeName = "on-ghost-node", "ghost-node"
	if _, err := adminClient().CoreV1().Pods(testNS).Create(ctx, ghost, createOpts); err != nil && ignoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}

	stream := record.NewStream()
	recs, _, cancel := stream.Subscribe(256)
	defer cancel()
	k := startKproxy(t, kproxyOptions{stream: stream})
	base := "/api/v1/namespaces/" + testNS + "/pods/on-sentinel/"
	onGhost := "/api/v1/namespaces/" + testNS + "/pods/on-ghost-node/"
	spdy := http.Header{"Connection": {"Upgrade"}, "Upgrade": {"SPDY/3.1"}, "X-Stream-Protocol-Version": {"v4.channel.k8s.io"}}
	// kubectl's own: WebSocket, which the apiserver translates to SPDY
	// for the kubelet after switching protocols with the client.
	websocket := func(protocol string) http.Header {
		return http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"},
			"Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}, "Sec-Websocket-Protocol": {protocol}}
	}
	cases := []struct {
		method, path string
		header       http.Header
		h1           bool // an upgrade: HTTP/1.1 only
		kubelet      bool // the apiserver dials the kubelet: unknown
		handshake    bool // a watch over WebSocket: its handshake answers
		// bearer: the credential is in a subprotocol (a browser's), not
		// an Authorization header
		bearer bool
	}{
		{method: "GET", path: base + "exec?command=true&stdout=true&stderr=true", header: websocket("v5.channel.k8s.io"), h1: true, kubelet: true},
		{method: "GET", path: base + "attach?stdout=true", header: websocket("v5.channel.k8s.io"), h1: true, kubelet: true},
		{method: "GET", path: base + "portforward?ports=80", header: websocket("SPDY/3.1+portforward.k8s.io"), h1: true, kubelet: true},
		{method: "GET", path: base + "log", kubelet: true},
		{method: "GET", path: base + "log?container=c&tailLines=1", kubelet: true},
		{method: "GET", path: base + "log?container=nope"},
		{method: "GET", path: base + "proxy/"},                         // the pod has no IP
		{method: "POST", path: base + "exec?command=true&stdout=true"}, // no upgrade: refused before any dial
		{method: "POST", path: base + "exec?command=true&stdout=true", header: spdy, h1: true, kubelet: true},
		{method: "POST", path: base + "attach?stdout=true", header: spdy, h1: true, kubelet: true},
		{method: "POST", path: base + "portforward?ports=80", header: spdy, h1: true, kubelet: true},
		{method: "POST", path: base + "exec?stdout=true", header: spdy, h1: true, kubelet: true}, // no command: the kubelet says so
		// A watch over WebSocket involves no kubelet: the handshake
		// answers, 403 without an Origin that is a URL (found by a probe:
		// said unknown, "then connect to the pod's kubelet").
		{method: "GET", path: "/api/v1/namespaces/" + testNS + "/configmaps?watch=true&timeoutSeconds=1", header: websocket("base64.binary.k8s.io"), h1: true, handshake: true},
		{method: "GET", path: "/api/v1/namespaces/" + testNS + "/configmaps?watch=true&timeoutSeconds=1", header: withOrigin(websocket("base64.binary.k8s.io"), "null"), h1: true, handshake: true},
		{method: "GET", path: "/api/v1/namespaces/" + testNS + "/configmaps?watch=true&timeoutSeconds=1", header: withOrigin(websocket("base64.binary.k8s.io"), "https://dashboard.example"), h1: true, handshake: true},
		// The token in a subprotocol, as browsers send it: the
		// apiserver's authenticator takes that subprotocol out before the
		// handshake, which is offered the other one (found by a probe:
		// predicted 400 "two subprotocols" for 101, in either order).
		{method: "GET", path: "/api/v1/namespaces/" + testNS + "/configmaps?watch=true&timeoutSeconds=1", header: withOrigin(websocket("base64.binary.k8s.io, "+bearerProtocol(tokenOf("admin"))), "https://dashboard.example"), h1: true, handshake: true, bearer: true},
		{method: "GET", path: "/api/v1/namespaces/" + testNS + "/configmaps?watch=true&timeoutSeconds=1", header: withOrigin(websocket(bearerProtocol(tokenOf("admin"))+",base64.binary.k8s.io"), "https://dashboard.example"), h1: true, handshake: true, bearer: true},
		{method: "GET", path: onGhost + "log"},
		{method: "GET", path: onGhost + "log?container=c&follow=true"},
		{method: "GET", path: onGhost + "exec?command=true&stdout=true", header: websocket("v5.channel.k8s.io"), h1: true},
		{method: "POST", path: onGhost + "exec?command=true&stdout=true", header: spdy, h1: true},
	}
	for _, tc := range cases {
		r := reverseH2Route(k)
		if tc.h1 {
			r = reverseRoute(k)
		}
		before := dials.Load()
		user := "admin"
		if tc.bearer {
			user = ""
		}
		ex := do(t, r.client(nil), r.base, request{method: tc.method, path: tc.path, user: user, header: tc.header})
		var rec *record.Record
		select {
		case rec = <-recs:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s %s: no record", tc.method, tc.path)
		}
		// Give a stray dial from kproxy's replay the time to land.
		time.Sleep(200 * time.Millisecond)
		want := int32(0)
		if tc.kubelet {
			want = 1 // the apiserver's
		}
		if got := dials.Load() - before; got != want {
			t.Errorf("%s %s: the kubelet stand-in got %d connections, want %d (the apiserver's only)", tc.method, tc.path, got, want)
		}
		p, a := rec.Predicted, rec.Actual
		if tc.handshake {
			// The handshake's 403 has no body: its status is all there
			// is to predict.
			if a.Status != ex.status || p.Status != a.Status || p.Stage == record.StageUnknown {
				t.Errorf("%s %s with %v: answered %d (recorded %d), predicted %+v", tc.method, tc.path, tc.header, ex.status, a.Status, p)
			}
			// What the client got after switching protocols (the stream's
			// WebSocket frames, its close) is counted too.
			if ex.status == http.StatusSwitchingProtocols && (a.ResponseBytes == 0 || a.ResponseBytes != int64(len(ex.body))) {
				t.Errorf("%s %s: the client got %d bytes after switching protocols, recorded %d", tc.method, tc.path, len(ex.body), a.ResponseBytes)
			}
			continue
		}
		if a.Status != ex.status {
			t.Errorf("%s %s: recorded status %d, the apiserver answered %d", tc.method, tc.path, a.Status, ex.status)
		}
		switch {
		case tc.kubelet && (p.Stage != record.StageUnknown || !strings.Contains(p.Message, "answers from here")):
			t.Errorf("%s %s (apiserver %d): predicted %+v, want unknown: the kubelet answers", tc.method, tc.path, ex.status, p)
		case !tc.kubelet && (p.Status != a.Status || p.Reason != a.Reason || p.Message != a.Message):
			t.Errorf("%s %s: predicted %+v, actual %+v%s", tc.method, tc.path, p, a, stageSummary(rec))
		}
	}
}

// bearerProtocol is the WebSocket subprotocol that carries token.
func bearerProtocol(token string) string {
	return "base64url.bearer.authorization.k8s.io." + base64.RawURLEncoding.EncodeToString([]byte(token))
}

// withOrigin is h with an Origin header.
func withOrigin(h http.Header, origin string) http.Header {
	h = h.Clone()
	h.Set("Origin", origin)
	return h
}

// TestWebSocketWatchEnds: a watch over WebSocket (a browser's, a
// dashboard's) switches protocols, and the record then tells who ended
// the connection: the apiserver (its timeoutSeconds ran out: no error),
// or the client, which dropped it (found by a probe: such a record said
// nothing of it, where an HTTP/2 watch the client stopped says so).
func TestWebSocketWatchEnds(t *testing.T) {
	stream := record.NewStream()
	recs, _, cancel := stream.Subscribe(16)
	defer cancel()
	k := startKproxy(t, kproxyOptions{stream: stream})
	for _, tc := range []struct {
		name    string
		timeout int
		drop    bool
		want    string
	}{
		{"ended by the apiserver", 1, false, ""},
		// The token in the bearer subprotocol, as browsers send it.
		{"dropped by the client", 60, true, "the client closed its connection after the switch of protocols, before the apiserver closed its side"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := tls.Dial("tcp", k.addr, &tls.Config{RootCAs: k.ca, NextProtos: []string{"http/1.1"}})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			path := "/api/v1/namespaces/" + testNS + "/configmaps?watch=true&timeoutSeconds=" + strconv.Itoa(tc.timeout)
			credentials, protocols := "Authorization: Bearer "+tokenOf("admin")+"\r\n", "base64.binary.k8s.io"
			if tc.drop {
				credentials, protocols = "", bearerProtocol(tokenOf("admin"))+", base64.binary.k8s.io"
			}
			fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\n%sOrigin: https://dashboard.example\r\n"+
				"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"+
				"Sec-WebSocket-Protocol: %s\r\n\r\n", path, k.addr, credentials, protocols)
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("status %d, want 101", resp.StatusCode)
			}
			if tc.drop {
				conn.Close()
			} else {
				// Read to the end (the apiserver closes the connection
				// once the watch times out), then close, as clients do.
				conn.SetReadDeadline(time.Now().Add(30 * time.Second))
				if _, err := io.Copy(io.Discard, br); err != nil {
					t.Fatalf("reading the watch to its end: %v", err)
				}
				conn.Close()
			}
			select {
			case rec := <-recs:
				if rec.Actual.Status != http.StatusSwitchingProtocols || rec.Actual.Error != tc.want {
					t.Errorf("recorded status %d, error %q; want 101, %q", rec.Actual.Status, rec.Actual.Error, tc.want)
				}
				if rec.Predicted.Status != http.StatusSwitchingProtocols {
					t.Errorf("predicted %+v, want 101", rec.Predicted)
				}
				// Described as sent (a probe: the subprotocol's token
				// was "a request without credentials").
				if authn := stageNamed(rec, record.StageAuthentication).Explanation; !strings.Contains(authn, "authenticated a bearer token (") {
					t.Errorf("the authentication explanation does not name the bearer token: %s", authn)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("no record")
			}
		})
	}
}

// TestLongStreamHoldsNoReplayWorker: a log followed (as kubectl logs -f
// does) is answered at once and streams for as long as the kubelet
// sends; its replay takes the answer's status and goes (found by a
// probe: a proxied 30 s stream held one of the two replay workers for
// its whole life, and every other request's prediction was late or
// shed). A stand-in kubelet streams the log for 20 s; with one replay
// worker, gets sent meanwhile are predicted, each while the stream runs.
func TestLongStreamHoldsNoReplayWorker(t *testing.T) {
	streaming := streamingKubelet(t, "kubelet-streamer", "on-streamer", 100)
	stream := record.NewStream()
	recs, _, cancel := stream.Subscribe(64)
	defer cancel()
	k := startKproxy(t, kproxyOptions{stream: stream, set: func(o *serve.Options) { o.ReplayWorkers, o.ReplayQueue = 1, 16 }})
	r := reverseH2Route(k)
	c := r.client(nil)
	req, err := http.NewRequest("GET", r.base+"/api/v1/namespaces/"+testNS+"/pods/on-streamer/log?follow=true", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tokenOf("admin"))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("log follow: %d", resp.StatusCode)
	}
	go func() { _, _ = io.Copy(io.Discard, resp.Body) }()
	select {
	case <-streaming:
	case <-time.After(30 * time.Second):
		t.Fatal("the apiserver never reached the stand-in kubelet")
	}
	// The log's replay has begun (one worker): gets behind it.
	const gets = 5
	for range gets {
		ex := do(t, c, r.base, request{method: "GET", path: "/api/v1/namespaces/" + testNS + "/pods/on-streamer", user: "admin"})
		if ex.status != http.StatusOK {
			t.Fatalf("get: %d", ex.status)
		}
	}
	deadline := time.After(10 * time.Second)
	for got := 0; got < gets; {
		select {
		case rec := <-recs:
			if rec.Request.Subresource == "log" {
				t.Fatalf("the log's record came before the gets': %+v", rec.Actual)
			}
			if rec.Predicted.Status != http.StatusOK || rec.Predicted.Stage == record.StageUnknown {
				t.Errorf("a get while a log streams: predicted %+v", rec.Predicted)
			}
			got++
		case <-deadline:
			t.Fatalf("%d of %d gets recorded within 10 s while a log streamed: their replays wait behind the log's", got, gets)
		}
	}
}

// streamingKubelet starts a stand-in kubelet that streams any log asked
// of it, a line every 200 ms, lines of them; a Node of that name on it,
// and a pod of that name on the node. The channel closes once the first
// line is out.
func streamingKubelet(t *testing.T, nodeName, podName string, lines int) <-chan struct{} {
	t.Helper()
	streaming := make(chan struct{})
	var once sync.Once
	kubelet := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		for i := range lines {
			if _, err := fmt.Fprintf(w, "line %d\n", i); err != nil {
				return
			}
			_ = rc.Flush()
			once.Do(func() { close(streaming) })
			select {
			case <-r.Context().Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}))
	t.Cleanup(kubelet.Close)
	kubeletNode(t, nodeName, podName, kubelet.Listener.Addr().(*net.TCPAddr).Port)
	return streaming
}

// TestConnectStateChangedAfterRequest: a log followed, its node's
// addresses taken away right after the kubelet began answering, replayed
// behind 100 queued writes: the replay's registry finds no address to
// connect to, and the apiserver had connected (found by a probe: proxied
// GETs replayed after an endpoint became unready, or a pod's IP changed,
// predicted 503 and 400 for the apiserver's 200). It says unknown.
func TestConnectStateChangedAfterRequest(t *testing.T) {
	ctx := context.Background()
	node := fmt.Sprintf("kubelet-moved-%d", time.Now().UnixNano())
	streaming := streamingKubelet(t, node, "on-"+node, 5)
	recs, r, c := oneReplayWorker(t)
	var wg sync.WaitGroup
	const writes = 100
	for i := range writes {
		wg.Go(func() {
			body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"%s-%d"}}`, node, i)
			_ = do(t, c, r.base, request{method: "POST", path: "/api/v1/namespaces/" + testNS + "/configmaps", user: "admin", body: body})
		})
	}
	// Their replays queue behind the one worker; the log's, a read's,
	// waits for them.
	wg.Wait()
	logPath := "/api/v1/namespaces/" + testNS + "/pods/on-" + node + "/log?follow=true"
	wg.Go(func() {
		<-streaming
		cs := adminClient()
		n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Error(err)
			return
		}
		n.Status.Addresses = nil
		if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Error(err)
		}
	})
	if got := do(t, c, r.base, request{method: "GET", path: logPath, user: "admin"}); got.status != http.StatusOK {
		t.Fatalf("log: %d %s", got.status, got.body)
	}
	wg.Wait()
	for range writes + 1 {
		rec := nextRecord(t, recs)
		if rec.Request.Subresource != "log" {
			continue
		}
		p := rec.Predicted
		switch {
		case p.Stage != record.StageUnknown:
			t.Errorf("the log, its node's addresses gone after it: predicted %+v, the apiserver answered %d", p, rec.Actual.Status)
		case !strings.Contains(p.Message, "may have changed since") && !strings.Contains(p.Message, "answers from here"):
			t.Errorf("the log, its node's addresses gone after it: unknown, but %q", p.Message)
		default:
			t.Logf("the log's prediction: %s", p.Message)
		}
		return
	}
	t.Fatal("no record of the log")
}

// kubeletNode makes a Node whose kubelet listens on 127.0.0.1:port (a
// stand-in: none can run here), and a pod on it; it returns the pod.
func kubeletNode(t *testing.T, nodeName, podName string, port int) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	cs := adminClient()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, createOpts); err != nil && ignoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	node.Status = corev1.NodeStatus{
		Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(port)}},
	}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	noToken := false
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName}, Spec: corev1.PodSpec{NodeName: nodeName,
		AutomountServiceAccountToken: &noToken, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
	if _, err := cs.CoreV1().Pods(testNS).Create(ctx, pod, createOpts); err != nil && ignoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	return pod
}
