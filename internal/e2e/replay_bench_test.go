package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/localcluster"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
	"github.com/kproxy/kproxy/internal/telemetry"
)

// BenchmarkReplayedGet and BenchmarkReplayedCreate measure what one
// request costs kproxy in process, replay and tracing to a real Jaeger
// included, one request at a time, each waiting for its record: CPU per
// request (this process: kproxy and the client) and allocations per
// request. They are the developer's view of the replay's cost, steadier
// than make bench's (which runs kproxy as a process next to others);
// make bench holds the targets. Run with:
//
//	KPROXY_BIN_DIR=$PWD/.cache/bin go test -run='^$' -bench=Replayed -benchtime=2000x ./internal/e2e/
func BenchmarkReplayedGet(b *testing.B) {
	benchGets(b, true, benchPod(b, "bench-replayed-get"))
}

// BenchmarkForwardedGet is BenchmarkReplayedGet's GET through a kproxy
// whose --replay-filter leaves it out: forwarded, recorded and traced, not
// replayed. The difference between the two is the replay's cost; this one
// is the hop's.
func BenchmarkForwardedGet(b *testing.B) {
	benchGets(b, false, benchPod(b, "bench-forwarded-get"))
}

// benchPod creates a pod to GET, deleted after the benchmark, and returns
// its path.
func benchPod(b *testing.B, name string) string {
	cs := adminClient()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
	if _, err := cs.CoreV1().Pods(testNS).Create(context.Background(), pod, createOpts); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cs.CoreV1().Pods(testNS).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return "/api/v1/namespaces/" + testNS + "/pods/" + name
}

// BenchmarkReplayedList and BenchmarkForwardedList list 1000 ConfigMaps
// of 1 KiB (about 1.1 MB of JSON), make bench's LIST row, in process: the
// replay reads one item (a list's storage outcome does not depend on its
// size), so what the two share is the hop's cost of a big answer.
func BenchmarkReplayedList(b *testing.B) {
	benchGets(b, true, benchList(b, "bench-replayed-list"))
}

func BenchmarkForwardedList(b *testing.B) {
	benchGets(b, false, benchList(b, "bench-forwarded-list"))
}

// benchList creates 1000 ConfigMaps of 1 KiB in a namespace of their
// own, deleted after the benchmark, and returns the path listing them.
func benchList(b *testing.B, prefix string) string {
	ns := lateNamespace(b, prefix)
	populate(b, cluster, ns, 1000, 1024)
	return "/api/v1/namespaces/" + ns + "/configmaps"
}

// benchGets is benchReplayed of admin's GETs of path.
func benchGets(b *testing.B, replayed bool, path string) {
	benchReplayed(b, replayed, func(int) request { return request{method: "GET", path: path, user: "admin"} })
}

func BenchmarkReplayedCreate(b *testing.B) {
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	benchReplayed(b, true, func(i int) request {
		return request{method: "POST", path: "/api/v1/namespaces/" + testNS + "/configmaps?dryRun=All", user: "admin",
			body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"bench-` + run + `-` + strconv.Itoa(i) + `"},"data":{"k":"v"}}`}
	})
}

// BenchmarkReplayedWrite is make bench's POST row in process: a create
// written for real (BenchmarkReplayedCreate's is a dry run), whose replay
// tells the request's own write from the state it met.
func BenchmarkReplayedWrite(b *testing.B) {
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	b.Cleanup(func() {
		_ = adminClient().CoreV1().ConfigMaps(testNS).DeleteCollection(context.Background(), metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: "bench-write=" + run})
	})
	benchReplayed(b, true, func(i int) request {
		return request{method: "POST", path: "/api/v1/namespaces/" + testNS + "/configmaps", user: "admin",
			body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"bench-` + run + `-` + strconv.Itoa(i) + `","labels":{"bench-write":"` + run + `"}},"data":{"k":"v"}}`}
	})
}

// benchReplayed sends req's requests one at a time and waits for each
// record; replayed false filters every request out of the replay.
func benchReplayed(b *testing.B, replayed bool, req func(int) request) {
	ctx := context.Background()
	j, err := localcluster.StartJaeger(ctx, "", "", os.Stderr)
	if err != nil {
		b.Fatal(err)
	}
	defer j.Stop()
	stream := record.NewStream()
	recs, _, cancel := stream.Subscribe(16)
	defer cancel()
	k := startKproxy(b, kproxyOptions{stream: stream, telemetry: telemetry.Options{
		Endpoint: j.OTLPHTTP, Protocol: "http/protobuf", ServiceName: "kproxy-bench"},
		// Every replay runs in full: none is shed for its reads.
		set: func(o *serve.Options) {
			o.APIServer.ReplayEtcdQPS, o.APIServer.ReplayAPIServerQPS = 1e6, 1e6
			if !replayed {
				o.ReplayFilter = "~n not-" + testNS
			}
		}})
	c := reverseRoute(k).client(nil)
	one := func(i int) {
		r := req(i)
		hr, err := http.NewRequest(r.method, "https://"+k.addr+r.path, strings.NewReader(r.body))
		if err != nil {
			b.Fatal(err)
		}
		hr.Header.Set("Authorization", "Bearer "+tokenOf(r.user))
		if r.body != "" {
			hr.Header.Set("Content-Type", "application/json")
		}
		resp, err := c.Do(hr)
		if err != nil {
			b.Fatal(err)
		}
		if resp.StatusCode >= 300 {
			body, _ := io.ReadAll(resp.Body)
			b.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		// Read and dropped: the client's copy of a big answer is not
		// kproxy's cost.
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		select {
		case rec := <-recs:
			if !replayed {
				if rec.Actual.Status != resp.StatusCode || rec.Predicted.Stage != "unknown" {
					b.Fatalf("a request the replay filter leaves out: recorded %+v and %+v, answered %d", rec.Predicted, rec.Actual, resp.StatusCode)
				}
			} else if rec.Predicted.Status != resp.StatusCode {
				b.Fatalf("predicted %+v, the apiserver answered %d", rec.Predicted, resp.StatusCode)
			}
		case <-time.After(30 * time.Second):
			b.Fatal("no record")
		}
	}
	for i := range 50 { // warm the caches and connections
		one(-i - 1)
	}
	b.ReportAllocs()
	before := cpuTime()
	b.ResetTimer()
	for i := range b.N {
		one(i)
	}
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-before).Microseconds())/float64(b.N), "cpu-µs/op")
}

// cpuTime is this process's CPU time, user and system.
func cpuTime() time.Duration {
	var u syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &u)
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}
