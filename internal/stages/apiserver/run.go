package apiserver

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/audit"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/warning"

	kdecode "github.com/kproxy/kproxy/internal/decode"
	"github.com/kproxy/kproxy/internal/record"
)

// Phases of one write through the apiserver's handler, in the order they
// begin. An update reads the stored object before admission; the phase
// marks only move forward.
const (
	PhaseDecode     = iota // handler: content type, body, options
	PhaseMutating          // mutating admission
	PhaseValidation        // the registry strategy (and preconditions)
	PhaseValidating        // validating admission
	PhaseStorage           // the dry-run store
)

var PhaseStage = [...]string{record.StageDecode, record.StageMutatingAdmission, record.StageValidation, record.StageValidatingAdmission, record.StageStorage}

// Run is what one replay of a request saw go by in the apiserver's
// resource handler: the phases with their times, every admission plugin's
// call and verdict, the storage reads, and the answer. A write runs in dry
// run through all five phases; a read (get, list, watch) through decode
// (query options) and storage.
type Run struct {
	mu      sync.Mutex
	now     func() time.Time
	start   time.Time
	End     time.Time
	phase   int
	marks   [len(PhaseStage)]time.Time // when each phase began
	Plugins []PluginCall
	Reads   []StorageRead
	// unencoded are the objects a read's storage returned, which its
	// answer does not encode (unencoded.go).
	unencoded []runtime.Object
	// secretObjects are the Secrets and ConfigMaps admission was given
	// (noteSecrets), secretValues their secret values once found.
	secretObjects []runtime.Object
	secretValues  []string
	secretsFound  bool
	// pluginErr is the last error an admission plugin returned, with the
	// phase it returned it in.
	pluginErr       error
	pluginErrPhase  int
	PluginErrName   string
	PluginErrDetail string

	Status   *metav1.Status // the handler's answer when it refused
	Code     int
	ETag     string // the ETag the handler answered with (discovery)
	Object   []byte // the handler's answer when it accepted (the object)
	warnings []string
	// unknown says why the run cannot be trusted (a read failed, a
	// webhook cannot be called in dry run).
	Unknown string
	// unknownStage is the stage whose layer Unknown is about (see
	// UnknownAt).
	unknownStage string
	// decided is the stage that produced the refusal.
	Decided string

	// actual waits for the apiserver's answer to the request (nil for a
	// replay with no live request, such as kproxy explain); bodyRV is
	// the resourceVersion the request's body carries.
	actual func(context.Context) (Answer, bool)
	// arrival and namespace are the request's; changes the clocks of the
	// state admission reads (admission_late.go).
	arrival   time.Time
	namespace string
	name      string // the request's object's ("" for a create of a generated name, a list)
	changes   *admissionChanges
	// limitRanges counts the LimitRanges of a namespace (limit_ranges.go).
	limitRanges limitRangesIn
	BodyRV      string
	// body is the request's body, as the replay was given it (read only
	// where a check needs it: createdOver).
	body []byte
	// deletedPods: what the informer saw of pods (deleted_pods.go).
	deletedPods *deletedPods
	Verb        string
	// apply: a server-side apply (a patch of the apply type), whose
	// patch is decoded, strictly, as the handler applies it.
	apply       bool
	group       string // the request's API group
	Resource    string
	Subresource string
	DryRun      bool // the request itself is a dry run

	// read marks a get, list or watch; narrowed says how the replay's
	// list was narrowed (limit=1) so as not to read the whole collection.
	Read     bool
	Narrowed string
	Watched  bool
	// Handshake says what a WebSocket watch's handshake answered
	// (websocket.go); handshake is the connection it was written on.
	Handshake string
	handshake *handshakeConn
}

