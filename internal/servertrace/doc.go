// Package servertrace tells where a request's time went inside the
// apiserver, from the apiserver's own spans, and joins that account to
// kproxy's record of the request.
//
// # Why the apiserver's spans
//
// kproxy's record has two clocks that cannot say where the time went: the
// upstream latency (the apiserver's answer, seen from outside) and the
// replay (kproxy's own re-run of the stages, whose durations are kproxy's
// cost, not the apiserver's). When a request is slow, the question is
// which layer of the apiserver made it slow: APF queueing, a webhook, etcd,
// encoding a large LIST. The apiserver answers that itself when tracing is
// on (--tracing-config-file): its tracing filter starts a root span at the
// request's received timestamp, every traced filter of its chain (audit,
// impersonation, priorityandfairness, authorization) nests a span that
// ends after everything below it, the resource handler has a span with
// events ("Conversion done", "About to store object in database"), and
// webhook calls, etcd calls and the response's serialization are spans
// below it. kproxy is already in the path; it only has to receive them.
//
// # Receiving
//
// The Receiver is an OTLP/gRPC trace service (the apiserver exports only
// OTLP/gRPC, without TLS). It passes every batch on, unchanged, to
// kproxy's own exporter endpoint, so a Jaeger behind kproxy gets the
// apiserver's spans too, from a bounded queue drained by one goroutine:
// the apiserver's exporter never waits for kproxy's, and a batch that
// does not fit is dropped and counted. It files each span under its
// trace until the request's root span (kind server, with the audit-id
// attribute) arrives: children end before their root, and the batch span
// processor exports spans in the order they end, so the root comes last,
// in the same batch or a later one. Pending spans are bounded in count
// per trace, in traces and in age, so traces whose root never comes
// (another service's, a timed-out handler's late children) cost nothing
// for long.
//
// # Layers and self time
//
// A request's spans become record.ServerLayers in start order, each with
// its depth and its offset from the root's start. A layer's self time is
// the part of its duration no deeper layer accounts for: every instant of
// the root's duration goes to exactly one layer (the deepest running then;
// of siblings running at once, the one that started last, since a webhook
// called inside an etcd update is the handler's child, not the update's),
// so self times add up to the root's duration, and for properly nested
// spans a layer's self time is its duration less the union of its
// children's. The root's own time is what happened before the traced
// chain, authentication above all (its filter runs before the tracing
// filter, so it has no span). Where a span's events allow, its self time
// is split into phases: the handler's "read request body", "decode and
// convert", "admission and validation" (the in-tree admission plugins and
// the registry's validation, between the webhook and etcd calls, which
// have spans of their own: the events do not split them further, and the
// name does not pretend to), "write response"; the update function run
// inside a storage update; the serialization's encoding and writing.
// Client spans (a webhook's HTTP call) stay their parent's time; their URL
// tells the webhook's timeout. The summary names the three biggest self
// times. A record keeps fewer layers than the spans give: a layer under 5%
// of the request's time whose parent is of the same stage (a phase of the
// handler, the serialization's encoding and writing) is folded into its
// parent, unless the summary names it, so that each stage's time stays
// what it was.
//
// # Joining
//
// The Joiner is a record.Sink in front of the capture and flow-API sinks.
// A record that reached the apiserver's traced chain waits there for its
// Observation, matched by audit ID (kproxy sends every request with one),
// or else by trace ID: when kproxy's forwarding identity is in
// system:masters or system:monitoring the apiserver continues kproxy's
// trace (one trace), otherwise it starts its own with a link to kproxy's
// span. An observation may come first (the apiserver exports quickly,
// kproxy's replay is still running) and waits as long for its record. A
// record waits at most Wait and is then written without one; past
// MaxHeld records it is written at once. Write only files the record, so
// the proxy never waits. The first observation offered for a record wins:
// the audit source's, or the trace's. Observations of requests that did
// not go through kproxy (the rest of the cluster's traffic) expire
// unmatched.
package servertrace
