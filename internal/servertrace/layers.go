package servertrace

import (
	"cmp"
	"encoding/hex"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// attrAuditID is the attribute the apiserver's tracing filter sets on its
// root span (k8s.io/apiserver/pkg/endpoints/filters/traces.go), the audit
// ID truncated to 64 bytes.
const attrAuditID = "audit-id"

// maxAuditIDLength is the apiserver's truncation of the audit-id attribute
// (audit.GetAuditIDTruncated).
const maxAuditIDLength = 64

// rootName is the root layer: the root span's self time is what the
// apiserver did before the traced part of its filter chain (the root
// starts at the request's received timestamp; authentication runs before
// the tracing filter, so it has no span of its own) and after it.
const rootName = "authentication (before the traced chain)"

// isRequestRoot reports the apiserver's root span of a request: the
// server-kind span of its tracing filter, which carries the audit ID.
func isRequestRoot(s *tracepb.Span) bool {
	if s.Kind != tracepb.Span_SPAN_KIND_SERVER {
		return false
	}
	_, ok := stringAttr(s.Attributes, attrAuditID)
	return ok
}

// observe turns a request's root span and the spans under it into an
// Observation.
func observe(root *tracepb.Span, spans []*tracepb.Span) Observation {
	auditID, _ := stringAttr(root.Attributes, attrAuditID)
	o := Observation{AuditID: auditID, TraceID: hex.EncodeToString(root.TraceId)}
	// A root with a parent continues the caller's trace (the apiserver
	// honours traceparent from system:masters and system:monitoring
	// callers); otherwise otelhttp links the caller's span context.
	if len(root.ParentSpanId) > 0 {
		o.Links = append(o.Links, o.TraceID)
	}
	for _, l := range root.Links {
		if id := hex.EncodeToString(l.TraceId); len(l.TraceId) == 16 && !slices.Contains(o.Links, id) {
			o.Links = append(o.Links, id)
		}
	}
	o.Server = analyzeFolding(root, spans, true)
	return o
}

// node is one layer while it is worked out: a span, or a phase of a
// span's self time read from its events.
type node struct {
	span       *tracepb.Span // nil for a phase
	name       string
	stage      string
	group      string // the summary's label
	start, end int64  // unix nanoseconds, clipped to the parent
	depth      int
	seq        int // creation order: breaks ties between equal starts
	children   []*node
	phases     []*node // phases own no children: they only split self time
	self       int64
}

// analyze computes the apiserver's own account of one request from its
// root span and the spans under it (others are ignored), every layer
// kept (see analyzeFolding).
//
// Every instant of the root's duration is attributed to exactly one
// layer, so the self times add up to the root's duration: the deepest
// span running then, and among siblings running at once the one that
// started last (a webhook called from inside an etcd update, whose span
// is the handler's child, not the update's, takes the time from the
// update; parallel validating webhooks share it). Within a span's own
// time, a phase read from its events (the handler's "Conversion done",
// ...) takes the time no child span takes. Spans of kind client are the
// parent's outgoing calls (a webhook's HTTP POST): their time stays the
// parent's.
func analyze(root *tracepb.Span, spans []*tracepb.Span) record.Server {
	return analyzeFolding(root, spans, false)
}

// foldPercent is the share of the request's time, in percent, under which
// a layer that only splits a layer of its own stage is folded into it.
const foldPercent = 5

// analyzeFolding is analyze; with fold, as a record keeps the account, a
// layer whose self time is under foldPercent of the total and whose parent
// is of the same stage (the handler's "read request body" and "decode and
// convert", the serialization's "encode" and "write to the connection", a
// watch cache's phases) is folded into that parent, which takes its self
// time; the layers under it move up a level. Each stage's time, the self
// times' sum and the layers of other stages stay as they were, and so
// does the summary (worked out from every layer): a layer it names stays,
// unless its parent goes by the same name in the summary.
func analyzeFolding(root *tracepb.Span, spans []*tracepb.Span, fold bool) record.Server {
	byParent := make(map[spanKey][]*tracepb.Span, len(spans))
	for _, s := range spans {
		if len(s.ParentSpanId) == 8 && s != root {
			byParent[keyOf(s.ParentSpanId)] = append(byParent[keyOf(s.ParentSpanId)], s)
		}
	}
	seq := 0
	mk := func(s *tracepb.Span, parent *node) *node {
		seq++
		n := &node{span: s, seq: seq, start: int64(s.StartTimeUnixNano), end: int64(s.EndTimeUnixNano)}
		if parent != nil {
			n.depth = parent.depth + 1
			n.start = min(max(n.start, parent.start), parent.end)
			n.end = min(max(n.end, n.start), parent.end)
		}
		n.end = max(n.end, n.start)
		return n
	}
	top := mk(root, nil)
	top.name, top.stage, top.group = rootName, record.StageAuthentication, "authentication"
	all := []*node{top}
	var build func(n *node)
	build = func(n *node) {
		for _, c := range byParent[keyOf(n.span.SpanId)] {
			switch {
			case isRequestRoot(c):
				continue // another request (a webhook calling back): its own observation
			case c.Kind == tracepb.Span_SPAN_KIND_CLIENT:
				noteCall(n, c)
				continue
			}
			cn := mk(c, n)
			cn.name, cn.stage, cn.group = layerOf(c)
			n.children = append(n.children, cn)
			all = append(all, cn)
			build(cn)
		}
		for _, p := range phasesOf(n, &seq) {
			n.phases = append(n.phases, p)
			all = append(all, p)
		}
	}
	build(top)
	attributeTime(top, all)

	summary, named := summarize(top.end-top.start, all)
	srv := record.Server{Source: record.ServerFromTrace, TraceID: hex.EncodeToString(root.TraceId), TotalNs: top.end - top.start,
		Layers: make([]record.ServerLayer, 0, len(all)), Summary: summary}
	var flatten func(n *node, depth int)
	flatten = func(n *node, depth int) {
		kids := n.kids()
		if fold {
			kids = n.unfolded(kids, srv.TotalNs, named)
		}
		srv.Layers = append(srv.Layers, record.ServerLayer{Name: n.name, Stage: n.stage, DurationNs: n.end - n.start,
			SelfNs: n.self, OffsetNs: n.start - top.start, Depth: depth})
		if len(kids) > 1 {
			slices.SortStableFunc(kids, func(a, b *node) int {
				if a.start != b.start {
					return cmp.Compare(a.start, b.start)
				}
				return cmp.Compare(a.seq, b.seq)
			})
		}
		for _, k := range kids {
			flatten(k, depth+1)
		}
	}
	flatten(top, 0)
	return srv
}

// kids are a node's layers one level down: its children and its phases.
func (n *node) kids() []*node {
	if len(n.phases) == 0 {
		return n.children
	}
	return append(slices.Clip(n.children), n.phases...)
}

// unfolded returns the kids of n a record keeps (see analyzeFolding): a
// folded kid's self time goes to n, and its own kids take its place.
// named are the summary's groups.
func (n *node) unfolded(kids []*node, total int64, named map[string]bool) []*node {
	var out []*node
	var visit func(k *node)
	visit = func(k *node) {
		if k.stage == n.stage && k.self*100 < total*foldPercent && (k.group == n.group || !named[k.group]) {
			n.self += k.self
			for _, c := range k.kids() {
				visit(c)
			}
			return
		}
		out = append(out, k)
	}
	for _, k := range kids {
		visit(k)
	}
	return out
}

// attributeTime gives each elementary interval between two span or phase
// boundaries to one node (see analyze).
func attributeTime(top *node, all []*node) {
	bounds := make([]int64, 0, 2*len(all))
	for _, n := range all {
		bounds = append(bounds, n.start, n.end)
	}
	slices.Sort(bounds)
	bounds = slices.Compact(bounds)
	for i := 0; i+1 < len(bounds); i++ {
		a, b := bounds[i], bounds[i+1]
		if a < top.start || b > top.end {
			continue
		}
		owner := top
		for {
			next := latestActive(owner.children, a, b)
			if next == nil {
				break
			}
			owner = next
		}
		if p := latestActive(owner.phases, a, b); p != nil {
			owner = p
		}
		owner.self += b - a
	}
}

// latestActive is the node running over all of [a, b) that started last.
func latestActive(ns []*node, a, b int64) *node {
	var best *node
	for _, n := range ns {
		if n.start <= a && n.end >= b && (best == nil || n.start > best.start || (n.start == best.start && n.seq > best.seq)) {
			best = n
		}
	}
	return best
}

// handlerSpans are the resource handlers' spans
// (k8s.io/apiserver/pkg/endpoints/handlers).
var handlerSpans = map[string]bool{"Create": true, "Get": true, "List": true, "Update": true, "Patch": true, "Delete": true, "WatchList": true}

// layerOf names a span's layer, its stage and its summary label.
func layerOf(s *tracepb.Span) (name, stage, group string) {
	n := s.Name
	switch {
	case n == "audit":
		return "audit", record.LayerAudit, "audit"
	case n == "impersonation":
		return "impersonation", record.StageImpersonation, "impersonation"
	case n == "constrainedimpersonation":
		return "constrained impersonation", record.StageImpersonation, "impersonation"
	case n == "priorityandfairness":
		return "APF (queue wait and dispatch)", record.StageFlowControl, "APF queue"
	case n == "authorization":
		return "authorization", record.StageAuthorization, "authorization"
	case handlerSpans[n]:
		return "handler " + n, record.StageDecode, "handler " + n
	case n == "Call validating webhook" || n == "Call mutating webhook":
		kind, stage := "validating", record.StageValidatingAdmission
		if strings.Contains(n, "mutating") {
			kind, stage = "mutating", record.StageMutatingAdmission
		}
		name = kind + " webhook"
		if w, ok := stringAttr(s.Attributes, "webhook"); ok && w != "" {
			name += " " + w
		}
		return name, stage, name
	case strings.HasSuffix(n, " etcd3"):
		op := strings.TrimSuffix(n, " etcd3")
		if i := strings.IndexByte(op, '('); i > 0 {
			op = op[:i] // List(recursive=true)
		}
		return "etcd " + op, record.StageStorage, "etcd"
	case strings.HasPrefix(n, "cacher."):
		return "watch cache " + strings.TrimPrefix(n, "cacher."), record.StageStorage, "watch cache"
	case strings.HasPrefix(n, "TransformFromStorage with envelopeTransformer"):
		return "KMS decrypt", record.StageStorage, "KMS"
	case strings.HasPrefix(n, "TransformToStorage with envelopeTransformer"):
		return "KMS encrypt", record.StageStorage, "KMS"
	case n == "SerializeObject":
		return "serialize response", record.LayerSerialization, "serialization"
	case n == "WatchServer.HandleHTTP":
		return "watch stream", record.LayerSerialization, "watch stream"
	}
	return n, record.LayerOther, n
}

// noteCall folds a client span (a webhook's HTTP call, an authorization
// webhook's) into its parent: the time stays the parent's; a webhook's
// timeout, sent as ?timeout= on the call's URL, joins its name.
func noteCall(parent *node, c *tracepb.Span) {
	if parent.stage != record.StageValidatingAdmission && parent.stage != record.StageMutatingAdmission {
		return
	}
	for _, k := range []string{"url.full", "http.url"} {
		raw, ok := stringAttr(c.Attributes, k)
		if !ok {
			continue
		}
		if u, err := url.Parse(raw); err == nil {
			if t := u.Query().Get("timeout"); t != "" && !strings.Contains(parent.group, "(timeout") {
				parent.group += " (timeout " + t + ")"
			}
		}
		return
	}
}

// phaseRule splits a span's self time by its events: from each event
// named in from (or the span's start when from is empty) to the next
// named in to (or the span's end, when untilEnd).
type phaseRule struct {
	name, stage, group string
	from, to           []string
	untilEnd           bool
}

var (
	readBody = phaseRule{name: "read request body", stage: record.StageDecode, group: "reading the request body",
		to: []string{"limitedReadBody succeeded", "limitedReadBody failed"}}
	decodeConvert = phaseRule{name: "decode and convert", stage: record.StageDecode, group: "decoding",
		from: []string{"About to convert to expected version"}, to: []string{"Conversion done"}}
	// Between these events the handler runs admission (mutating and
	// validating, in-tree plugins and webhooks), the registry's strategy
	// and validation, and the storage call: webhooks and etcd calls have
	// spans of their own; the rest is not split further by the
	// apiserver's events, and the name says so.
	admitStore = phaseRule{name: "admission and validation", stage: record.StageValidation, group: "admission plugins and validation",
		from: []string{"About to store object in database"}, to: []string{"Write to database call succeeded", "Write to database call failed"}, untilEnd: true}
	admitDelete = phaseRule{name: "admission and deletion", stage: record.StageValidatingAdmission, group: "admission plugins",
		from: []string{"About to delete object from database"}, to: []string{"Object deleted from database"}, untilEnd: true}
	writeResponse = phaseRule{name: "write response", stage: record.LayerSerialization, group: "serialization",
		from: []string{"About to write a response"}, to: []string{"Writing http response done"}, untilEnd: true}
)

// phaseRules are the spans whose events split their self time.
var phaseRules = map[string][]phaseRule{
	"Create": {readBody, decodeConvert, admitStore, writeResponse},
	"Update": {readBody, decodeConvert, admitStore, writeResponse},
	"Patch":  {readBody, writeResponse},
	"Delete": {readBody, admitDelete, writeResponse},
	"Get":    {writeResponse},
	// The update function runs inside the storage update (an update's
	// mutating admission, a patch's application, validation, validating
	// admission): its time is not etcd's.
	"GuaranteedUpdate etcd3": {{name: "update fn: admission, validation", stage: record.StageValidation, group: "admission plugins and validation",
		from: []string{"initial value restored", "Retry value restored"}, to: []string{"About to Encode"}, untilEnd: true}},
	"SerializeObject": {
		{name: "encode", stage: record.LayerSerialization, group: "serialization", to: []string{"About to start writing response"}},
		{name: "write to the connection", stage: record.LayerSerialization, group: "writing the response",
			from: []string{"About to start writing response"}, to: []string{"Write call succeeded", "Write call failed"}},
	},
	"cacher.GetList": {{name: "wait for fresh cache, list", stage: record.StageStorage, group: "watch cache",
		from: []string{"Ready"}, to: []string{"Listed items from cache"}}},
}

// phasesOf reads a span's phases from its events.
func phasesOf(n *node, seq *int) []*node {
	rules := phaseRules[n.span.Name]
	if len(rules) == 0 || n.end <= n.start {
		return nil
	}
	evs := slices.Clone(n.span.Events)
	slices.SortStableFunc(evs, func(a, b *tracepb.Span_Event) int {
		switch {
		case a.TimeUnixNano < b.TimeUnixNano:
			return -1
		case a.TimeUnixNano > b.TimeUnixNano:
			return 1
		}
		return 0
	})
	clip := func(t uint64) int64 { return min(max(int64(t), n.start), n.end) }
	var out []*node
	for _, r := range rules {
		var starts []int64
		if len(r.from) == 0 {
			starts = []int64{n.start}
		} else {
			for _, e := range evs {
				if slices.Contains(r.from, e.Name) {
					starts = append(starts, clip(e.TimeUnixNano))
				}
			}
		}
		for _, s := range starts {
			end, found := int64(0), false
			for _, e := range evs {
				if t := clip(e.TimeUnixNano); t >= s && slices.Contains(r.to, e.Name) {
					end, found = t, true
					break
				}
			}
			if !found {
				if !r.untilEnd {
					continue
				}
				end = n.end
			}
			if end <= s {
				continue
			}
			*seq++
			out = append(out, &node{name: r.name, stage: r.stage, group: r.group, start: s, end: end, depth: n.depth + 1, seq: *seq})
		}
	}
	return out
}

// summarize is one sentence: the total, then the three biggest self
// times, grouped (every etcd call is "etcd"); named are the groups it
// names.
func summarize(total int64, all []*node) (summary string, named map[string]bool) {
	type item struct {
		group string
		ns    int64
		first int
	}
	var items []*item
	idx := map[string]*item{}
	for i, n := range all {
		if n.self <= 0 {
			continue
		}
		it := idx[n.group]
		if it == nil {
			it = &item{group: n.group, first: i}
			idx[n.group] = it
			items = append(items, it)
		}
		it.ns += n.self
	}
	sort.SliceStable(items, func(i, j int) bool { return items[i].ns > items[j].ns })
	var parts []string
	named = map[string]bool{}
	for i, it := range items {
		// The top three, and never one too small to matter (under 1%).
		if i == 3 || (i > 0 && it.ns*100 < total) {
			break
		}
		parts = append(parts, FormatDuration(it.ns)+" in "+it.group)
		named[it.group] = true
	}
	if len(parts) == 0 {
		return FormatDuration(total) + " in the apiserver", named
	}
	return FormatDuration(total) + ": " + strings.Join(parts, ", "), named
}

// FormatDuration writes a duration with two or three significant digits
// and a spaced unit: "1.2 s", "40 ms", "850 µs".
func FormatDuration(ns int64) string {
	d := time.Duration(ns)
	var v float64
	var unit string
	switch {
	case d >= time.Second:
		v, unit = d.Seconds(), "s"
	case d >= time.Millisecond:
		v, unit = float64(d)/float64(time.Millisecond), "ms"
	case d >= time.Microsecond:
		v, unit = float64(d)/float64(time.Microsecond), "µs"
	default:
		return fmt.Sprintf("%d ns", ns)
	}
	if v >= 10 {
		return fmt.Sprintf("%.0f %s", v, unit)
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}

// spanKey is a span ID as a map key.
type spanKey [8]byte

func keyOf(id []byte) (k spanKey) {
	copy(k[:], id)
	return k
}

// stringAttr reads a string attribute.
func stringAttr(attrs []*commonpb.KeyValue, key string) (string, bool) {
	for _, a := range attrs {
		if a.Key == key {
			if sv, ok := a.Value.GetValue().(*commonpb.AnyValue_StringValue); ok {
				return sv.StringValue, true
			}
			return "", true
		}
	}
	return "", false
}