// snapshotRevision decides which state of an object the replay reads: the
// latest ("") unless the request's own write, or a later one, is already
// visible. A write
// that succeeded answers with the object's new resourceVersion R; an
// object found at R is the request's own doing (unless the write was a
// no-op, which keeps the resourceVersion the body named), so the replay
// reads it at R-1. A delete that succeeded removed the object, and the
// store answers with its last version at the delete's own revision R: it
// is read at R-1. A replay that runs after later writes reads the same
// revisions, which the store still serves (until etcd compacts them). why
// is set when the answer never came.
func (r *Run) snapshotRevision(ctx context.Context, key string, found bool, rv string) (at, why string) {
	if r.actual == nil {
		return "", ""
	}
	aw, ok := r.actual(ctx)
	if !ok {
		if r.DryRun {
			return "", "" // read the latest, as a dry run always had
		}
		return "", "the apiserver's answer did not come within the replay budget, so the state on arrival is not known"
	}
	if r.DryRun && aw.Status < 300 {
		if !found && r.Verb == "delete" && aw.ResourceVersion == "" {
			// A dry-run delete answered with a Status (no revision) of
			// an object deleted since: read as it last existed (probe
			// AN: predicted 404 for the 200, the replay reading after
			// the real delete that followed the dry run).
			return lastExisting, ""
		}
		return dryRunRevision(found, rv, aw.ResourceVersion), ""
	}
	if aw.Status >= 300 {
		// Nothing was written, and the answer names no revision: the
		// replay reads the latest. Where that contradicts the answer, a
		// later write came between them and the state on arrival is not
		// known. An admission webhook or policy may refuse with any
		// code, 404 and 409 too: such a refusal says nothing of the
		// object (found by a probe: a webhook's 404 to an update of an
		// object that was always there said it was created after).
		if aw.Refusal != nil && admissionRefusal(aw.Status, aw.Refusal) {
			return "", ""
		}
		// Nor does a refusal that names another object than key (a
		// mutating webhook renamed the apiserver's: it had been said
		// deleted between the two reads; found by a probe).
		if key != "" && namesOther(aw.Refusal, key) {
			return "", ""
		}
		var meant string // what the refusal says of an object it found
		if !found {
			meant = answeredFound(r, aw.Status)
		}
		// The replay reads while the request is in flight, before or
		// after the apiserver's own read: a write to the object in
		// between (by a later request, or by one that the apiserver's
		// store applied first) leaves the two reads seeing different
		// states, in either order.
		switch {
		case meant != "":
			return "", "the apiserver answered " + strconv.Itoa(aw.Status) + " (" + meant + "), and the replay found no object: " +
				"it was deleted between the apiserver's read and the replay's, or created between the replay's read and the apiserver's (another write while this request was in flight), so the state the request met is not known"
		case aw.Status == http.StatusNotFound && found && answeredAbsent(r):
			return "", "the apiserver answered 404 (no such object), and the replay found the object: " +
				"it was created, or deleted, between the apiserver's read and the replay's (another write while this request was in flight), so the state the request met is not known"
		}
		return "", ""
	}
	if r.Subresource == "token" {
		// A TokenRequest writes nothing, and its answer carries back
		// whatever resourceVersion its body named: it is no revision. The
		// replay reads the latest, as it does for a refusal.
		return "", ""
	}
	if aw.ResourceVersion == "" {
		switch {
		case !found && r.Verb == "delete":
			return lastExisting, "" // the answer was a Status
		case r.Verb == "delete":
			return beforeOwnMark, ""
		case ownWriteOf(r) != nil:
			return beforeOwnWrite, "" // a binding or an eviction: a Status
		}
		return "", ""
	}
	n, err := strconv.ParseUint(aw.ResourceVersion, 10, 64)
	if err != nil || n < 2 {
		return "", ""
	}
	switch {
	case found && rv == aw.ResourceVersion && r.BodyRV != aw.ResourceVersion:
		return strconv.FormatUint(n-1, 10), ""
	case found && r.Verb == "create" && aw.Status == 201 && newerThan(rv, n):
		// Created by this request, changed since: a create is never a
		// no-op, so just before it the object did not exist.
		return strconv.FormatUint(n-1, 10), ""
	case found && newerThan(rv, n), !found && (r.Verb == "update" || r.Verb == "patch"):
		// Another write changed (or deleted) the object after this one:
		// the replay ran late, behind a queue. The store still holds the
		// state the request met, as it does in time: just before R, R
		// being the request's own write; or R itself when the request was
		// a no-op that named R in its body (the apiserver keeps the
		// resourceVersion of a write that changes nothing).
		if r.BodyRV == aw.ResourceVersion {
			return aw.ResourceVersion, ""
		}
		return strconv.FormatUint(n-1, 10), ""
	case !found && r.Verb == "delete", found && r.Verb == "delete" && !newerThan(rv, n-1):
		// The store answers a delete with the object as it last was, at
		// the revision of the delete itself: it last existed just before.
		// (Found older than that: the replay read it before the delete
		// was done, which it starts before the answer.)
		return strconv.FormatUint(n-1, 10), ""
	}
	return "", ""
}

// storageErrorKey is the key a precondition's storage error names (an
// invalid object, code 4: ErrCodeInvalidObj). Other storage errors (a
// corrupt object's, code 7) name the key as the replay's store does.
var storageErrorKey = regexp.MustCompile(`(StorageError: invalid object, Code: 4, Key: )(/[^,\s]*)`)

// storedKeys is msg with the key its precondition error names as the
// apiserver's etcd3 store names it, under --etcd-prefix: the replay's
// write is a dry run, whose storage checks a precondition against the
// registry's key (/configmaps/ns/name), where the request's own write,
// not a dry run, has its store check it against etcd's
// (/registry/configmaps/ns/name). Found by a probe: kubectl replace with
// a stale uid, 409 predicted, the message's key not the apiserver's.
func storedKeys(msg, prefix string) string {
	if !strings.Contains(msg, "StorageError: ") {
		return msg
	}
	root := path.Join("/", prefix)
	return storageErrorKey.ReplaceAllStringFunc(msg, func(m string) string {
		sub := storageErrorKey.FindStringSubmatch(m)
		if root == "/" || strings.HasPrefix(sub[2], root+"/") {
			return m
		}
		return sub[1] + path.Join(root, sub[2])
	})
}

// dryRunRevision is the revision a dry run the apiserver admitted met
// its object at: a dry run writes nothing, and answers with the object as
// it would be, the resourceVersion it met unchanged (a create's names
// none). Found by a probe: a dry-run JSON patch whose test op held when
// it was sent (200), replayed after a real write changed the field
// milliseconds later, had been predicted 422 from the newer object; one
// whose object was deleted since would have been predicted 404. ""
// reads the latest: the object is as the answer found it.
func dryRunRevision(found bool, rv, answered string) string {
	n, err := strconv.ParseUint(answered, 10, 64)
	if err != nil || n < 1 || found && (rv == answered || !newerThan(rv, n)) {
		return ""
	}
	return answered
}

