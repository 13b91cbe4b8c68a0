package apiserver

import (
	"context"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	api "k8s.io/kubernetes/pkg/apis/core"

	"github.com/kproxy/kproxy/internal/record"
)

// A binding (the scheduler's) and an eviction (a drain's) are writes the
// apiserver answers with a Status that names no resourceVersion, so the
// replay, which always runs after the answer, cannot tell from the answer
// where the request's own write is in the object's history. Read as it is
// now, the pod already shows that write: a bound pod refuses a binding
// (409 "already assigned"), an evicted pod is gone (404). What the write
// did is known, though, and once done it is never undone: a pod's node is
// set once; the eviction marks the pod (the DisruptionTarget condition)
// before it deletes it, and a pod being deleted stays so. The replay finds
// the first revision of the pod showing it (reads at exact revisions,
// stepping back from the newest that shows it, then bisecting) and reads
// the pod just before: the state the request met.
//
// Unless that first mark is not the request's own: a pod already being
// deleted (an earlier eviction, a delete) is evicted again without its
// disruption budget being asked (the eviction's canIgnorePDB), and that
// second eviction writes nothing. The mark carries its time (the
// DisruptionTarget condition's lastTransitionTime, the deletion's
// timestamp less its grace period), in seconds of the apiserver's clock:
// a mark from clearly before the request arrived (markSlack) was met by
// the request, which then read the pod as it is. A mark within seconds of
// the arrival could be either; the replay reads before it, and a refusal
// that contradicts the answer says so (refusedLate).

// markSlack is how long before a request's arrival a mark must carry to
// be known as earlier: its time is cut to the second, and the
// apiserver's clock may be a second off kproxy's.
const markSlack = 2 * time.Second

// markWindow places a mark's time against the request's arrival: earlier,
// clearly before it (the request met the mark); around, within seconds
// of it, where the mark may be the request's own or one just before. A
// mark later than that is the request's (or a later one's).
func markWindow(markedAt, arrival time.Time) (earlier, around bool) {
	if markedAt.IsZero() || arrival.IsZero() {
		return false, false
	}
	earlier = markedAt.Add(markSlack).Before(arrival)
	return earlier, !earlier && markedAt.Before(arrival.Add(time.Second))
}

// ownWrite reports whether the object already shows the request's own
// write.
type ownWrite struct {
	what string // what the write does, for messages
	done func(runtime.Object) bool
	// markedAt is when the object's first state showing the write was
	// written, as far as it says (nil: never known, a binding).
	markedAt func(runtime.Object) (time.Time, bool)
}

// ownWriteOf is the write a request answered without a resourceVersion
// makes, or nil when the replay reads the latest for it.
func ownWriteOf(r *Run) *ownWrite {
	switch {
	case r.Verb != "create":
		return nil
	case r.Resource == "pods" && r.Subresource == "binding", r.Resource == "bindings" && r.Subresource == "":
		return &ownWrite{what: "bound the pod to a node", done: func(o runtime.Object) bool {
			p, ok := o.(*api.Pod)
			return ok && p.Spec.NodeName != ""
		}}
	case r.Resource == "pods" && r.Subresource == "eviction":
		return &ownWrite{what: "marked the pod for eviction", done: func(o runtime.Object) bool {
			p, ok := o.(*api.Pod)
			if !ok {
				return false
			}
			if p.DeletionTimestamp != nil {
				return true
			}
			for _, c := range p.Status.Conditions {
				if c.Type == api.DisruptionTarget && c.Reason == "EvictionByEvictionAPI" {
					return true
				}
			}
			return false
		}, markedAt: evictionMarkedAt}
	}
	return nil
}

// evictionMarkedAt is when a pod was marked for eviction or deletion: its
// eviction's DisruptionTarget condition, or else its deletion (the
// deletion timestamp is the deletion's time plus the grace period).
func evictionMarkedAt(o runtime.Object) (time.Time, bool) {
	p, ok := o.(*api.Pod)
	if !ok {
		return time.Time{}, false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == api.DisruptionTarget && c.Reason == "EvictionByEvictionAPI" && !c.LastTransitionTime.IsZero() {
			return c.LastTransitionTime.Time, true
		}
	}
	if p.DeletionTimestamp == nil || p.DeletionGracePeriodSeconds == nil {
		return time.Time{}, false
	}
	return p.DeletionTimestamp.Add(-time.Duration(*p.DeletionGracePeriodSeconds) * time.Second), true
}

