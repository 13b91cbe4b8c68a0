// Package auditlatency reads where the apiserver spent a request's time
// from its audit events, for clusters where its tracing cannot be turned
// on (managed control planes, most of them) but its audit stream can be
// pointed somewhere: the audit webhook backend (Webhook) or the JSON
// audit log file (FollowLog).
//
// # What the apiserver writes
//
// The apiserver keeps per-request latency trackers
// (k8s.io/apiserver pkg/endpoints/request/webhook_duration.go) and, when
// a request finishes, writes them into its ResponseComplete audit event as
// annotations (pkg/endpoints/filters/audit.go, writeLatencyToAnnotation):
//
//	apiserver.latency.k8s.io/authentication             sum of authenticator calls
//	apiserver.latency.k8s.io/impersonation              sum of impersonation checks
//	apiserver.latency.k8s.io/apf-queue-wait             time queued by priority and fairness
//	apiserver.latency.k8s.io/authorization              the longest authorizer call
//	apiserver.latency.k8s.io/mutating-webhook           sum of mutating webhook calls (they run in turn)
//	apiserver.latency.k8s.io/validating-webhook         the longest validating webhook call (they run in parallel)
//	apiserver.latency.k8s.io/etcd                       sum of tracked etcd round trips
//	apiserver.latency.k8s.io/decode-response-object     decoding objects read from etcd
//	apiserver.latency.k8s.io/transform-response-object  converting the result (Table, PartialObjectMetadata)
//	apiserver.latency.k8s.io/serialize-response-object  encoding the response, writes included
//	apiserver.latency.k8s.io/response-write             writing the response bytes
//	apiserver.latency.k8s.io/total                      the whole request, for convenience
//
// each a Go duration string ("702.4392ms", "71.555µs"), written only when
// non-zero, and only when the request took longer than 500ms (Threshold:
// the apiserver's own constant, "in keeping with the traces in
// rest/handlers"). Watches carry none: the apiserver does not track them.
// So this is a slow-request account, not a per-request one: a fast request
// simply has no audit latency, and kproxy says nothing rather than guess.
//
// # From annotations to layers
//
// Layers turns one event into a record.Server with Source "audit": one
// layer per annotation, tagged with the contract stage it belongs to
// (authentication, impersonation, flowcontrol for the APF queue,
// authorization, mutating-admission and validating-admission for the
// webhooks, storage for etcd and decoding, serialization for the response
// path), in the order the apiserver runs them, since audit gives no start
// times. The annotations are self times already: each tracker times only
// its own calls, and none nests inside another but one, response-write,
// which the apiserver notes is also counted inside
// serialize-response-object; that layer's self time is therefore its
// value less response-write's, so the self times add up without counting
// a write twice. Whatever the trackers do not cover (the handler's own
// work, the in-tree admission plugins, validation, and, in v1.37, the
// etcd calls of gets, lists, creates, updates and deletes, which go
// through etcd's Kubernetes client rather than the instrumented KV
// client) is the last layer, "other (not itemised by the apiserver)":
// the total less the sum, when that is positive. The layers' self times
// therefore add up to the total, which is what the cockpit draws.
//
// # Joining
//
// Every usable event becomes a servertrace.Observation keyed by its audit
// ID, the ID kproxy records as actual.auditID (the apiserver's Audit-ID
// response header), and is offered to the same Joiner the OTLP receiver
// feeds: the joiner attaches it to the record of that request. Events of
// requests that did not pass through kproxy (controllers, kubelets,
// kproxy's own reads) find no record; the joiner forgets them.
//
// # Transport
//
// Webhook is the receiving end of the apiserver's audit webhook backend
// (--audit-webhook-config-file, a kubeconfig naming kproxy's address):
// batches of audit.k8s.io/v1 EventList, decoded with the apiserver's own
// scheme, answered at once; observations are handed to the joiner through
// a bounded queue, so a slow consumer never holds up the apiserver's
// audit backend (whose buffer would otherwise fill and drop events).
// FollowLog follows --audit-log-path the way tail -F does, through the
// apiserver's lumberjack rotations (the file renamed, a new one created)
// and truncations, from the end of the file as it finds it: old events
// have no records to join.
package auditlatency