// noOpLate says why the replay's refusal of a write the apiserver
// admitted, read before the resourceVersion the apiserver answered with,
// is not the request's, or "". An answer's resourceVersion R found on the
// object is taken for the request's own write, and the replay reads the
// object just before it; but a write that changes nothing (a merge patch
// of a field conversion overrides, a label already set) keeps the
// resourceVersion an earlier write gave, and then the request met the
// object at R, not before it (found by a probe: a Node's podCIDRs patched
// right after its podCIDR, 200 with no change, predicted 422 for the
// state before the podCIDR).
func (r *Run) noOpLate(ctx context.Context) string {
	if r.Read || r.actual == nil || r.Status == nil || r.DryRun || momentary(r.Code) {
		return ""
	}
	aw, n, ok := r.admittedAt(ctx)
	if !ok {
		return ""
	}
	before := strconv.FormatUint(n-1, 10)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, read := range r.Reads {
		if read.Snapshot == before && read.Found && !read.NoOp && read.Later == "" && read.OwnWrite == "" && !read.MarkedForDelete {
			return fmt.Sprintf("the apiserver admitted the write (%d) and answered with resourceVersion %s, which the object had when the replay read it: "+
				"this request's own write, or an earlier one's if the request changed nothing (such a write keeps the resourceVersion). "+
				"The replay read the object as it was before %s and refuses the write (%d: %s), so the state the request met is not known",
				aw.Status, aw.ResourceVersion, aw.ResourceVersion, r.Code, r.Status.Message)
		}
	}
	return ""
}

// admittedAt is the apiserver's answer to a write it admitted and the
// revision of the resourceVersion it answered with (2 or more, so that
// the one before it is a revision); false for any other answer.
func (r *Run) admittedAt(ctx context.Context) (Answer, uint64, bool) {
	aw, ok := r.actual(ctx)
	if !ok || aw.Status < 200 || aw.Status >= 300 || aw.ResourceVersion == "" {
		return aw, 0, false
	}
	n, err := strconv.ParseUint(aw.ResourceVersion, 10, 64)
	if err != nil || n < 2 {
		return aw, 0, false
	}
	return aw, n, true
}

// answeredFound says what a refusal the apiserver gives only for an object
// it found means, or "" for any other status.
func answeredFound(r *Run, status int) string {
	switch {
	case status == http.StatusConflict && r.Verb == "create" && r.Subresource == "":
		return "the object existed"
	case status == http.StatusConflict && (r.Verb == "update" || r.Verb == "patch"):
		return "a conflict with the stored object" // its resourceVersion or uid
	case status == http.StatusConflict && r.Verb == "delete":
		return "a precondition the stored object failed" // its uid or resourceVersion
	case status == http.StatusUnprocessableEntity && r.Verb == "patch" && !r.apply && r.Subresource == "":
		// A patch is applied to the stored object, and what it makes
		// validated: a patch of no object is 404 (a server-side apply
		// creates one, and may be invalid as such).
		return "the patched object refused as invalid"
	case (status == http.StatusConflict || status == http.StatusTooManyRequests) && ownWriteOf(r) != nil:
		// A binding refused as already assigned, an eviction refused for
		// its disruption budget: the apiserver read the pod.
		return "to this " + r.Subresource + ", refused for the pod it found"
	}
	return ""
}

// createdOver reports the read of key, in the replay of a create the
// apiserver answered 201 with resourceVersion R, that found the object
// at an older revision: an earlier copy under the same name, which a
// delete removed between the replay's read (while the request was in
// flight) and the apiserver's create. The request created the object,
// so just before R it was absent: the replay reads it there (found by a
// probe of a create and a delete of one name racing, predicted 409
// AlreadyExists). A server-side apply (or an update) answered 201
// created its object too (probe AM: an apply racing a delete, predicted
// 409 for a conflict with the deleted copy's manager, or 200). Only the
// request's own object is read so: the one the body names for a create,
// the path's for an apply; the other reads (the roles an RBAC
// escalation check reads) keep the latest.
func (r *Run) createdOver(ctx context.Context, key, rv string) (string, bool) {
	if (r.Verb != "create" && r.Verb != "update" && r.Verb != "patch") || r.Subresource != "" || r.actual == nil || r.DryRun {
		return "", false
	}
	aw, ok := r.actual(ctx)
	if !ok || aw.Status != http.StatusCreated {
		return "", false
	}
	n, err := strconv.ParseUint(aw.ResourceVersion, 10, 64)
	if err != nil || n < 2 || newerThan(rv, n-1) || !r.ownObject(key) {
		return "", false
	}
	return strconv.FormatUint(n-1, 10), true
}

// dryRunCreated reports a dry run the apiserver answered 201 (a create,
// or a server-side apply that would create its object) whose own object
// the replay found: the apiserver found none, and another write created
// it since (probe AN: a dry-run apply answered 201, the object created
// at once by another manager, predicted 409 for a conflict with it, 87
// records). A dry run's answer names no revision to read at: the object
// is read as absent, as the apiserver found it.
func (r *Run) dryRunCreated(ctx context.Context, key string) bool {
	if !r.DryRun || r.Subresource != "" || r.actual == nil {
		return false
	}
	aw, ok := r.actual(ctx)
	return ok && aw.Status == http.StatusCreated && r.ownObject(key)
}