// ownWriteRead is which state readBeforeOwnWrite read.
type ownWriteRead struct {
	at string // the resourceVersion read at
	// markedAt is when the first state showing the write was written, if
	// it says; earlier, that it was clearly before the request arrived:
	// the state read is then the newest, which the request met marked.
	markedAt time.Time
	earlier  bool
}

// readBeforeOwnWrite reads into out the object as it was just before the
// request's own write w, or as it is when the first state showing w was
// written clearly before the request arrived. out holds the newest state
// that shows it, at resourceVersion hi.
func readBeforeOwnWrite(ctx context.Context, src objectSource, w *ownWrite, hi string, arrival time.Time, seenMarked func(types.UID) bool, out runtime.Object) (ownWriteRead, error) {
	if !w.done(out) {
		return ownWriteRead{}, fmt.Errorf("the request %s (the apiserver answered success), and the pod as last stored (resourceVersion %s) does not show it: it was replaced after this request, so the state on arrival is not known", w.what, hi)
	}
	m, err := meta.Accessor(out)
	if err != nil {
		return ownWriteRead{}, err
	}
	uid := m.GetUID()
	after, err := strconv.ParseInt(hi, 10, 64)
	if err != nil {
		return ownWriteRead{}, fmt.Errorf("resourceVersion %q: %w", hi, err)
	}
	// probe reads the object at rev: before reports a state from before
	// the write (this object not yet created counts as before it).
	probe := func(rev int64) (obj runtime.Object, before bool, err error) {
		obj = reflect.New(reflect.TypeOf(out).Elem()).Interface().(runtime.Object)
		found, err := src.at(ctx, strconv.FormatInt(rev, 10), obj)
		if err != nil || !found {
			return nil, true, err
		}
		if m, err := meta.Accessor(obj); err != nil || m.GetUID() != uid {
			return nil, true, err // an earlier object of the same name
		}
		if w.done(obj) {
			return obj, false, nil
		}
		return obj, true, nil
	}
	var before int64
	var met runtime.Object // the state before, once found
	first := out           // the first state showing the write, once found
	for step := int64(1); ; step *= 2 {
		rev := after - step
		if rev < 1 {
			rev = 1
		}
		obj, isBefore, err := probe(rev)
		if err != nil {
			return ownWriteRead{}, err
		}
		if isBefore {
			before, met = rev, obj
			break
		}
		if rev == 1 {
			return ownWriteRead{}, fmt.Errorf("the pod shows the request's write (%s) at every revision etcd holds", w.what)
		}
		after, first = rev, obj
	}
	for after-before > 1 {
		mid := before + (after-before)/2
		obj, isBefore, err := probe(mid)
		if err != nil {
			return ownWriteRead{}, err
		}
		if isBefore {
			before, met = mid, obj
		} else {
			after, first = mid, obj
		}
	}
	var res ownWriteRead
	if w.markedAt != nil {
		res.markedAt, _ = w.markedAt(first)
	}
	res.earlier, _ = markWindow(res.markedAt, arrival)
	if !res.earlier && seenMarked != nil && seenMarked(uid) {
		// kproxy's informer saw the pod marked before the request
		// arrived: an earlier request's mark, whatever its time says.
		res.earlier = true
	}
	if met == nil && !res.earlier {
		return ownWriteRead{}, fmt.Errorf("the pod was created already showing what the request did (%s, at resourceVersion %d): the state the request met is not known", w.what, after)
	}
	res.at = strconv.FormatInt(before, 10)
	if res.earlier {
		// Marked by an earlier request: this one met the pod marked, as
		// it is now (out, at hi). Once marked, a pod stays so.
		res.at = hi
	}
	// Read it once more, so the storage stage describes this read (etcd's
	// answer for it), into a fresh object: a decode into out would keep
	// fields the earlier state lacks.
	obj := reflect.New(reflect.TypeOf(out).Elem()).Interface().(runtime.Object)
	found, err := src.at(ctx, res.at, obj)
	if err == nil && !found {
		err = fmt.Errorf("the pod: absent at resourceVersion %s, where it was just read", res.at)
	}
	if err != nil {
		return ownWriteRead{}, err
	}
	reflect.ValueOf(out).Elem().Set(reflect.ValueOf(obj).Elem())
	return res, nil
}

