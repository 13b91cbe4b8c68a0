package stages

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/storage"

	"github.com/kproxy/kproxy/internal/record"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// storage reports the storage part of the handler's run. For a write:
// existence and resourceVersion/uid preconditions checked against the
// object as it was read from the cluster (the registry runs in dry run
// and never writes), the etcd key with its revisions, encoding and
// encryption, and the size the value would have against etcd's request
// limit. For a read: the apiserver's etcd3 store's answer (NotFound,
// resourceVersion too large or too old, continue tokens) when kproxy can
// read etcd, else the latest state through the apiserver.
type storageStage struct{ m *machinery }

func newStorage(m *machinery) handlerStage { return storageStage{m} }

func (storageStage) Name() string { return record.StageStorage }

func (st storageStage) report(ctx context.Context, req *Request, run *apiserver.Run) Result {
	if run != nil && run.Read {
		return st.reportRead(run)
	}
	if req.Info != nil && !req.Info.IsResourceRequest && run == nil {
		return Pass("a non-resource request: the apiserver's own handler answers without reading storage")
	}
	if !apiserver.IsWrite(req.Info) {
		return Skip("not replayed (see decode)")
	}
	run, none := handlerRunOf(record.StageStorage, req, run)
	if run == nil {
		return none
	}
	var reads []string
	seen := map[string]bool{}
	for i := len(run.Reads) - 1; i >= 0; i-- {
		r := run.Reads[i]
		if seen[r.Key] {
			continue // the registry may read an object twice; say the last
		}
		seen[r.Key] = true
		s := r.Key + ": "
		switch {
		case r.Found && r.Undecodable != nil:
			s += "found, and the apiserver's store cannot decrypt or decode it (" + r.Undecodable.Error() + ")"
		case r.Found:
			s += "found at resourceVersion " + r.ResourceVersion
		default:
			s += "not found"
		}
		switch {
		case r.Snapshot != "" && r.OwnWrite != "":
			s += fmt.Sprintf(" as of resourceVersion %s, the last before the request %s (the apiserver's answer, a Status, names no resourceVersion)", r.Snapshot, r.OwnWrite)
		case r.Snapshot != "" && r.MarkedForDelete:
			s += fmt.Sprintf(" as of resourceVersion %s, before the request's own writes: it marked the object for deletion (deletionTimestamp, grace period 0), then deleted it", r.Snapshot)
		case r.Snapshot != "" && r.MarkedEarlier != "":
			s += fmt.Sprintf(" as of resourceVersion %s, the newest: %s", r.Snapshot, r.MarkedEarlier)
		case r.Snapshot != "" && r.Emptied:
			s += fmt.Sprintf(" as of resourceVersion %s, which the apiserver answered: the request removed the last finalizers of the object being deleted, and the apiserver deleted it instead of storing the update (its answer keeps the resourceVersion the request met)", r.Snapshot)
		case r.Snapshot != "" && r.NoOp:
			s += fmt.Sprintf(" as of resourceVersion %s, which the request left unchanged (the apiserver answered with it)", r.Snapshot)
		case r.Snapshot != "":
			s += fmt.Sprintf(" as of resourceVersion %s, before the request's own write", r.Snapshot)
		}
		switch r.Later {
		case "":
		case "deleted":
			s += "; deleted (by the request, its last finalizer removed, or by a later write) before the replay read it"
		default:
			s += fmt.Sprintf("; a later write had changed it (resourceVersion %s) before the replay read it", r.Later)
		}
		if r.Created {
			s += " (the request created it, which etcd does only for an absent key)"
		}
		if r.Recreated != 0 {
			s += fmt.Sprintf("; the name was created again at revision %d, after the request's delete: read as it stood just before that delete, from etcd's history", r.Recreated)
		}
		if r.DryRunCreated != "" {
			s += fmt.Sprintf(" (the dry run, answered 201, found no object; another write created it, resourceVersion %s, before the replay read it)", r.DryRunCreated)
		}
		how := "read through the apiserver"
		if r.FromEtcd {
			how = "read from etcd by the apiserver's etcd3 store"
		}
		reads = append(reads, fmt.Sprintf("%s (%s in %v)", s, how, r.Duration.Round(10_000)))
	}
	start, end, reached := run.PhaseTimes(apiserver.PhaseStorage)
	if !reached {
		start, end = run.End, run.End
	}
	etcd, spans, current := st.inspectWrite(ctx, req, run)
	var res Result
	switch {
	case run.Decided == record.StageStorage:
		res = Reject(run.Status, "storage refuses: "+apiserver.StatusMessage(run.Status)+explainReads(reads)+etcd)
	case run.Decided != "":
		res = Skip(notReached(run))
	default:
		res = st.sizeCheck(ctx, req, run, "dry run: the registry accepts the write"+explainReads(reads)+etcd, current)
	}
	res.Began, res.Ended, res.Spans = start, end, spans
	return res
}