// sameDeleted says why obj, which the replay of a delete answered with a
// Status found, is not the object the request deleted: the Status names
// another uid, so obj was created after the request's delete, and what
// the request met is not known. nil when it is the same (read before the
// delete landed) or not known.
func (r *Run) sameDeleted(ctx context.Context, obj runtime.Object) error {
	if r.actual == nil {
		return nil
	}
	aw, ok := r.actual(ctx)
	if !ok || aw.DeletedUID == "" {
		return nil
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return fmt.Errorf("reading the object the replay found: %w", err)
	}
	if string(m.GetUID()) == aw.DeletedUID {
		return nil
	}
	return fmt.Errorf("the apiserver deleted the object of uid %s, and the replay found another of that name (uid %s, resourceVersion %s): "+
		"it was created after the request's delete, so the state the request met is not known", aw.DeletedUID, m.GetUID(), m.GetResourceVersion())
}

// ownObject reports that key is the request's own object, as against
// another its replay reads (the roles an RBAC escalation check reads, a
// pod's service account): the one a create's body names, the path's for
// an update or a patch (a registry's key holds its resource's name, but
// for nodes': theirs are not told apart, and read as others are).
func (r *Run) ownObject(key string) bool {
	if r.namespace != "" && path.Base(path.Dir(key)) != r.namespace {
		return false
	}
	switch r.Verb {
	case "create":
		name := bodyName(r.body) // last: it decodes the body
		return name != "" && path.Base(key) == name
	case "update", "patch":
		return r.name != "" && path.Base(key) == r.name && strings.Contains(key, "/"+r.Resource+"/")
	}
	return false
}

// podMarkedBefore reports, for a pod's delete or eviction, whether
// kproxy's informer saw the pod (of a uid) marked for deletion before
// the request arrived (nil: not known).
func (r *Run) podMarkedBefore(namespace, name string) func(types.UID) bool {
	if r.deletedPods == nil {
		return nil
	}
	return func(uid types.UID) bool { return r.deletedPods.markedBefore(namespace, name, uid, r.arrival) }
}

// answeredAbsent reports a write whose 404 says the object itself was
// absent: one naming an existing object (an update, patch or delete), or
// a subresource that writes it (a status, a scale, an eviction or a
// binding; not a TokenRequest, whose 404 may be for the object it binds,
// nor a connection to a kubelet or a proxied backend). A create of the
// object itself answers 404 only for its namespace.
func answeredAbsent(r *Run) bool {
	switch r.Subresource {
	case "":
		return r.Verb != "create"
	case "status", "scale", "ephemeralcontainers", "resize", "approval", "finalize", "eviction", "binding":
		return true
	}
	return false
}

// newerThan reports a resourceVersion later than revision n.
func newerThan(rv string, n uint64) bool {
	m, err := strconv.ParseUint(rv, 10, 64)
	return err == nil && m > n
}

// answeredRV is the resourceVersion the apiserver answered the request
// with ("" without an answer).
func (r *Run) answeredRV(ctx context.Context) string {
	if r.actual == nil {
		return ""
	}
	aw, _ := r.actual(ctx)
	return aw.ResourceVersion
}

// ownKey reports the key of the request's own object (of resource gr),
// as against another the replay reads for it: the roles an RBAC
// escalation check resolves, a pod's service account.
func (r *Run) ownKey(gr schema.GroupResource, key string) bool {
	return r.name != "" && gr.Resource == r.Resource && gr.Group == r.group && path.Base(key) == r.name
}

// updatedExisting reports an update or patch the apiserver answered 200:
// the object existed before the request (a 201 would mean it created it).
func (r *Run) updatedExisting(ctx context.Context) bool {
	if r.actual == nil || (r.Verb != "update" && r.Verb != "patch") {
		return false
	}
	aw, ok := r.actual(ctx)
	return ok && aw.Status == 200
}

// emptiedFinalizers reports an update or patch the apiserver answered
// 200 with its object being deleted and no finalizers left: it removed
// the last ones, and the object is deleted (metBeforeEmptying).
func (r *Run) emptiedFinalizers(ctx context.Context) bool {
	if !r.updatedExisting(ctx) {
		return false
	}
	aw, _ := r.actual(ctx)
	return aw.EmptiedFinalizers
}

// createdHere reports a request the apiserver answered 201 for its own
// object (not a subresource): it created the object, which etcd does only
// where the key is absent, so just before it the object did not exist.
// The replay then knows that state without reading it.
func (r *Run) createdHere(ctx context.Context) bool {
	if r.actual == nil || r.Subresource != "" {
		return false
	}
	aw, ok := r.actual(ctx)
	return ok && aw.Status == 201
}

// lastExisting asks for the object's last stored version before a
// delete whose answer did not name it.
const lastExisting = "last-existing"

// beforeOwnMark asks for the object as the replay found it, or, where
// that is the request's own mark for deletion with a grace period of 0
// (ownDeleteMark), as it was before the mark: a delete answered without a
// resourceVersion (a Status, or the marked object when another delete
// removed it between the request's mark and its own deletion), whose
// object the replay found still there.
const beforeOwnMark = "before-own-mark"