// refusedLate says why a refusal of the replay says nothing about the
// request, or "". The replay's NamespaceLifecycle found no namespace that
// the apiserver's had found (it answered otherwise than 404); or the
// apiserver admitted the write (2xx), and the replay refused it from
// state it read after the request, which the request itself (or the write
// after it) had changed:
//   - an eviction refused for the pod's disruption budget: the replay
//     reads the PodDisruptionBudget as it is now, through the apiserver,
//     and the request had used the budget's allowed disruption before;
//   - NamespaceLifecycle refusing a terminating namespace: the plugin reads
//     namespaces from an informer, in the apiserver as in the replay, and
//     the namespace began terminating after the request (its controller
//     empties it right after), or the apiserver's informer had not yet
//     seen it.
//
// The replay's ServiceAccount admission finding no pod's ServiceAccount
// that the apiserver's had found (it admitted the pod) is the same,
// dry run or not: the ServiceAccount was deleted after the request.
func (r *Run) refusedLate(ctx context.Context) string {
	if r.Read || r.actual == nil || r.Status == nil {
		return ""
	}
	if r.Status.Code == http.StatusNotFound && r.PluginErrName == "NamespaceLifecycle" {
		// The namespace is gone for the replay. The apiserver's own
		// NamespaceLifecycle, which runs first among its mutating plugins,
		// answers that 404 too: any other answer means it found the
		// namespace (terminating, most likely), deleted since.
		if aw, ok := r.actual(ctx); ok && aw.Status != http.StatusNotFound {
			return fmt.Sprintf(namespaceGoneLateWhy, aw.Status)
		}
		return ""
	}
	if r.PluginErrName == "ServiceAccount" && serviceAccountLookup(r.Status) {
		if aw, ok := r.actual(ctx); ok && aw.Status >= 200 && aw.Status < 300 {
			return serviceAccountGoneLateWhy
		}
		return ""
	}
	if r.Resource == "services" && allocated(r.Status) {
		// The replay's allocator found an address or node port it asks
		// for held, and the apiserver's gave it: its holder released it
		// (a delete, an update moving off it) while the request was in
		// flight, before the apiserver allocated (probe AG: 4 of 11).
		if aw, ok := r.actual(ctx); ok && aw.Status >= 200 && aw.Status < 300 {
			return allocationReleasedInFlightWhy
		}
		return ""
	}
	if r.DryRun {
		return ""
	}
	var why string
	budget := false
	switch {
	case r.Status.Code == http.StatusTooManyRequests && r.Resource == "pods" && r.Subresource == "eviction" && disruptionBudgetCause(r.Status):
		why, budget = evictionBudgetReadLateWhy, true
		if at, ok := r.markedAround(); ok {
			why = fmt.Sprintf(evictionMarkedAroundWhy, at.UTC().Format(time.RFC3339))
		}
	case r.Status.Code == http.StatusInternalServerError && r.Resource == "pods" && r.Subresource == "eviction" && strings.Contains(r.Status.Message, "more than one PodDisruptionBudget"):
		// Two budgets refuse any eviction of a pod not being deleted; one
		// being deleted skips them. A pod marked within seconds of the
		// request (found by a probe: kubectl delete --wait=false, then an
		// eviction in the same second) was being deleted on arrival, or
		// not: the mark's time cannot say.
		at, ok := r.markedAround()
		if !ok {
			return ""
		}
		why = fmt.Sprintf(evictionMarkedAroundTwoBudgetsWhy, at.UTC().Format(time.RFC3339))
	case r.Status.Code == http.StatusForbidden && r.PluginErrName == "NamespaceLifecycle" && strings.Contains(r.Status.Message, "because it is being terminated"):
		why = namespaceTerminatingLateWhy
	case r.PluginErrName == "ResourceQuota" && quotaExceeded(r.Status):
		why = quotaRefusedLateWhy
	default:
		return ""
	}
	aw, ok := r.actual(ctx)
	switch {
	case !ok:
	case aw.Status >= 200 && aw.Status < 300:
		return why
	case why == quotaRefusedLateWhy && aw.Status == http.StatusConflict && aw.Refusal != nil &&
		(aw.Refusal.Reason == metav1.StatusReasonAlreadyExists || aw.Refusal.Reason == metav1.StatusReasonConflict):
		// The apiserver's ResourceQuota, among the last validating plugins,
		// admitted the write and counted it, and its storage refused it
		// after (a create of an object that exists): the count is not
		// given back until the quota controller recomputes the usage, and
		// the replay read it before that (a probe: a create answered 409
		// AlreadyExists predicted 403 exceeded quota, over a quota its own
		// admission had filled).
		return fmt.Sprintf(quotaCountedThenRefusedWhy, aw.Status, aw.Refusal.Message)
	case budget && aw.Status == http.StatusConflict && aw.Refusal != nil:
		// The eviction passed the budget, which the apiserver then
		// decremented, and its delete of the pod failed (a precondition
		// of the eviction's deleteOptions): the budget is not given
		// back, and the replay read it after.
		return fmt.Sprintf(evictionFailedAfterBudgetWhy, aw.Status, aw.Refusal.Message)
	}
	return ""
}

