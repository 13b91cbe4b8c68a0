package auditlatency

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// auditLog is a real kube-apiserver v1.37.2 audit log (level Metadata,
// --audit-log-format=json): the RequestReceived event of a create, three
// creates held up by a mutating webhook that sleeps 150ms and a validating
// webhook that sleeps 700ms (so past the 500ms threshold, annotated), and
// a fast list (not annotated).
const auditLog = "testdata/kube-apiserver-v1.37.2-audit.log"

// webhookBatch is a real batch the same apiserver's audit webhook backend
// POSTed: an EventList of 7 events, two of them annotated creates.
const webhookBatch = "testdata/kube-apiserver-v1.37.2-webhook-batch.json"

// logLines are the lines of auditLog.
func logLines(t *testing.T) [][]byte {
	t.Helper()
	b, err := os.ReadFile(auditLog)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Split(bytes.TrimSpace(b), []byte("\n"))
}

// realEvent decodes line i of auditLog with the apiserver's scheme.
func realEvent(t *testing.T, i int) *auditv1.Event {
	t.Helper()
	evs, err := newDecoder().events(logLines(t)[i])
	if err != nil || len(evs) != 1 {
		t.Fatalf("line %d of %s: %v", i, auditLog, err)
	}
	return &evs[0]
}

// event is an audit event shaped as the apiserver writes one.
func event(stage auditv1.Stage, annotations ...string) *auditv1.Event {
	start := time.Date(2026, 12, 1, 9, 52, 15, 129251000, time.UTC)
	ev := &auditv1.Event{AuditID: "7c1a2f5e-2b0e-4b7e-9d55-6f2f7b0c1d2e", Stage: stage, Level: auditv1.LevelMetadata,
		Verb: "create", RequestURI: "/api/v1/namespaces/default/configmaps",
		RequestReceivedTimestamp: metav1.NewMicroTime(start), StageTimestamp: metav1.NewMicroTime(start.Add(862022 * time.Microsecond)),
		Annotations: map[string]string{"authorization.k8s.io/decision": "allow", "authorization.k8s.io/reason": ""}}
	for i := 0; i+1 < len(annotations); i += 2 {
		ev.Annotations[annotations[i]] = annotations[i+1]
	}
	return ev
}