func explainReads(reads []string) string {
	if len(reads) == 0 {
		return ""
	}
	return "; read " + strings.Join(reads, "; ")
}

// inspectWrite reads the written object's etcd key directly, as it was
// when the request arrived (the revision the replay read it at), when
// kproxy can read etcd.
func (st storageStage) inspectWrite(ctx context.Context, req *Request, run *apiserver.Run) (string, []childSpan, *apiserver.EtcdKV) {
	w := st.m.writer()
	if w == nil {
		return "; etcd not read (kproxy was not given --etcd-servers): the apiserver's view", nil, nil
	}
	if ok, why := w.EtcdAccess(); !ok {
		return "; etcd not read (" + why + "): the apiserver's view", nil, nil
	}
	if len(run.Reads) == 0 {
		return "", nil, nil
	}
	r := run.Reads[len(run.Reads)-1]
	switch {
	case r.Etcd != nil && r.Created && r.Etcd.Found && strconv.FormatInt(r.Etcd.CreateRevision-1, 10) == r.Snapshot:
		// The replay read the key as it is now, the request's own create
		// in it (its createRevision): just before, etcd held nothing there.
		kv := *r.Etcd
		out := fmt.Sprintf("; etcd %s: absent before the request's own create (createRevision %d; read at revision %d in %v)",
			kv.Key, kv.CreateRevision, kv.Revision, kv.Latency.Round(10*time.Microsecond))
		return out, []childSpan{etcdSpan("etcd get", kv, r.EtcdStart)}, &apiserver.EtcdKV{Key: kv.Key, Revision: kv.Revision}
	case r.Etcd != nil && !r.Created:
		// The replay's own read of the key, as etcd answered it.
		return st.describeKV(*r.Etcd, run), []childSpan{etcdSpan("etcd get", *r.Etcd, r.EtcdStart)}, r.Etcd
	}
	var rev int64
	if r.Snapshot != "" {
		rev, _ = strconv.ParseInt(r.Snapshot, 10, 64) // "last-existing" and such read the latest
	}
	start := st.m.clock.Now()
	kv, _, _ := w.InspectEtcd(ctx, r.Key, rev)
	return st.describeKV(kv, run), []childSpan{etcdSpan("etcd get", kv, start)}, &kv
}

// describeKV says what etcd holds under the written object's key.
func (st storageStage) describeKV(kv apiserver.EtcdKV, run *apiserver.Run) string {
	out := "; " + kv.String()
	if kv.Found && run.BodyRV != "" && fmt.Sprint(kv.ModRevision) != run.BodyRV {
		out += fmt.Sprintf("; the request names resourceVersion %s, etcd's modRevision is %d", run.BodyRV, kv.ModRevision)
	}
	return out
}

func etcdSpan(name string, kv apiserver.EtcdKV, start time.Time) childSpan {
	c := childSpan{Name: name, Start: start, End: start.Add(kv.Latency), Outcome: record.Pass,
		Attrs: []attribute.KeyValue{
			attribute.String("etcd.key", kv.Key), attribute.Bool("etcd.found", kv.Found),
			attribute.Int64("etcd.revision", kv.Revision), attribute.Int64("etcd.mod_revision", kv.ModRevision),
			attribute.Int64("etcd.create_revision", kv.CreateRevision), attribute.Int("etcd.value_bytes", kv.Size),
			attribute.String("etcd.encoding", string(kv.Encoding)), attribute.String("etcd.encryption", kv.Encryption),
			attribute.Int64("etcd.latency_us", kv.Latency.Microseconds()),
		}}
	if kv.Err != nil {
		c.Outcome, c.Err = "error", kv.Err.Error()
	}
	return c
}