// markedAround reports when the pod the replay read before its mark was
// marked, if that was within seconds of the request's arrival: by this
// request or by one just before it, which the mark's time, cut to the
// second, cannot tell apart.
func (r *Run) markedAround() (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, read := range r.Reads {
		if _, around := markWindow(read.MarkedAt, r.arrival); read.OwnWrite != "" && around {
			return read.MarkedAt, true
		}
	}
	return time.Time{}, false
}

// admittedEarly says why the replay's admission of a write the apiserver
// refused says nothing about the request, or "": the refusal came from
// state the replay reads from an informer, after the request, and found
// otherwise:
//   - NamespaceLifecycle refused a create in a terminating namespace: the
//     apiserver's plugin, which saw the namespace's delete, looks it up
//     live for 30 s after one (forceLiveLookup); the replay's informer may
//     not have seen the deletion yet, and its plugin never saw a delete
//     sent past kproxy;
//   - ResourceQuota refused it (exceeded quota): the replay read less
//     usage than the apiserver had counted (writes its informer had not
//     seen yet, or objects deleted since);
//   - NamespaceLifecycle found no namespace (404 namespaces "..." not
//     found), which the replay's found: created right after the request,
//     as kubectl apply -f sends a directory's deployment.yaml before its
//     namespace.yaml;
//   - ServiceAccount admission found no pod's ServiceAccount (it looks in
//     its informer, then live), which the replay's found: created right
//     after the pod, as kubectl apply -f sends a directory's pod.yaml
//     before its serviceaccount.yaml;
//   - an admission webhook refused the apiserver's call, which kproxy's
//     own call to it did not meet, or a mutating webhook that kproxy's
//     replay called may have changed the apiserver's object otherwise
//     (webhook_answers.go);
//   - the store refused an update or patch as a conflict (the object has
//     been modified): another write landed while the request was in
//     flight (modifiedInFlight).
//
// stage is the stage whose layer the answer is about (storage, for the
// conflict), or "" for decode to report it.
func (r *Run) admittedEarly(ctx context.Context) (stage, why string) {
	// A connect (exec, attach, port-forward, proxy) is answered with its
	// stream: its answer is not waited for.
	if r.Read || r.actual == nil || r.Status != nil || connectSubresource(r.Subresource) {
		return "", ""
	}
	aw, ok := r.actual(ctx)
	if !ok || aw.Refusal == nil {
		return "", ""
	}
	switch {
	case modifiedInFlight(r, aw):
		return record.StageStorage, r.modifiedInFlightWhy()
	// Each says so at the stage of the apiserver's refusal, which the
	// replay's admission did not meet: NamespaceLifecycle and the
	// ServiceAccount plugin refuse in Admit (mutating), ResourceQuota in
	// Validate (they had said decode, the stages after it "not
	// replayed").
	case aw.Status == http.StatusNotFound && namespaceNotFound(aw.Refusal):
		return record.StageMutatingAdmission, namespaceCreatedLateWhy
	case r.Resource == "services" && allocatedElsewhere(aw):
		return record.StageValidation, allocatedInFlightWhy
	case aw.Status != http.StatusForbidden:
	case r.Verb == "create" && namespaceTerminating(aw.Refusal):
		return record.StageMutatingAdmission, namespaceEndedEarlyWhy
	case quotaExceeded(aw.Refusal):
		return record.StageValidatingAdmission, quotaAdmittedEarlyWhy
	case serviceAccountLookup(aw.Refusal):
		return record.StageMutatingAdmission, serviceAccountArrivedEarlyWhy
	}
	// LimitRanger's refusal in a namespace where its draw decides
	// (limit_ranges.go): a cause more certain than a state change.
	if why := r.limitRangeOrderThere(aw); why != "" {
		return record.StageValidatingAdmission, why // where LimitRanger checks its bounds
	}
	// Any other admission refusal, where kproxy saw the state the
	// plugins read change since the request arrived; any other refusal,
	// where it saw a mutating plugin's (admission_late.go).
	if why := r.admittedByStateLate(aw); why != "" {
		// The stage of the apiserver's refusal, which the replay's
		// admission did not meet (it had said decode, the stages after it
		// "not replayed", where the replay admitted the write; found by a
		// probe).
		if strings.Contains(aw.Refusal.Message, "MutatingAdmissionPolicy '") {
			return record.StageMutatingAdmission, why
		}
		return record.StageValidatingAdmission, why
	}
	if why := r.mutatedEarly(aw); why != "" {
		return record.StageMutatingAdmission, why // which mutations the request met
	}
	// A webhook's answer to the apiserver's call that kproxy's call did
	// not get: its refusal (a mutating webhook refused kproxy's call too
	// if it had been called: matching is the request's and the
	// configuration's), or a patch that a later stage refused.
	if why := r.webhookRefusedOnlyThere(aw); why != "" {
		if name := webhookOf(aw.Refusal); r.calledMutatingWebhook(name) {
			return record.StageMutatingAdmission, why
		}
		return record.StageValidatingAdmission, why
	}
	if why := r.mutatedByWebhookThere(aw); why != "" {
		return record.StageMutatingAdmission, why
	}
	if why := r.conversionFailedOnlyThere(aw); why != "" {
		return "", why
	}
	if why := r.changedInFlight(ctx); why != "" {
		return record.StageStorage, why
	}
	return "", ""
}