// beforeOwnWrite asks for the object as it was just before the request's
// own write, for a write answered with a Status that names no
// resourceVersion (own_write.go).
const beforeOwnWrite = "before-own-write"

type PluginCall struct {
	Name       string
	Validating bool
	Start, End time.Time
	Err        error
	Patch      string // what a mutating plugin changed, as a JSON patch
	Detail     string // what the refusal's message leaves out
	// Webhooks are the mutating webhooks the plugin called
	// (MutatingAdmissionWebhook), as its dispatcher annotates each call.
	Webhooks []CalledWebhook
}

// CalledWebhook is a mutating webhook kproxy's replay called, and whether
// its answer changed the object.
type CalledWebhook struct {
	Name, Configuration string
	Mutated             bool
}

type StorageRead struct {
	Key, Path string
	Snapshot  string // the resourceVersion read at, if not the latest
	// Created: the state at Snapshot was not read but known: the request
	// created the object (Run.createdHere), so it was absent then.
	Created bool
	// DryRunCreated: the resourceVersion of the object the replay found,
	// which a dry run answered 201 had not (Run.dryRunCreated): it was
	// created since, and read as absent.
	DryRunCreated string
	// Recreated: the revision the name was created again at, after the
	// request's delete (answered with a Status); Snapshot is just before
	// that delete.
	Recreated int64
	// NoOp: Snapshot is the resourceVersion the apiserver answered with,
	// which the request left as it was (a write that changed nothing).
	NoOp bool
	// OwnWrite says what the request's own write did, for a write
	// answered without a resourceVersion (a binding, an eviction): the
	// state at Snapshot is the last before the object showed it.
	OwnWrite string
	// MarkedForDelete: a delete that marked the object (deletionTimestamp,
	// grace period 0) and then deleted it, two writes of one request: the
	// state at Snapshot is the last before the mark.
	MarkedForDelete bool
	// MarkedEarlier, for such a write, says the object showed it from a
	// time clearly before the request arrived (an earlier request's
	// doing): the state at Snapshot is the newest, which the request met.
	MarkedEarlier string
	// MarkedAt is when the object's first state showing the write was
	// written, as far as it says.
	MarkedAt time.Time
	// Emptied: the request removed the last finalizers of an object being
	// deleted, and the apiserver deleted it without storing the update:
	// the state at Snapshot, the resourceVersion it answered, is the one
	// the request met.
	Emptied bool
	// Later is the object's resourceVersion when the replay read it
	// ("deleted" when it was gone), when a write after the request's had
	// changed it: the replay ran late and read the state at Snapshot.
	Later string
	// latest reads the object again, as it is now (a write's own read:
	// changedInFlight).
	latest func(context.Context) (found bool, rv string, err error)
	// atRev reads the object as it was at a revision (a write's own
	// read: changedBeforeOwnWrite).
	atRev func(ctx context.Context, rev string) (found bool, rv string, err error)
	// lastWrite is when the object as read was last written, as its
	// managedFields say (to the second; zero when they say nothing).
	lastWrite       time.Time
	Found           bool
	ResourceVersion string
	// Undecodable: the object was found, and the store cannot decrypt or
	// decode it (the etcd3 store's "corrupt object").
	Undecodable error
	Start       time.Time
	Duration    time.Duration
	Err         error // the read failed: the run cannot be trusted
	// Refused is the storage's answer to a read request when it is an
	// error the apiserver answers with (not found, resourceVersion too
	// large or too old, invalid continue token).
	Refused error

	// A read request's storage call: list or get, the options it asked
	// for, whether the apiserver's etcd3 store answered it (else kproxy
	// read through the apiserver), and the raw etcd key (or, for a list,
	// the number of keys under the prefix).
	List       bool
	BeforeRead bool   // refused before reading (the options)
	Watch      bool   // a watch's start, refused before reading
	NoEtcd     string // why etcd was not read
	// Compacted says why etcd's 410 for a compacted revision is the
	// apiserver's answer (compaction.go).
	Compacted string
	Options   string
	FromEtcd  bool
	// FromAnswer: the object was taken from the apiserver's answer to
	// the get (answered.go), not read.
	FromAnswer  bool
	Etcd        *EtcdKV
	EtcdPrefix  string
	EtcdCount   int64
	EtcdRev     int64
	EtcdStart   time.Time
	EtcdLatency time.Duration
}

type runKey struct{}

func withRun(ctx context.Context, r *Run) context.Context {
	return context.WithValue(ctx, runKey{}, r)
}

func runFrom(ctx context.Context) *Run {
	r, _ := ctx.Value(runKey{}).(*Run)
	return r
}

func (r *Run) enter(phase int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if phase > r.phase {
		r.phase = phase
		r.marks[phase] = r.now()
	}
}

// markUnknown records the first reason the run cannot be trusted, about
// the run as a whole (decode reports it).
func (r *Run) markUnknown(why string) { r.markUnknownAt("", why) }

// markUnknownAt records the first reason the run cannot be trusted, about
// stage's layer: a webhook's phase, storage for a read that failed, the
// stage a refusal the apiserver did not make came from.
func (r *Run) markUnknownAt(stage, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Unknown == "" {
		r.Unknown, r.unknownStage = why, stage
	}
}