func TestLayers(t *testing.T) {
	const us, ms = int64(time.Microsecond), int64(time.Millisecond)
	// The first annotated create of auditLog, as the apiserver wrote it:
	// authentication 71.555µs, authorization 6.402µs, mutating-webhook
	// 154.748432ms, validating-webhook 702.4392ms, transform 731ns,
	// serialize 64.932µs (of which response-write 1.523µs), total
	// 862.022004ms.
	realItemised := int64(71555 + 6402 + 154748432 + 702439200 + 731 + (64932 - 1523) + 1523)
	for _, c := range []struct {
		name string
		ev   *auditv1.Event
		want *record.Server // nil: no observation
	}{
		{name: "real slow create: webhooks", ev: realEvent(t, 1), want: &record.Server{
			Source: record.ServerFromAudit, TotalNs: 862022004,
			Summary: "862ms: 702ms in validating webhooks, 155ms in mutating webhooks, 4.7ms not itemised",
			Layers: []record.ServerLayer{
				{Name: "authentication", Stage: record.StageAuthentication, DurationNs: 71555, SelfNs: 71555},
				{Name: "authorization", Stage: record.StageAuthorization, DurationNs: 6402, SelfNs: 6402},
				{Name: "mutating webhooks", Stage: record.StageMutatingAdmission, DurationNs: 154748432, SelfNs: 154748432},
				{Name: "validating webhooks", Stage: record.StageValidatingAdmission, DurationNs: 702439200, SelfNs: 702439200},
				{Name: "transforming the response", Stage: record.LayerSerialization, DurationNs: 731, SelfNs: 731},
				{Name: "serializing the response", Stage: record.LayerSerialization, DurationNs: 64932, SelfNs: 64932 - 1523},
				{Name: "writing the response", Stage: record.LayerSerialization, DurationNs: 1523, SelfNs: 1523},
				{Name: OtherLayer, Stage: record.LayerOther, DurationNs: 862022004 - realItemised, SelfNs: 862022004 - realItemised},
			}}},
		{name: "real RequestReceived event", ev: realEvent(t, 0)},
		{name: "real fast list: not annotated", ev: realEvent(t, 4)},
		{name: "every key", ev: event(auditv1.StageResponseComplete,
			KeyTotal, "1.2s",
			KeyResponseWrite, "2ms",
			KeySerialize, "10ms",
			KeyTransform, "3ms",
			KeyDecode, "40ms",
			KeyEtcd, "300ms",
			KeyValidatingWebhook, "100ms",
			KeyMutatingWebhook, "200ms",
			KeyAuthorization, "5ms",
			KeyAPFQueueWait, "400ms",
			KeyImpersonation, "20µs",
			KeyAuthentication, "980µs"),
			want: &record.Server{Source: record.ServerFromAudit, TotalNs: 1200 * ms,
				Summary: "1.2s: 400ms queued by APF, 300ms etcd, 200ms in mutating webhooks",
				Layers: []record.ServerLayer{
					{Name: "authentication", Stage: record.StageAuthentication, DurationNs: 980 * us, SelfNs: 980 * us},
					{Name: "impersonation", Stage: record.StageImpersonation, DurationNs: 20 * us, SelfNs: 20 * us},
					{Name: "APF queue wait", Stage: record.StageFlowControl, DurationNs: 400 * ms, SelfNs: 400 * ms},
					{Name: "authorization", Stage: record.StageAuthorization, DurationNs: 5 * ms, SelfNs: 5 * ms},
					{Name: "mutating webhooks", Stage: record.StageMutatingAdmission, DurationNs: 200 * ms, SelfNs: 200 * ms},
					{Name: "validating webhooks", Stage: record.StageValidatingAdmission, DurationNs: 100 * ms, SelfNs: 100 * ms},
					{Name: "etcd", Stage: record.StageStorage, DurationNs: 300 * ms, SelfNs: 300 * ms},
					{Name: "decoding objects from etcd", Stage: record.StageStorage, DurationNs: 40 * ms, SelfNs: 40 * ms},
					{Name: "transforming the response", Stage: record.LayerSerialization, DurationNs: 3 * ms, SelfNs: 3 * ms},
					{Name: "serializing the response", Stage: record.LayerSerialization, DurationNs: 10 * ms, SelfNs: 8 * ms},
					{Name: "writing the response", Stage: record.LayerSerialization, DurationNs: 2 * ms, SelfNs: 2 * ms},
					{Name: OtherLayer, Stage: record.LayerOther, DurationNs: 141 * ms, SelfNs: 141 * ms},
				}}},
		{name: "no total annotation: the event's timestamps", ev: event(auditv1.StageResponseComplete,
			KeyValidatingWebhook, "702.4392ms", KeyAuthentication, "71.555µs"),
			want: &record.Server{Source: record.ServerFromAudit, TotalNs: 862022 * us,
				Summary: "862ms: 702ms in validating webhooks, 160ms not itemised, 72µs authentication",
				Layers: []record.ServerLayer{
					{Name: "authentication", Stage: record.StageAuthentication, DurationNs: 71555, SelfNs: 71555},
					{Name: "validating webhooks", Stage: record.StageValidatingAdmission, DurationNs: 702439200, SelfNs: 702439200},
					{Name: OtherLayer, Stage: record.LayerOther, DurationNs: 862022*us - 702439200 - 71555, SelfNs: 862022*us - 702439200 - 71555},
				}}},
		{name: "a panic", ev: event(auditv1.StagePanic, KeyTotal, "600ms", KeyEtcd, "600ms"),
			want: &record.Server{Source: record.ServerFromAudit, TotalNs: 600 * ms, Summary: "600ms: 600ms etcd",
				Layers: []record.ServerLayer{{Name: "etcd", Stage: record.StageStorage, DurationNs: 600 * ms, SelfNs: 600 * ms}}}},
		{name: "the layers add up to more than the total: no other layer", ev: event(auditv1.StageResponseComplete,
			KeyTotal, "501ms", KeyMutatingWebhook, "300ms", KeyValidatingWebhook, "300ms"),
			want: &record.Server{Source: record.ServerFromAudit, TotalNs: 501 * ms,
				Summary: "501ms: 300ms in mutating webhooks, 300ms in validating webhooks",
				Layers: []record.ServerLayer{
					{Name: "mutating webhooks", Stage: record.StageMutatingAdmission, DurationNs: 300 * ms, SelfNs: 300 * ms},
					{Name: "validating webhooks", Stage: record.StageValidatingAdmission, DurationNs: 300 * ms, SelfNs: 300 * ms},
				}}},
		{name: "writes outside serialization: its self time is never negative", ev: event(auditv1.StageResponseComplete,
			KeyTotal, "600ms", KeySerialize, "1ms", KeyResponseWrite, "3ms"),
			want: &record.Server{Source: record.ServerFromAudit, TotalNs: 600 * ms,
				Summary: "600ms: 597ms not itemised, 3ms writing the response",
				Layers: []record.ServerLayer{
					{Name: "serializing the response", Stage: record.LayerSerialization, DurationNs: 1 * ms, SelfNs: 0},
					{Name: "writing the response", Stage: record.LayerSerialization, DurationNs: 3 * ms, SelfNs: 3 * ms},
					{Name: OtherLayer, Stage: record.LayerOther, DurationNs: 597 * ms, SelfNs: 597 * ms},
				}}},
		{name: "a later apiserver's key, and a value that is not a duration", ev: event(auditv1.StageResponseComplete,
			KeyTotal, "700ms", AnnotationPrefix+"cel-admission", "650ms", KeyEtcd, "fast"),
			want: &record.Server{Source: record.ServerFromAudit, TotalNs: 700 * ms,
				Summary: "700ms: 650ms cel-admission, 50ms not itemised",
				Layers: []record.ServerLayer{
					{Name: "cel-admission", Stage: record.LayerOther, DurationNs: 650 * ms, SelfNs: 650 * ms},
					{Name: OtherLayer, Stage: record.LayerOther, DurationNs: 50 * ms, SelfNs: 50 * ms},
				}}},
		{name: "ResponseStarted (a long-running request's first answer)", ev: event(auditv1.StageResponseStarted, KeyTotal, "700ms")},
		{name: "no latency annotations", ev: event(auditv1.StageResponseComplete)},
		{name: "nil", ev: nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := Layers(c.ev)
			if c.want == nil {
				if ok {
					t.Fatalf("want no observation, got %+v", got)
				}
				return
			}
			if !ok {
				t.Fatal("no observation")
			}
			if d := cmp.Diff(*c.want, got); d != "" {
				t.Errorf("Layers (-want +got):\n%s", d)
			}
			var self int64
			for _, l := range got.Layers {
				self += l.SelfNs
			}
			if self < got.TotalNs {
				t.Errorf("self times add up to %d, less than the total %d: the other layer is missing", self, got.TotalNs)
			}
		})
	}
}

// TestRealLogKeys checks that every latency key the real apiserver wrote
// is one kproxy names, so none ends up as an unnamed "other" layer.
func TestRealLogKeys(t *testing.T) {
	named := map[string]bool{KeyTotal: true}
	for _, k := range kinds() {
		named[k.key] = true
	}
	n := 0
	for i := range logLines(t) {
		for k := range realEvent(t, i).Annotations {
			if strings.HasPrefix(k, AnnotationPrefix) {
				n++
				if !named[k] {
					t.Errorf("the apiserver wrote %s, which kproxy does not name", k)
				}
			}
		}
	}
	if n == 0 {
		t.Fatalf("%s has no latency annotations", auditLog)
	}
}