// allocatedElsewhere reports the apiserver's refusal of a Service whose
// cluster IP or node port another write holds ("provided IP is already
// allocated", "provided port is already allocated"): of a write the
// replay admitted, which read the allocations on arrival, it means
// another Service's write took them while the request was in flight
// (found by a probe: two creates asking for one address at once, the
// loser predicted 201). A node port's allocation is not even visible in
// the Services kproxy reads until its Service is stored.
func allocatedElsewhere(aw Answer) bool {
	return aw.Status == http.StatusUnprocessableEntity && allocated(aw.Refusal)
}

// allocated reports a refusal of a Service for an address or node port
// another holds.
func allocated(st *metav1.Status) bool {
	return st != nil && (strings.Contains(st.Message, "provided IP is already allocated") || strings.Contains(st.Message, "provided port is already allocated"))
}

// modifiedInFlight reports the apiserver's optimistic-concurrency
// refusal (409, "the object has been modified") of an update or patch the
// replay admitted: the resourceVersion the request names was the
// object's as the replay read it, on arrival, and no longer when the
// apiserver's store read it. Another write landed in between, while the
// request was in flight (concurrent writers, a controller's retries):
// which version the request met is not known.
func modifiedInFlight(r *Run, aw Answer) bool {
	return aw.Status == http.StatusConflict && (r.Verb == "update" || r.Verb == "patch") && aw.Refusal != nil &&
		aw.Refusal.Reason == metav1.StatusReasonConflict && strings.Contains(aw.Refusal.Message, "the object has been modified")
}

