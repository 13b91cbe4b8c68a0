package auditlatency

import (
	"cmp"
	"slices"
	"strings"
	"time"

	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/kproxy/kproxy/internal/flowview"
	"github.com/kproxy/kproxy/internal/record"
)

// Threshold is the apiserver's: it writes latency annotations only into
// the audit events of requests that took longer than this
// (k8s.io/apiserver pkg/endpoints/filters/audit.go, v1.37.2).
const Threshold = 500 * time.Millisecond

// AnnotationPrefix starts every latency annotation the apiserver writes.
const AnnotationPrefix = "apiserver.latency.k8s.io/"

// The annotation keys of k8s.io/apiserver v1.37.2
// (pkg/endpoints/request/webhook_duration.go, and total in
// pkg/endpoints/filters/audit.go).
const (
	KeyAuthentication    = AnnotationPrefix + "authentication"
	KeyImpersonation     = AnnotationPrefix + "impersonation"
	KeyAPFQueueWait      = AnnotationPrefix + "apf-queue-wait"
	KeyAuthorization     = AnnotationPrefix + "authorization"
	KeyMutatingWebhook   = AnnotationPrefix + "mutating-webhook"
	KeyValidatingWebhook = AnnotationPrefix + "validating-webhook"
	KeyEtcd              = AnnotationPrefix + "etcd"
	KeyDecode            = AnnotationPrefix + "decode-response-object"
	KeyTransform         = AnnotationPrefix + "transform-response-object"
	KeySerialize         = AnnotationPrefix + "serialize-response-object"
	KeyResponseWrite     = AnnotationPrefix + "response-write"
	KeyTotal             = AnnotationPrefix + "total"
)

// OtherLayer names the layer of the time no annotation accounts for.
const OtherLayer = "other (not itemised by the apiserver)"

// kind is what kproxy knows of one annotation: the layer it becomes, the
// contract stage, and how the summary says it ("%s in validating
// webhooks").
type kind struct {
	key, name, stage, phrase string
}

// kinds returns the annotations in the order the apiserver runs their
// parts: its filter chain (authentication, impersonation, APF,
// authorization), then the handler (admission, storage, the response).
func kinds() []kind {
	return []kind{
		{KeyAuthentication, "authentication", record.StageAuthentication, "%s authentication"},
		{KeyImpersonation, "impersonation", record.StageImpersonation, "%s impersonation"},
		{KeyAPFQueueWait, "APF queue wait", record.StageFlowControl, "%s queued by APF"},
		{KeyAuthorization, "authorization", record.StageAuthorization, "%s authorization"},
		{KeyMutatingWebhook, "mutating webhooks", record.StageMutatingAdmission, "%s in mutating webhooks"},
		{KeyValidatingWebhook, "validating webhooks", record.StageValidatingAdmission, "%s in validating webhooks"},
		{KeyEtcd, "etcd", record.StageStorage, "%s etcd"},
		{KeyDecode, "decoding objects from etcd", record.StageStorage, "%s decoding from etcd"},
		{KeyTransform, "transforming the response", record.LayerSerialization, "%s transforming the response"},
		{KeySerialize, "serializing the response", record.LayerSerialization, "%s serializing the response"},
		{KeyResponseWrite, "writing the response", record.LayerSerialization, "%s writing the response"},
	}
}

// usable reports whether an event can carry the request's latency: the
// last event of a request (ResponseComplete), or Panic (which the
// apiserver, as of v1.37, sends without latency annotations).
func usable(ev *auditv1.Event) bool {
	return ev.Stage == auditv1.StageResponseComplete || ev.Stage == auditv1.StagePanic
}

// hasLatency reports whether the event carries any latency annotation.
func hasLatency(ev *auditv1.Event) bool {
	for k := range ev.Annotations {
		if strings.HasPrefix(k, AnnotationPrefix) {
			return true
		}
	}
	return false
}

