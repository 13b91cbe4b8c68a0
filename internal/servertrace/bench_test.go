package servertrace

import (
	"context"
	"fmt"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/kproxy/kproxy/internal/record"
)

// BenchmarkReceiveAndJoin is the per-request CPU of the whole path for a
// traced POST with a webhook (15 spans, one export request each): the
// wire decode gRPC does, filing the spans, the layers and summary, and
// the join with kproxy's record.
func BenchmarkReceiveAndJoin(b *testing.B) {
	const n = 1024
	wire := make([][]byte, n)
	audit := make([]string, n)
	for i := range n {
		audit[i] = fmt.Sprintf("audit-%d", i)
		tr, _ := createWithSlowWebhook(uint64(i+1), audit[i])
		var err error
		if wire[i], err = proto.Marshal(&coltracepb.ExportTraceServiceRequest{ResourceSpans: batch(tr.spans...)}); err != nil {
			b.Fatal(err)
		}
	}
	var joined int
	j := NewJoiner(sinkFunc(func(r *record.Record) {
		if r.Server != nil {
			joined++
		}
	}), JoinOptions{Wait: time.Minute})
	defer j.Close()
	r, err := NewReceiver(context.Background(), ReceiverOptions{Join: j})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := i % n
		j.Write(&record.Record{ID: audit[k], Actual: record.Actual{Status: 201, AuditID: audit[k]}, Latency: record.Latency{UpstreamNs: 1}})
		req := &coltracepb.ExportTraceServiceRequest{}
		if err := proto.Unmarshal(wire[k], req); err != nil {
			b.Fatal(err)
		}
		if _, err := r.Export(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if joined != b.N {
		b.Fatalf("joined %d of %d", joined, b.N)
	}
}

// BenchmarkAnalyze is the layers and summary of one request alone.
func BenchmarkAnalyze(b *testing.B) {
	tr, root := createWithSlowWebhook(1, "a")
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		analyze(root, tr.spans)
	}
}

// BenchmarkJoin is the joiner alone: a record, then its observation.
func BenchmarkJoin(b *testing.B) {
	j := NewJoiner(sinkFunc(func(*record.Record) {}), JoinOptions{Wait: time.Minute})
	defer j.Close()
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = fmt.Sprintf("audit-%d", i)
	}
	o := Observation{Server: record.Server{TotalNs: 1}}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		id := ids[i%len(ids)]
		j.Write(&record.Record{Actual: record.Actual{Status: 200, AuditID: id}, TraceID: id, Latency: record.Latency{UpstreamNs: 1}})
		o.AuditID, o.TraceID = id, "s"+id
		j.Offer(o)
	}
}