func (r *Run) modifiedInFlightWhy() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	read := ""
	for _, rd := range r.Reads {
		if !rd.List && rd.Found && rd.ResourceVersion != "" {
			read = " at resourceVersion " + rd.ResourceVersion
		}
	}
	return "the apiserver refused the write as a conflict (409: the object has been modified), and the replay, which read the object" + read +
		" as the request arrived, admits it: another write to the object landed while this request was in flight, before the apiserver's store read it, " +
		"so the version the request met is not known"
}

// changedInFlight says why the replay's answer to a write the apiserver
// refused otherwise is not the request's, or "": the object changed
// between the replay's read and the apiserver's answer (read again now).
// The replay reads while the request is in flight, so another write to
// the object (by a request that arrived after this one, or before it and
// landed later) may have come before the apiserver's read and after the
// replay's, or the other way round: which version the request met is not
// known. Found by a probe of racing writers: a merge patch refused as
// immutable, or for a finalizer added to an object being deleted, or a
// server-side apply refused for a conflict with a PUT, each by a write
// that arrived after it and landed first, predicted 200 from the object
// as the replay read it before. A write the apiserver admitted is read
// at the revisions its answer names (snapshotRevision), and needs none
// of this.
func (r *Run) changedInFlight(ctx context.Context) string {
	if r.Read || r.actual == nil || connectSubresource(r.Subresource) {
		return ""
	}
	aw, ok := r.actual(ctx)
	if !ok || aw.Status < 300 || aw.Refusal == nil || (r.Status != nil && int(r.Status.Code) == aw.Status) {
		return ""
	}
	r.mu.Lock()
	var read StorageRead
	for _, rd := range r.Reads {
		if rd.latest != nil && !rd.List && rd.Snapshot == "" && rd.Err == nil {
			read = rd // the last read of the object itself
		}
	}
	r.mu.Unlock()
	if read.latest == nil {
		return ""
	}
	found, rv, err := read.latest(ctx)
	if err != nil {
		return ""
	}
	replay := "admits it"
	if r.Status != nil {
		replay = fmt.Sprintf("refuses it otherwise (%d)", r.Status.Code)
	}
	if found == read.Found && rv == read.ResourceVersion {
		// Unchanged since the replay read it; but a write that landed
		// after the apiserver's read and before the replay's looks the
		// same (two server-side applies a few milliseconds apart: 409
		// answered, 200 predicted; found by a probe). The object's last
		// write, in the second the request arrived or after, may be one.
		// Only an update or patch: the store applies one to the newest
		// object (an eviction's refusal has reasons of its own to read).
		if !found || (r.Verb != "update" && r.Verb != "patch") || read.lastWrite.IsZero() || read.lastWrite.Before(r.arrival.Truncate(time.Second)) {
			return ""
		}
		return fmt.Sprintf("the apiserver refused the write (%d: %s), and the replay, which read the object at resourceVersion %s, %s: "+
			"that version was written at %s (its managedFields' time, to the second), as this request arrived, so it may have landed after the apiserver's read "+
			"(another write while this request was in flight), and the version the request met is not known",
			aw.Status, aw.Refusal.Message, read.ResourceVersion, replay, read.lastWrite.UTC().Format(time.RFC3339))
	}
	then, now := "found no object", "deleted"
	if read.Found {
		then = "read the object at resourceVersion " + read.ResourceVersion
	}
	if found {
		now = "at resourceVersion " + rv
	}
	return fmt.Sprintf("the apiserver refused the write (%d: %s), and the replay, which %s, %s: the object changed while this request was in flight "+
		"(it is now %s), before or after the apiserver's read, so the version the request met is not known", aw.Status, aw.Refusal.Message, then, replay, now)
}

