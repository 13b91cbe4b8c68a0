package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
	"github.com/kproxy/kproxy/internal/telemetry"
)

// TestReplicas runs two kproxy replicas behind a loopback TCP balancer,
// as they would run behind a cloud load balancer: one CA and serving
// identity (a shared PKI directory), /readyz on each after its caches
// synced, each record naming the replica that wrote it. Every request
// through the balancer is answered and recorded exactly once, by one of
// them, and both get traffic. Both also export their records as OTLP
// logs to one collector (Jaeger, an OpenTelemetry Collector build, taking
// their traces too), which forwards them to a log store: every record
// arrives there once, naming its replica.
func TestReplicas(t *testing.T) {
	store := &otlpLogStore{}
	storeSrv := httptest.NewServer(store)
	defer storeSrv.Close()
	collector, err := localcluster.StartJaegerForwardingLogs(context.Background(), "", t.TempDir(), io.Discard, storeSrv.URL+"/v1/logs")
	if err != nil {
		t.Fatal(err)
	}
	defer collector.Stop()
	shared := filepath.Join(t.TempDir(), "pki")
	var replicas []*kproxy
	var captures []string
	for _, name := range []string{"kproxy-a", "kproxy-b"} {
		capture := filepath.Join(t.TempDir(), name+".jsonl")
		k := startKproxy(t, kproxyOptions{capture: capture, set: func(o *serve.Options) {
			o.PKIDir, o.Replica, o.MetricsListen = shared, name, "127.0.0.1:0"
			o.Telemetry.Endpoint, o.OTLPLogs = collector.OTLPHTTP, true
		}})
		replicas = append(replicas, k)
		captures = append(captures, capture)
		resp, err := http.Get("http://" + k.srv.MetricsAddr + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s /readyz: %d %s", name, resp.StatusCode, b)
		}
	}
	if !replicas[0].ca.Equal(replicas[1].ca) {
		t.Fatal("the replicas do not share one CA")
	}
	lb := startTCPBalancer(t, replicas[0].addr, replicas[1].addr)

	// New connections each time, so the balancer spreads them.
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: replicas[0].ca}, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	const n = 20
	for i := range n {
		req, _ := http.NewRequest("GET", "https://"+lb+"/api/v1/namespaces/default/configmaps", nil)
		req.Header.Set("Authorization", "Bearer "+localcluster.TokenOf("admin"))
		req.Header.Set("Audit-Id", fmt.Sprintf("replicas-%02d", i))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d through the balancer: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	for _, k := range replicas {
		k.stop() // flushes the captures
	}
	seen := map[string]string{}
	per := map[string]int{}
	for i, c := range captures {
		f, err := os.Open(c)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 16<<20)
		for sc.Scan() {
			var r record.Record
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatal(err)
			}
			want := []string{"kproxy-a", "kproxy-b"}[i]
			if r.Replica != want {
				t.Errorf("a record of %s says replica %q", want, r.Replica)
			}
			if prev, dup := seen[r.Actual.AuditID]; dup {
				t.Errorf("%s recorded by %s and %s", r.Actual.AuditID, prev, r.Replica)
			}
			seen[r.Actual.AuditID] = r.Replica
			per[r.Replica]++
			if r.Predicted.Status != r.Actual.Status {
				t.Errorf("%s: predicted %d, actual %d", r.Actual.AuditID, r.Predicted.Status, r.Actual.Status)
			}
		}
		f.Close()
	}
	if len(seen) != n || per["kproxy-a"] == 0 || per["kproxy-b"] == 0 {
		t.Errorf("%d records for %d requests, by replica %v: want every request once, and both replicas used", len(seen), n, per)
	}

	// The same records, as logs, through the collector to the store (the
	// replicas flushed them when they stopped; the collector batches).
	var logs map[string]string
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		logs = store.byAuditID()
		return len(logs) >= n, nil
	})
	if err != nil {
		t.Fatalf("the log store got %d records as logs, want %d", len(logs), n)
	}
	for id, replica := range logs {
		if seen[id] != replica {
			t.Errorf("log of %s names replica %q, the capture %q", id, replica, seen[id])
		}
	}
	if len(logs) != len(seen) {
		t.Errorf("%d records as logs, %d in the captures", len(logs), len(seen))
	}
}

// otlpLogStore is a log store's OTLP/HTTP logs endpoint: it keeps the
// records kproxy exported as logs, decoded with the OTLP protos.
type otlpLogStore struct {
	mu      sync.Mutex
	records []record.Record
	replica []string
	raw     []byte // every export as received (the secret sweep reads it)
}

func (s *otlpLogStore) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.raw = append(s.raw, b...)
	s.mu.Unlock()
	var msg collogs.ExportLogsServiceRequest
	if err := proto.Unmarshal(b, &msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rl := range msg.ResourceLogs {
		for _, sl := range rl.ScopeLogs {
			for _, lr := range sl.LogRecords {
				var rec record.Record
				if lr.EventName != telemetry.RecordLogEventName || json.Unmarshal([]byte(lr.GetBody().GetStringValue()), &rec) != nil {
					continue
				}
				replica := ""
				for _, a := range lr.Attributes {
					if a.Key == "kproxy.replica" {
						replica = a.GetValue().GetStringValue()
					}
				}
				s.records = append(s.records, rec)
				s.replica = append(s.replica, replica)
			}
		}
	}
	out, _ := proto.Marshal(&collogs.ExportLogsServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// received is how many records arrived, and every export's bytes.
func (s *otlpLogStore) received() (int, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records), slices.Clone(s.raw)
}

// byAuditID maps each record's audit ID to the replica its log names.
func (s *otlpLogStore) byAuditID() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := map[string]string{}
	for i, r := range s.records {
		m[r.Actual.AuditID] = s.replica[i]
	}
	return m
}

// startTCPBalancer is a round-robin TCP load balancer on loopback, as a
// cloud TCP (L4) balancer in front of kproxy replicas: it passes bytes,
// so TLS ends at the replica.
func startTCPBalancer(t *testing.T, backends ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var next atomic.Uint64
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", backends[next.Add(1)%uint64(len(backends))])
			if err != nil {
				c.Close()
				continue
			}
			wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer wg.Done()
				_, _ = io.Copy(dst, src)
				if cw, ok := dst.(*net.TCPConn); ok {
					_ = cw.CloseWrite()
				}
			}
			go pipe(b, c)
			go func() { pipe(c, b); c.Close(); b.Close() }()
		}
	}()
	return ln.Addr().String()
}