// answeredShed reports, without waiting, that the apiserver has answered
// the request and shed it for load (a 429 with no Status: API Priority
// and Fairness' or max-in-flight's plain text).
func (r *Run) answeredShed() bool {
	if r.actual == nil {
		return false
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // only an answer already there
	aw, ok := r.actual(ctx)
	return ok && aw.Status == http.StatusTooManyRequests && aw.Refusal == nil
}

// markUnknownHere records the first reason the run cannot be trusted,
// about the phase the handler is in (a webhook kproxy cannot dial).
func (r *Run) markUnknownHere(why string) {
	r.mu.Lock()
	stage := PhaseStage[r.phase]
	r.mu.Unlock()
	r.markUnknownAt(stage, why)
}

// UnknownAt is the handler stage that reports the run's Unknown: the
// stage whose layer it is about, so a record's "cannot predict" names the
// webhook's phase or storage rather than decode. decode reports what is
// about the run as a whole, or about a stage before the handler but
// authorization (the RBAC registry's escalation check, which the
// pipeline has the authorization stage report).
//
// A refusal the handler made earlier than that stage (a read that failed
// inside decode's phase, answered 500 there) is the unknown's doing: the
// stage of that refusal reports it, so no stage before it refuses.
func (r *Run) UnknownAt() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unknownStage == record.StageAuthorization {
		// The RBAC registry's escalation check, labelled authorization:
		// the pipeline has that stage say it (unknownBeforeHandler).
		return record.StageAuthorization
	}
	at := slices.Index(PhaseStage[:], r.unknownStage)
	if at < 0 {
		at = PhaseDecode
	}
	if d := slices.Index(PhaseStage[:], r.Decided); d >= 0 && d < at {
		at = d
	}
	return PhaseStage[at]
}

func (r *Run) addRead(read StorageRead) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Reads = append(r.Reads, read)
	if read.Err != nil && r.Unknown == "" {
		r.Unknown, r.unknownStage = readFailedWhy(read), record.StageStorage
	}
}

// readFailedWhy says why a read failed: a read of etcd out of time says
// etcd is slow, stalled or out of reach (found by a probe: while etcd was
// stopped, the records said only "context deadline exceeded").
func readFailedWhy(read StorageRead) string {
	why := fmt.Sprintf("could not read %s: %v", read.Path, read.Err)
	if read.NoEtcd == "" && strings.Contains(read.Err.Error(), "context deadline exceeded") {
		why += " (kproxy's read of etcd did not finish within the replay's budget: etcd is slow, stalled or out of kproxy's reach)"
	}
	return why
}

func (r *Run) addPlugin(c PluginCall) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Plugins == nil {
		// A write passes about forty plugin calls, both phases: one
		// allocation instead of the slice's seven doublings.
		r.Plugins = make([]PluginCall, 0, 48)
	}
	r.Plugins = append(r.Plugins, c)
	if c.Err != nil {
		r.pluginErr, r.PluginErrName, r.PluginErrDetail = c.Err, c.Name, c.Detail
		r.pluginErrPhase = PhaseMutating
		if c.Validating {
			r.pluginErrPhase = PhaseValidating
		}
	}
}

// IsWrite reports whether the request goes through the resource handler's
// write path (decode, admission, validation, storage).
func IsWrite(info *apirequest.RequestInfo) bool {
	if info == nil || !info.IsResourceRequest {
		return false
	}
	switch info.Verb {
	case "create", "update", "patch", "delete", "deletecollection":
		return true
	}
	return false
}

// IsRead reports a resource read: get, list or watch.
func IsRead(info *apirequest.RequestInfo) bool {
	if info == nil || !info.IsResourceRequest {
		return false
	}
	switch info.Verb {
	case "get", "list", "watch":
		return true
	}
	return false
}