// changedBeforeOwnWrite says why the replay's refusal of a write the
// apiserver admitted is not the request's, or "": the replay read the
// object as the request arrived, and another write changed it before the
// request's own (a write that names no resourceVersion is applied by the
// apiserver's store to the newest object, retrying after a conflict).
// The answer's resourceVersion R is the request's own write; the object
// at R-1 is what the store applied it to. Found by a probe: two
// server-side applies a few milliseconds apart, the first giving up a
// field the second sets, 200 answered and 409 predicted from the object
// before the first. Read only where the two verdicts differ.
func (r *Run) changedBeforeOwnWrite(ctx context.Context) string {
	// A dry run has no write of its own: it is read at the revision it
	// answered with (dryRunRevision).
	if r.Read || r.DryRun || r.actual == nil || r.Status == nil || connectSubresource(r.Subresource) || (r.Verb != "update" && r.Verb != "patch") {
		return ""
	}
	aw, n, ok := r.admittedAt(ctx)
	if !ok {
		return ""
	}
	r.mu.Lock()
	var read StorageRead
	for _, rd := range r.Reads {
		if rd.atRev != nil && !rd.List && rd.Snapshot == "" && rd.Err == nil && rd.Found {
			read = rd // the last read of the object itself, as it was then
		}
	}
	r.mu.Unlock()
	if read.atRev == nil || read.ResourceVersion == aw.ResourceVersion {
		return ""
	}
	if v, err := strconv.ParseUint(read.ResourceVersion, 10, 64); err != nil || v >= n {
		return ""
	}
	before := strconv.FormatUint(n-1, 10)
	found, rv, err := read.atRev(ctx, before)
	if err != nil || !found || rv == read.ResourceVersion {
		return ""
	}
	return fmt.Sprintf("the apiserver admitted the write (%d, resourceVersion %s), and the replay, which read the object at resourceVersion %s as the request arrived, "+
		"refuses it (%d: %s): another write changed the object (resourceVersion %s) before this request's own (the apiserver's store applies a write that names "+
		"no resourceVersion to the newest object), so the version the request met is not the one the replay read",
		aw.Status, aw.ResourceVersion, read.ResourceVersion, r.Code, r.Status.Message, rv)
}

// namespaceNotFound reports NamespaceLifecycle's refusal of a create in a
// namespace that does not exist.
func namespaceNotFound(st *metav1.Status) bool {
	return st.Code == http.StatusNotFound && st.Details != nil && st.Details.Kind == "namespaces" && st.Details.Group == ""
}

// serviceAccountLookup reports ServiceAccount admission's refusal of a pod
// whose ServiceAccount it could not find.
func serviceAccountLookup(st *metav1.Status) bool {
	return st.Code == http.StatusForbidden && strings.Contains(st.Message, "error looking up service account ")
}

// namespaceTerminating reports NamespaceLifecycle's refusal of a create in
// a terminating namespace.
func namespaceTerminating(st *metav1.Status) bool {
	if st.Details != nil {
		for _, c := range st.Details.Causes {
			if c.Type == corev1.NamespaceTerminatingCause {
				return true
			}
		}
	}
	return strings.Contains(st.Message, "because it is being terminated")
}

// quotaExceeded reports ResourceQuota's refusal of a write over a quota.
func quotaExceeded(st *metav1.Status) bool {
	return st.Code == http.StatusForbidden && strings.Contains(st.Message, "exceeded quota: ")
}

func disruptionBudgetCause(st *metav1.Status) bool {
	if st.Details == nil {
		return false
	}
	for _, c := range st.Details.Causes {
		if c.Type == policyv1.DisruptionBudgetCause {
			return true
		}
	}
	return false
}

