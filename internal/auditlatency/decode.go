package auditlatency

import (
	"fmt"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apiserver/pkg/apis/audit/install"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/kproxy/kproxy/internal/servertrace"
)

// decoder reads audit.k8s.io objects with the apiserver's own scheme (the
// one its audit backends encode with), made for each reader: no package
// state.
type decoder struct{ d runtime.Decoder }

func newDecoder() *decoder {
	s := runtime.NewScheme()
	install.Install(s)
	// The universal deserializer keeps the version sent (audit.k8s.io/v1,
	// the only one v1.37 writes) and recognises JSON, YAML and protobuf.
	return &decoder{d: serializer.NewCodecFactory(s).UniversalDeserializer()}
}

// events decodes an EventList (what the webhook backend sends) or a single
// Event (a line of the JSON log).
func (d *decoder) events(b []byte) ([]auditv1.Event, error) {
	obj, gvk, err := d.d.Decode(b, nil, nil)
	if err != nil {
		return nil, err
	}
	switch o := obj.(type) {
	case *auditv1.EventList:
		return o.Items, nil
	case *auditv1.Event:
		return []auditv1.Event{*o}, nil
	}
	return nil, fmt.Errorf("got %s, want an audit.k8s.io/v1 EventList or Event", gvk)
}

// observe turns an event into an observation for the joiner, when it
// carries the request's latency.
func observe(ev *auditv1.Event) (servertrace.Observation, bool) {
	s, ok := Layers(ev)
	if !ok || ev.AuditID == "" {
		return servertrace.Observation{}, false
	}
	return servertrace.Observation{AuditID: string(ev.AuditID), Server: s}, true
}

// Counts are what a Webhook or a followed log has read so far.
type Counts struct {
	// Events is how many audit events were read.
	Events int64
	// Observations is how many of them carried latency annotations and
	// were offered to the joiner (by a Webhook: queued for it).
	Observations int64
	// Skipped is how many lines (FollowLog) or request bodies (Webhook)
	// were not audit events: malformed, cut short, over the size limit,
	// or of another kind.
	Skipped int64
	// Dropped is how many observations the Webhook's queue had no room
	// for (the joiner not keeping up).
	Dropped int64
}

// Stats counts what is read; safe for concurrent use. The zero value is
// ready.
type Stats struct {
	events, observations, skipped, dropped atomic.Int64
}

// Counts returns the counts so far.
func (s *Stats) Counts() Counts {
	return Counts{Events: s.events.Load(), Observations: s.observations.Load(),
		Skipped: s.skipped.Load(), Dropped: s.dropped.Load()}
}