// runRequest runs the request through the apiserver's resource handler
// once: a write in dry run (the registry only reads, admission plugins
// persist nothing, webhooks are called only if they declare no side
// effects), a read with its list narrowed to one item. decode keeps the
// run on the request for the stages after it.
func (w *Server) Run(ctx context.Context, req *Request, now func() time.Time) *Run {
	contentType := req.HTTP.Header.Get("Content-Type")
	run := &Run{now: now, start: now(), actual: req.Actual, arrival: req.Arrival, namespace: req.Info.Namespace, name: req.Info.Name, changes: w.admissionChanges, limitRanges: w.limitRanges, Verb: req.Info.Verb, apply: strings.HasPrefix(req.HTTP.Header.Get("Content-Type"), "application/apply-patch"), group: req.Info.APIGroup, Resource: req.Info.Resource, Subresource: req.Info.Subresource, BodyRV: bodyResourceVersion(req.Body), body: req.Body,
		DryRun: dryRunRequest(req.Info.Verb, req.Info.Subresource, req.HTTP.URL.Query(), req.Body, contentType), Read: !IsWrite(req.Info)}
	run.marks[PhaseDecode] = run.start
	if namesPod(run, req.Info.Name) {
		defer w.deletedPods.name(req.Info.Namespace, req.Info.Name, req.Arrival)()
		run.deletedPods = w.deletedPods
	}
	rec := &warningRecorder{}
	hctx := withRun(ctx, run)
	hctx = apirequest.WithRequestInfo(hctx, req.Info)
	hctx = apirequest.WithUser(hctx, req.User)
	hctx = apirequest.WithNamespace(hctx, req.Info.Namespace)
	hctx = apirequest.WithReceivedTimestamp(hctx, req.Arrival)
	hctx = warning.WithWarningRecorder(hctx, rec)
	hctx = audit.WithAuditContext(hctx)
	r := req.HTTP.Clone(hctx)
	// The replay's answer goes nowhere: compressing it (kubectl asks for
	// gzip, and the apiserver compresses answers over 128 KiB) would only
	// cost CPU and hide the object the storage stage sizes.
	r.Header.Del("Accept-Encoding")
	if req.BodyTruncated && len(req.Body) < MaxBodyBytes {
		run.Unknown = "the apiserver did not read the whole request body, so kproxy did not see it"
		run.End = now()
		return run
	}
	body := req.Body
	if req.BodyTruncated {
		// kproxy kept the apiserver's limit's worth: one byte more makes
		// the handler refuse it where the apiserver does (after content
		// negotiation), whatever the rest held.
		body = append(body[:len(body):len(body)], ' ')
	}
	q := r.URL.Query()
	switch {
	case run.Read:
		if run.Narrowed = narrowList(req.Info, q); run.Narrowed != "" {
			r.URL.RawQuery = q.Encode()
		}
	case connectSubresource(req.Info.Subresource):
		// Connect handlers write nothing, and refuse a dryRun option;
		// admission sees them as dry runs (connectAsDryRun).
	default:
		var ct string
		q, body, ct = forceDryRun(req.Info.Verb, req.Info.Subresource, run.DryRun, q, body, contentType)
		r.URL.RawQuery = q.Encode()
		if ct != contentType {
			r.Header = r.Header.Clone()
			r.Header.Set("Content-Type", ct)
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	resp := recorder{httptest.NewRecorder(), run}
	defer w.storage.unencoded.release(run)
	w.handler.ServeHTTP(resp, r)
	run.End = now()
	run.Code = resp.Code
	run.ETag = resp.Header().Get("ETag")
	run.warnings = rec.list()
	if run.handshake != nil && run.settleHandshake(run.handshake) {
		return run
	}
	if reachedBackend(resp.Body.String()) {
		run.markUnknown(backendReached("a kubelet or proxied backend"))
	}
	if st := run.createNamingResourceVersion(resp); st != nil {
		run.Code, run.Status, run.Decided, run.Object = int(st.Code), st, record.StageStorage, nil
		return run
	}
	if resp.Code >= 300 && resp.Code != http.StatusNotModified {
		if st, ok := kdecode.Status(resp.Header().Get("Content-Type"), resp.Body.Bytes()); ok {
			run.Status = st
		} else {
			run.Status = &metav1.Status{Status: metav1.StatusFailure, Code: int32(resp.Code), Message: strings.TrimSpace(resp.Body.String())}
		}
		if !run.DryRun && !run.Read {
			run.Status.Message = storedKeys(run.Status.Message, w.opts.EtcdPrefix)
		}
		run.Decided = run.attribute(run.Status)
		switch {
		case replayTimedOut(run.Status):
			run.markUnknown(replayTimeoutWhy)
		default:
			// The replay's refusal is what cannot be trusted: the
			// stage it came from says so. The first check that
			// explains it wins; the later ones do not run.
			explained := false
			paramKindLag := func(ctx context.Context) string {
				_, why := w.params.paramKindLag(ctx, run, req.Info, req.Arrival)
				return why
			}
			paramsWritten := func(ctx context.Context) string {
				_, why := w.params.paramsWritten(ctx, run, req.Info)
				return why
			}
			drawnHere := func(ctx context.Context) string {
				_, why := w.params.drawnHere(ctx, run)
				return why
			}
			for _, late := range []func(context.Context) string{run.refusedLate, run.limitRangeOrderHere, paramsWritten, drawnHere, run.refusedByStateLate, run.mutatedLate, run.webhookRefusedOnlyHere, run.conversionFailedOnlyHere, run.conversionFailedThere, paramKindLag, run.paramsUnsyncedHere, run.policyOrderHere, run.changedInFlight, run.changedBeforeOwnWrite, run.connectedLate, run.escalationLate} {
				if why := late(ctx); why != "" {
					run.markUnknownAt(run.Decided, why)
					explained = true
					break
				}
			}
			// Last, a mutating webhook's patch to kproxy's call: what
			// is unknown is mutating admission's outcome.
			// Then, which state of the object the request met.
			// A store's refusal is read first as the state the request met
			// (noOpLate), then as what a webhook's patch made.
			if !explained {
				byWebhook := func() bool {
					why := run.mutatedByWebhookHere(ctx)
					if why != "" {
						run.markUnknownAt(record.StageMutatingAdmission, why)
					}
					return why != ""
				}
				noOp := func() bool {
					why := run.noOpLate(ctx)
					if why != "" {
						run.markUnknownAt(record.StageStorage, why)
					}
					return why != ""
				}
				if run.Decided == record.StageStorage {
					_ = noOp() || byWebhook()
				} else {
					_ = byWebhook() || noOp()
				}
			}
		}
	} else if !run.Read {
		run.Object = resp.Body.Bytes()
		if stage, why := run.admittedEarly(ctx); why != "" {
			run.markUnknownAt(stage, why)
		} else if why := run.escalationLate(ctx); why != "" {
			run.markUnknownAt(record.StageAuthorization, why)
		} else if stage, why := w.params.skipped(ctx, run, req.Info); why != "" {
			run.markUnknownAt(stage, why)
		} else if stage, why := w.params.paramKindLag(ctx, run, req.Info, req.Arrival); why != "" {
			run.markUnknownAt(stage, why)
		} else if stage, why := w.params.paramsWritten(ctx, run, req.Info); why != "" {
			run.markUnknownAt(stage, why)
		} else if stage, why := w.params.drawnHere(ctx, run); why != "" {
			run.markUnknownAt(stage, why)
		}
	}
	return run
}

// createNamingResourceVersion is the apiserver's answer to a create whose
// object names a resourceVersion, which the replay's dry run cannot give:
// the etcd3 store's Create refuses it (storage.ErrResourceVersionSetOnCreate,
// a plain error the handler answers 500, as ErrorToAPIStatus words it)
// before it looks for an existing object, while the registry's dry run
// never calls it. So a create that is not a dry run, of the object itself,
// whose body names a resourceVersion other than 0, and that the replay
// admitted or refused only at the store as existing, is refused so. nil
// for any other run.
func (r *Run) createNamingResourceVersion(resp recorder) *metav1.Status {
	if r.Read || r.DryRun || r.Verb != "create" || r.Subresource != "" {
		return nil
	}
	if v, err := (storage.APIObjectVersioner{}).ParseResourceVersion(r.BodyRV); err != nil || v == 0 {
		return nil
	}
	switch {
	case resp.Code >= 200 && resp.Code < 300:
	case resp.Code == http.StatusConflict:
		if st, ok := kdecode.Status(resp.Header().Get("Content-Type"), resp.Body.Bytes()); !ok || st.Reason != metav1.StatusReasonAlreadyExists {
			return nil
		}
	default:
		return nil
	}
	return &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
		Code: http.StatusInternalServerError, Reason: metav1.StatusReasonUnknown, Message: storage.ErrResourceVersionSetOnCreate.Error()}
}

// requestTimeoutMessage begins (after "Timeout: ") the apiserver's 504
// for a request whose context ended: its handlers' finisher, and its
// webhook dispatchers before and between calls.
const requestTimeoutMessage = "request did not complete within requested timeout"

// replayTimeoutWhy is the run's unknown when the handler timed out.
const replayTimeoutWhy = "the replay ran out of time inside the apiserver's handler (its request timeout, " +
	"or kproxy's replay budget, counted on kproxy's replay, which waits for the apiserver's own answer and shares kproxy's CPU): " +
	"a timeout of the replay says nothing about the apiserver's answer"

// replayTimedOut reports the handler's 504 for a request whose context
// ended. In a replay the only deadlines on that context are kproxy's: its
// replay budget and the handler's own request timeout, both counted from
// when kproxy replays, not from when the apiserver ran the request. A 504
// the apiserver gives for another reason (a resourceVersion too far ahead
// of the watch cache) keeps its prediction.
func replayTimedOut(st *metav1.Status) bool {
	return st != nil && st.Code == http.StatusGatewayTimeout && st.Reason == metav1.StatusReasonTimeout &&
		strings.HasPrefix(strings.TrimPrefix(st.Message, "Timeout: "), requestTimeoutMessage)
}

// recorder records the handler's answer; it can take a watch's stream
// (the handler wants a Flusher and a CloseNotifier).
type recorder struct {
	*httptest.ResponseRecorder
	run *Run
}

func (recorder) CloseNotify() <-chan bool { return make(chan bool) }

// Hijack is where the apiserver takes the connection over. A WebSocket
// exec, attach or port-forward (v5.channel.k8s.io and later, which the
// apiserver translates to SPDY for the kubelet) switches protocols before
// the kubelet is dialled: the apiserver's answer is 101, then the
// kubelet's. The run stops here, unknown; the connection handed back is
// closed, so the WebSocket handshake ends at once. A watch over WebSocket
// involves no kubelet: its handshake's answer is kept (websocket.go).
func (r recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	r.run.mu.Lock()
	watched := r.run.Watched
	r.run.mu.Unlock()
	if r.run.Read && watched {
		// A watch over WebSocket: its handshake's answer is read off
		// the connection (websocket.go).
		c := &handshakeConn{}
		r.run.handshake = c
		return c, bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c)), nil
	}
	r.run.markUnknown(upgradeReached)
	c, peer := net.Pipe()
	peer.Close()
	return c, bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c)), nil
}

// warningRecorder collects the warnings the handler adds.
type warningRecorder struct {
	mu sync.Mutex
	w  []string
}

func (w *warningRecorder) AddWarning(agent, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.w = append(w.w, text)
}

func (w *warningRecorder) list() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.w...)
}

// PhaseTimes returns when a stage's phase began and ended in the run.
func (r *Run) PhaseTimes(phase int) (start, end time.Time, reached bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if phase != PhaseDecode && r.marks[phase].IsZero() {
		return time.Time{}, time.Time{}, false
	}
	start = r.marks[phase]
	end = r.End
	for p := phase + 1; p < len(r.marks); p++ {
		if !r.marks[p].IsZero() {
			end = r.marks[p]
			break
		}
	}
	return start, end, true
}

// StatusMessage describes a refusal for an explanation.
func StatusMessage(st *metav1.Status) string {
	return fmt.Sprintf("%d %s: %s", st.Code, st.Reason, st.Message)
}