const (
	evictionBudgetReadLateWhy         = "the apiserver allowed the eviction (201), and the replay's read of the pod's PodDisruptionBudget came after the request: the request had used its allowed disruption since, or the budget was created or changed after the request arrived; the budget as the request met it was not read, so the state on arrival is not known"
	evictionFailedAfterBudgetWhy      = "the apiserver passed the eviction's disruption budget, then failed to delete the pod (%d: %s): kube-apiserver takes the budget's allowed disruption before the delete, and does not give it back when the delete fails, and the replay's read of the budget came after that: the budget as the request met it was not read, so the state on arrival is not known"
	evictionMarkedAroundWhy           = "the apiserver allowed the eviction (201), and the replay refuses it for the pod's disruption budget, read after the request: the budget as the request met it was not read (this request may have used its allowed disruption, or the budget was created or changed since). The replay read the pod as it was before it was marked for eviction or deletion, at %s, within seconds of this request's arrival: by this request, or by an earlier eviction or delete, which left the pod being deleted (an eviction of such a pod skips the budget); the mark's time, in seconds, cannot tell them apart, so the state on arrival is not known"
	evictionMarkedAroundTwoBudgetsWhy = "the apiserver allowed the eviction (201), and the replay refuses it for the pod's two disruption budgets (500: an eviction supports one). The replay read the pod as it was before it was marked for eviction or deletion, at %s, within seconds of this request's arrival: by an earlier eviction or delete, which left the pod being deleted on arrival (an eviction of such a pod skips its budgets), or by this request; the mark's time, in seconds, cannot tell them apart, so the state on arrival is not known"
	namespaceGoneLateWhy              = "the apiserver answered %d, so its NamespaceLifecycle found the namespace, and the replay's does not: the namespace was deleted after this request (its controller empties and removes a terminating namespace), before the replay read it, so the state on arrival is not known"
	namespaceEndedEarlyWhy            = "the apiserver refused the create because the namespace is being terminated, and the replay's NamespaceLifecycle found it active in its informer: the deletion came around this request, and the apiserver's plugin, which saw the delete, looks the namespace up live for 30 s after one, where the replay's informer had not caught up (or never saw a delete sent past kproxy), so the state on arrival is not known"
	allocatedInFlightWhy              = "the apiserver refused the Service because an address or node port it asks for is already allocated (422), and the replay found it free: the allocations changed while this request was in flight (another Service's write took it first, two writes asking for one cluster IP or node port at once; or its holder released it after the apiserver's allocator found it held, before the replay read), so which allocations the request met is not known"
	allocationReleasedInFlightWhy     = "the apiserver allocated the Service an address or node port it asks for, and the replay found it held by another Service: its holder released it (a delete, or an update moving off it) while this request was in flight, before the apiserver allocated and after the replay read, so which allocations the request met is not known"
	quotaAdmittedEarlyWhy             = "the apiserver's ResourceQuota refused the write (exceeded quota), and the replay's admits it: the replay reads the quota's usage from an informer, after the request, and found less used than the apiserver had counted (writes its informer had not seen yet, or objects deleted since), so the state on arrival is not known"
	quotaRefusedLateWhy               = "the apiserver admitted the write, and the replay's ResourceQuota refuses it (exceeded quota): the apiserver's ResourceQuota adds each write it admits to the quota's usage before it stores it, so the usage the replay read after the request already counts this request (or later writes), so the state on arrival is not known"
	quotaCountedThenRefusedWhy        = "the apiserver's ResourceQuota admitted the write and counted it in the quota's usage, and its storage then refused it (%d: %s); the usage is not given back until the quota controller recomputes it, and the replay's ResourceQuota read it before that, counting this very request, so the state on arrival is not known"
	namespaceCreatedLateWhy           = "the apiserver refused the write because its namespace does not exist (404), and the replay's NamespaceLifecycle found the namespace: it was created after this request (as, for one, kubectl apply -f sends a directory's deployment.yaml before its namespace.yaml), before the replay read it, so the state on arrival is not known"
	serviceAccountGoneLateWhy         = "the apiserver admitted the pod, so its ServiceAccount admission found the pod's ServiceAccount, and the replay's does not (in its informer, then live): the ServiceAccount was deleted after this request, before the replay read it, so the state on arrival is not known"
	serviceAccountArrivedEarlyWhy     = "the apiserver's ServiceAccount admission refused the pod (error looking up service account), and the replay's found the ServiceAccount: it was created after this request (as, for one, kubectl apply -f sends a directory's pod.yaml before its serviceaccount.yaml), before the replay read it, so the state on arrival is not known"
	namespaceTerminatingLateWhy       = "the apiserver admitted the write, and the replay's NamespaceLifecycle refuses it because the namespace is being terminated: the namespace began terminating after this request, or the apiserver's view of it had not caught up (both read namespaces from an informer), so the state on arrival is not known"
)
