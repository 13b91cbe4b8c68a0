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
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
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
	port := ln.Addr().(*net.TCPAddr).Port
	cs := adminClient()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "kubelet-sentinel"}}
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
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "on-sentinel"}, Spec: corev1.PodSpec{NodeName: "kubelet-sentinel",
		AutomountServiceAccountToken: &noToken, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
	if _, err := cs.CoreV1().Pods(testNS).Create(ctx, pod, createOpts); err != nil && ignoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}

	// A pod naming a node that does not exist: the apiserver answers 404
	// for the node (found by a probe: said unknown, "the replay found it:
	// it was created after this request", of a pod there for minutes).
	ghost := pod.DeepCopy()
	ghost.Name, ghost.Spec.NodeName = "on-ghost-node", "ghost-node"
	if _, err := cs.CoreV1().Pods(testNS).Create(ctx, ghost, createOpts); err != nil && ignoreAlreadyExists(err) != nil {
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
		{"dropped by the client", 60, true, "the client closed its connection after the switch of protocols, before the apiserver closed its side"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := tls.Dial("tcp", k.addr, &tls.Config{RootCAs: k.ca, NextProtos: []string{"http/1.1"}})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			path := "/api/v1/namespaces/" + testNS + "/configmaps?watch=true&timeoutSeconds=" + strconv.Itoa(tc.timeout)
			fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nOrigin: https://dashboard.example\r\n"+
				"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"+
				"Sec-WebSocket-Protocol: base64.binary.k8s.io\r\n\r\n", path, k.addr, tokenOf("admin"))
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
			case <-time.After(30 * time.Second):
				t.Fatal("no record")
			}
		})
	}
}