// Layers reads where the apiserver spent the request's time from an audit
// event's apiserver.latency.k8s.io annotations. It reports false for an
// event that is not a request's last (ResponseComplete, or Panic), or
// that has no latency annotation: the apiserver writes them only for
// requests slower than Threshold, and never for watches.
//
// Each annotation is one layer, with the contract stage it belongs to and
// its value as self time (the apiserver's trackers time only their own
// calls); serializing the response, which includes writing it, keeps the
// rest once response-write is taken out. An annotation kproxy does not
// know (a later apiserver's) is a layer of stage "other" named by its
// key. The time no annotation covers is the layer OtherLayer. TotalNs is
// the total annotation, else the time from requestReceivedTimestamp to
// stageTimestamp, else the layers' sum. A value that is not a Go duration
// is left out.
func Layers(ev *auditv1.Event) (record.Server, bool) {
	if ev == nil || !usable(ev) || !hasLatency(ev) {
		return record.Server{}, false
	}
	value := func(key string) (int64, bool) {
		s, ok := ev.Annotations[key]
		if !ok {
			return 0, false
		}
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil || d < 0 {
			return 0, false
		}
		return int64(d), true
	}
	var layers []record.ServerLayer
	known := map[string]bool{KeyTotal: true}
	write, _ := value(KeyResponseWrite)
	for _, k := range kinds() {
		known[k.key] = true
		ns, ok := value(k.key)
		if !ok {
			continue
		}
		self := ns
		if k.key == KeySerialize {
			self = max(ns-write, 0)
		}
		layers = append(layers, record.ServerLayer{Name: k.name, Stage: k.stage, DurationNs: ns, SelfNs: self})
	}
	var unknown []string
	for key := range ev.Annotations {
		if strings.HasPrefix(key, AnnotationPrefix) && !known[key] {
			unknown = append(unknown, key)
		}
	}
	slices.Sort(unknown)
	for _, key := range unknown {
		if ns, ok := value(key); ok {
			layers = append(layers, record.ServerLayer{Name: strings.TrimPrefix(key, AnnotationPrefix), Stage: record.LayerOther, DurationNs: ns, SelfNs: ns})
		}
	}
	var sum int64
	for _, l := range layers {
		sum += l.SelfNs
	}
	total, ok := value(KeyTotal)
	if !ok {
		total = sum
		if start, end := ev.RequestReceivedTimestamp.Time, ev.StageTimestamp.Time; !start.IsZero() && end.After(start) {
			total = int64(end.Sub(start))
		}
	}
	if total <= 0 && len(layers) == 0 {
		return record.Server{}, false
	}
	if rest := total - sum; rest > 0 {
		layers = append(layers, record.ServerLayer{Name: OtherLayer, Stage: record.LayerOther, DurationNs: rest, SelfNs: rest})
	}
	s := record.Server{Source: record.ServerFromAudit, TotalNs: total, Layers: layers}
	s.Summary = summary(s)
	return s, true
}

// summaryParts is how many layers the summary names.
const summaryParts = 3

// summary says where the time went in one sentence, the biggest part
// first: "862ms: 702ms in validating webhooks, 155ms in mutating
// webhooks, 4.9ms not itemised".
func summary(s record.Server) string {
	phrases := map[string]string{OtherLayer: "%s not itemised"}
	for _, k := range kinds() {
		phrases[k.name] = k.phrase
	}
	ls := slices.Clone(s.Layers)
	slices.SortStableFunc(ls, func(a, b record.ServerLayer) int { return cmp.Compare(b.SelfNs, a.SelfNs) })
	var parts []string
	for _, l := range ls {
		if len(parts) == summaryParts || l.SelfNs <= 0 {
			break
		}
		p, ok := phrases[l.Name]
		if !ok {
			p = "%s " + l.Name
		}
		parts = append(parts, strings.Replace(p, "%s", flowview.Duration(l.SelfNs), 1))
	}
	head := flowview.Duration(s.TotalNs)
	if len(parts) == 0 {
		return head
	}
	return head + ": " + strings.Join(parts, ", ")
}
