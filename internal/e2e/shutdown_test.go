package e2e

import (
	"net"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/serve"
	"github.com/kproxy/kproxy/internal/telemetry"
)

// TestShutdownWithBlackholedCollector: a trace collector that accepts
// connections and never answers must not hold kproxy's exit past its
// bounded flush (it took minutes before).
func TestShutdownWithBlackholedCollector(t *testing.T) {
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	go func() {
		for {
			c, err := hole.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never read or answered
		}
	}()
	k := startKproxy(t, kproxyOptions{telemetry: telemetry.Options{Endpoint: "http://" + hole.Addr().String(), Protocol: "http/protobuf"}})
	r := reverseRoute(k)
	for i := 0; i < 5; i++ {
		do(t, r.client(nil), r.base, request{method: "GET", path: "/api/v1/namespaces/default/configmaps", user: "admin"})
	}
	stopped := make(chan struct{})
	go func() { k.stop(); close(stopped) }()
	// The bound is the flush's budget plus the replays' drain, with room
	// for a loaded machine: the point is that it ends, not how fast.
	limit := serve.ShutdownTimeout + 25*time.Second
	select {
	case <-stopped:
	case <-time.After(limit):
		t.Fatalf("kproxy did not stop within %v with a black-holed trace collector", limit)
	}
}