// reportRead reports a get, list or watch.
func (st storageStage) reportRead(run *apiserver.Run) Result {
	start, end, reached := run.PhaseTimes(apiserver.PhaseStorage)
	if !reached {
		start, end = run.End, run.End
	}
	var parts, reads []string
	var spans []childSpan
	for _, r := range run.Reads {
		reads = append(reads, describeRead(r))
		if r.FromEtcd {
			spans = append(spans, childSpan{Name: "etcd3 store " + map[bool]string{true: "list", false: "get"}[r.List],
				Start: r.Start, End: r.Start.Add(r.Duration), Outcome: record.Pass,
				Attrs: []attribute.KeyValue{attribute.String("storage.key", r.Key), attribute.String("storage.options", r.Options),
					attribute.Int64("etcd.latency_us", r.Duration.Microseconds())}})
			switch {
			case r.Etcd != nil:
				spans = append(spans, etcdSpan("etcd get", *r.Etcd, r.EtcdStart))
			case r.EtcdRev != 0:
				spans = append(spans, childSpan{Name: "etcd range", Start: r.EtcdStart, End: r.EtcdStart.Add(r.EtcdLatency), Outcome: record.Pass,
					Attrs: []attribute.KeyValue{attribute.String("etcd.prefix", r.EtcdPrefix), attribute.Int64("etcd.revision", r.EtcdRev),
						attribute.Int64("etcd.count", r.EtcdCount), attribute.Int64("etcd.latency_us", r.EtcdLatency.Microseconds())}})
			}
		}
	}
	if run.Narrowed != "" {
		parts = append(parts, "the replay read the list with "+run.Narrowed+" (same resourceVersion semantics, one item)")
	}
	var res Result
	switch {
	case run.Unknown != "":
		res, _ = unknownFrom(record.StageStorage, run)
	case run.Decided == record.StageStorage:
		res = Reject(run.Status, "storage refuses: "+apiserver.StatusMessage(run.Status)+whyRefused(run)+"; "+strings.Join(append(reads, parts...), "; "))
	case run.Decided != "":
		res = Skip(notReached(run))
	case run.Watched:
		res = Pass("a watch: the handler accepts its options and the stream starts; its events are not replayed " +
			"(a resourceVersion older than the watch cache's window arrives as an ERROR event, 410 Expired, inside the 200 stream)")
	case len(run.Reads) == 0:
		res = Pass("the handler answers without reading storage")
	default:
		res = Pass(strings.Join(append(reads, parts...), "; "))
	}
	res.Began, res.Ended, res.Spans = start, end, spans
	return res
}

func describeRead(r apiserver.StorageRead) string {
	what := "get " + r.Key
	switch {
	case r.Watch:
		what = "watch " + r.Key
	case r.List:
		what = "list " + r.Key
	}
	what += " with " + r.Options
	switch {
	case r.Refused != nil && storage.IsNotFound(r.Refused):
		what += ": not found"
	case r.Refused != nil && r.Compacted != "":
		what += ": " + r.Refused.Error() + " (" + r.Compacted + ")"
	case r.Refused != nil:
		what += ": " + r.Refused.Error()
	case r.List:
		what += fmt.Sprintf(": listed at resourceVersion %s", r.ResourceVersion)
	default:
		what += fmt.Sprintf(": found at resourceVersion %s", r.ResourceVersion)
	}
	switch {
	case r.BeforeRead:
		what += " (the watch cache parses a get's or a watch's resourceVersion before reading anything)"
	case r.FromAnswer:
		what += " (the object in the apiserver's answer: etcd not read again)"
	case r.FromEtcd:
		what += fmt.Sprintf(" (the apiserver's etcd3 store, on etcd, in %v)", r.Duration.Round(10*time.Microsecond))
		if r.Etcd != nil {
			what += "; " + r.Etcd.String()
		}
		switch {
		case r.EtcdRev == 0:
		case strings.Contains(r.Options, "continue"):
			what += fmt.Sprintf("; etcd holds %d key(s) from the continue token's key to the end of %s at revision %d (read in %v)",
				r.EtcdCount, r.EtcdPrefix, r.EtcdRev, r.EtcdLatency.Round(10*time.Microsecond))
		default:
			what += fmt.Sprintf("; etcd holds %d key(s) under %s at revision %d (read in %v)", r.EtcdCount, r.EtcdPrefix, r.EtcdRev, r.EtcdLatency.Round(10*time.Microsecond))
		}
	default:
		what += fmt.Sprintf(" (through the apiserver in %v: the apiserver's view; etcd not read%s)", r.Duration.Round(10*time.Microsecond), r.NoEtcd)
	}
	return what
}

// whyRefused adds what the status leaves out.
func whyRefused(run *apiserver.Run) string {
	st := run.Status
	if st.Details != nil {
		for _, c := range st.Details.Causes {
			if c.Type == "ResourceVersionTooLarge" {
				return " (the apiserver's watch cache waits up to 3 seconds for a resourceVersion it has not seen, then answers this; the etcd3 store answers at once)"
			}
		}
	}
	switch {
	case strings.Contains(st.Message, "continue"):
		return " (a continue token encodes the key to resume at and the list's resourceVersion; it must come from the same resource's previous page)"
	case st.Code == 410:
		return " (etcd has compacted the revisions the request asks for)"
	}
	return ""
}

// gr is the request's resource.
func gr(req *Request) schema.GroupResource {
	return schema.GroupResource{Group: req.Info.APIGroup, Resource: req.Info.Resource}
}
