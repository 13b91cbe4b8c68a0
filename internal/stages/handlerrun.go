package stages

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/audit"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/warning"
	"k8s.io/kubernetes/pkg/api/legacyscheme"

	kdecode "github.com/kproxy/kproxy/internal/decode"
	"github.com/kproxy/kproxy/internal/record"
)

// Phases of one write through the apiserver's handler, in the order they
// begin. An update reads the stored object before admission; the phase
// marks only move forward.
const (
	phaseDecode     = iota // handler: content type, body, options
	phaseMutating          // mutating admission
	phaseValidation        // the registry strategy (and preconditions)
	phaseValidating        // validating admission
	phaseStorage           // the dry-run store
)

var phaseStage = [...]string{record.StageDecode, record.StageMutatingAdmission, record.StageValidation, record.StageValidatingAdmission, record.StageStorage}

// handlerRun is what one replay of a request saw go by in the apiserver's
// resource handler: the phases with their times, every admission plugin's
// call and verdict, the storage reads, and the answer. A write runs in dry
// run through all five phases; a read (get, list, watch) through decode
// (query options) and storage.
type handlerRun struct {
	mu      sync.Mutex
	now     func() time.Time
	start   time.Time
	end     time.Time
	phase   int
	marks   [len(phaseStage)]time.Time // when each phase began
	plugins []pluginCall
	reads   []storageRead
	// pluginErr is the last error an admission plugin returned, with the
	// phase it returned it in.
	pluginErr       error
	pluginErrPhase  int
	pluginErrName   string
	pluginErrDetail string

	status   *metav1.Status // the handler's answer when it refused
	code     int
	etag     string // the ETag the handler answered with (discovery)
	object   []byte // the handler's answer when it accepted (the object)
	warnings []string
	// unknown says why the run cannot be trusted (a read failed, a
	// webhook cannot be called in dry run).
	unknown string
	// decided is the stage that produced the refusal.
	decided string

	// actual waits for the apiserver's answer to the request (nil for a
	// replay with no live request, such as kproxy explain); bodyRV is
	// the resourceVersion the request's body carries.
	actual func(context.Context) (ActualWrite, bool)
	bodyRV string
	verb   string
	dryRun bool // the request itself is a dry run

	// read marks a get, list or watch; narrowed says how the replay's
	// list was narrowed (limit=1) so as not to read the whole collection.
	read     bool
	narrowed string
	watched  bool
}

// snapshotRevision decides which state of an object the replay reads: the
// latest ("") unless the request's own write is already visible. A write
// that succeeded answers with the object's new resourceVersion R; an
// object found at R is the request's own doing (unless the write was a
// no-op, which keeps the resourceVersion the body named), so the replay
// reads it at R-1. A delete that succeeded removed the object, and the
// store answers with its last version at the delete's own revision R: it
// is read at R-1. why is set when the answer never came.
func (r *handlerRun) snapshotRevision(ctx context.Context, found bool, rv string) (at, why string) {
	if r.actual == nil || r.dryRun {
		return "", "" // a dry run writes nothing
	}
	aw, ok := r.actual(ctx)
	if !ok {
		return "", "the apiserver's answer did not come within the replay budget, so the state on arrival is not known"
	}
	if aw.Status >= 300 {
		return "", "" // nothing was written
	}
	if aw.ResourceVersion == "" {
		if !found && r.verb == "delete" {
			return lastExisting, "" // the answer was a Status
		}
		return "", ""
	}
	n, err := strconv.ParseUint(aw.ResourceVersion, 10, 64)
	if err != nil || n < 2 {
		return "", ""
	}
	switch {
	case found && rv == aw.ResourceVersion && r.bodyRV != aw.ResourceVersion:
		return strconv.FormatUint(n-1, 10), ""
	case !found && r.verb == "delete":
		// The store answers a delete with the object as it last was, at
		// the revision of the delete itself: it last existed just before.
		return strconv.FormatUint(n-1, 10), ""
	}
	return "", ""
}

// updatedExisting reports an update or patch the apiserver answered 200:
// the object existed before the request (a 201 would mean it created it).
func (r *handlerRun) updatedExisting(ctx context.Context) bool {
	if r.actual == nil || (r.verb != "update" && r.verb != "patch") {
		return false
	}
	aw, ok := r.actual(ctx)
	return ok && aw.Status == 200
}

// lastExisting asks for the object's last stored version before a
// delete whose answer did not name it.
const lastExisting = "last-existing"

type pluginCall struct {
	Name       string
	Validating bool
	Start, End time.Time
	Err        error
	Patch      string // what a mutating plugin changed, as a JSON patch
	Detail     string // what the refusal's message leaves out
}

type storageRead struct {
	Key, Path       string
	Snapshot        string // the resourceVersion read at, if not the latest
	Found           bool
	ResourceVersion string
	Start           time.Time
	Duration        time.Duration
	Err             error // the read failed: the run cannot be trusted
	// Refused is the storage's answer to a read request when it is an
	// error the apiserver answers with (not found, resourceVersion too
	// large or too old, invalid continue token).
	Refused error

	// A read request's storage call: list or get, the options it asked
	// for, whether the apiserver's etcd3 store answered it (else kproxy
	// read through the apiserver), and the raw etcd key (or, for a list,
	// the number of keys under the prefix).
	List        bool
	BeforeRead  bool   // refused before reading (the options)
	NoEtcd      string // why etcd was not read
	Options     string
	FromEtcd    bool
	Etcd        *etcdKV
	EtcdPrefix  string
	EtcdCount   int64
	EtcdRev     int64
	EtcdStart   time.Time
	EtcdLatency time.Duration
}

type runKey struct{}

func withRun(ctx context.Context, r *handlerRun) context.Context {
	return context.WithValue(ctx, runKey{}, r)
}

func runFrom(ctx context.Context) *handlerRun {
	r, _ := ctx.Value(runKey{}).(*handlerRun)
	return r
}

func (r *handlerRun) enter(phase int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if phase > r.phase {
		r.phase = phase
		r.marks[phase] = r.now()
	}
}

// markUnknown records the first reason the run cannot be trusted.
func (r *handlerRun) markUnknown(why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unknown == "" {
		r.unknown = why
	}
}

func (r *handlerRun) addRead(read storageRead) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reads = append(r.reads, read)
	if read.Err != nil && r.unknown == "" {
		r.unknown = fmt.Sprintf("could not read %s: %v", read.Path, read.Err)
	}
}

func (r *handlerRun) addPlugin(c pluginCall) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.plugins = append(r.plugins, c)
	if c.Err != nil {
		r.pluginErr, r.pluginErrName, r.pluginErrDetail = c.Err, c.Name, c.Detail
		r.pluginErrPhase = phaseMutating
		if c.Validating {
			r.pluginErrPhase = phaseValidating
		}
	}
}

// phaseMarker wraps the admission chain to mark where the handler is:
// mutating admission begins with Admit, the strategy's validation follows
// it, validating admission is Validate, and storage comes after.
type phaseMarker struct{ inner admission.Interface }

func (p *phaseMarker) Handles(op admission.Operation) bool { return p.inner.Handles(op) }

func (p *phaseMarker) Admit(ctx context.Context, a admission.Attributes, o admission.ObjectInterfaces) error {
	r := runFrom(ctx)
	if r != nil {
		r.enter(phaseMutating)
	}
	var err error
	if m, ok := p.inner.(admission.MutationInterface); ok {
		err = m.Admit(ctx, a, o)
	}
	if r != nil && err == nil {
		r.enter(phaseValidation)
	}
	return err
}

func (p *phaseMarker) Validate(ctx context.Context, a admission.Attributes, o admission.ObjectInterfaces) error {
	r := runFrom(ctx)
	if r != nil {
		r.enter(phaseValidating)
	}
	var err error
	if v, ok := p.inner.(admission.ValidationInterface); ok {
		err = v.Validate(ctx, a, o)
	}
	if r != nil && err == nil {
		r.enter(phaseStorage)
	}
	return err
}

// observedPlugin is the decorator around each admission plugin: it times
// the plugin's call, keeps its verdict and, for a mutating plugin, what it
// changed in the object.
type observedPlugin struct {
	inner admission.Interface
	name  string
	// webhook describes an admission webhook by name (its configuration,
	// sideEffects, failurePolicy, timeout); nil for other plugins.
	webhook func(name string) string
	// explain adds what the plugin's refusal leaves out.
	explain *admissionExplainer
}

func (p *observedPlugin) Handles(op admission.Operation) bool { return p.inner.Handles(op) }

func (p *observedPlugin) Admit(ctx context.Context, a admission.Attributes, o admission.ObjectInterfaces) error {
	m, ok := p.inner.(admission.MutationInterface)
	if !ok {
		return nil
	}
	a = connectAsDryRun(a)
	r := runFrom(ctx)
	if r == nil {
		return m.Admit(ctx, a, o)
	}
	// Most plugins change nothing: compare copies, and encode for the
	// patch only when something changed. reflect.DeepEqual is much cheaper
	// than equality.Semantic; what it calls different but is the same
	// (quantities spelled alike) encodes to the same JSON and gets no patch.
	var before runtime.Object
	if obj := a.GetObject(); obj != nil {
		before = obj.DeepCopyObject()
	}
	c := pluginCall{Name: p.name, Start: r.now()}
	c.Err = m.Admit(ctx, a, o)
	c.End = r.now()
	p.noticeSideEffects(r, c.Err)
	c.Detail = p.explain.explain(p.name, a, c.Err)
	if after := a.GetObject(); before != nil && after != nil && !reflect.DeepEqual(before, after) {
		if b, a := objectJSON(before), objectJSON(after); b != nil && a != nil && !bytes.Equal(b, a) {
			c.Patch = jsonPatch(b, a)
		}
	}
	r.addPlugin(c)
	return c.Err
}

func (p *observedPlugin) Validate(ctx context.Context, a admission.Attributes, o admission.ObjectInterfaces) error {
	v, ok := p.inner.(admission.ValidationInterface)
	if !ok {
		return nil
	}
	a = connectAsDryRun(a)
	r := runFrom(ctx)
	if r == nil {
		return v.Validate(ctx, a, o)
	}
	c := pluginCall{Name: p.name, Validating: true, Start: r.now()}
	c.Err = v.Validate(ctx, a, o)
	c.End = r.now()
	p.noticeSideEffects(r, c.Err)
	c.Detail = p.explain.explain(p.name, a, c.Err)
	r.addPlugin(c)
	return c.Err
}

// dryRunUnsupported is the webhook dispatchers' refusal to call a webhook
// with side effects in dry run.
var dryRunUnsupported = regexp.MustCompile(`admission webhook "([^"]+)" does not support dry run`)

// noticeSideEffects makes the run unknown when the replay (always a dry
// run) could not call a webhook that the real, non-dry-run request does
// call: kproxy never calls a webhook that declares side effects.
func (p *observedPlugin) noticeSideEffects(r *handlerRun, err error) {
	if err == nil || r.dryRun || p.webhook == nil {
		return
	}
	m := dryRunUnsupported.FindStringSubmatch(err.Error())
	if m == nil {
		return
	}
	r.markUnknown("depends on " + p.webhook(m[1]) + ": it declares side effects, and kproxy calls webhooks only in dry run")
}

// objectJSON is the object as JSON in its external version, for diffs.
func objectJSON(obj runtime.Object) []byte {
	if obj == nil {
		return nil
	}
	gvks, _, err := legacyscheme.Scheme.ObjectKinds(obj)
	if err != nil || len(gvks) == 0 {
		return nil
	}
	gv := gvks[0].GroupVersion()
	if gv.Version == runtime.APIVersionInternal {
		if vs := legacyscheme.Scheme.PrioritizedVersionsForGroup(gv.Group); len(vs) > 0 {
			gv = vs[0]
		}
	}
	b, err := runtime.Encode(legacyscheme.Codecs.LegacyCodec(gv), obj)
	if err != nil {
		return nil
	}
	return b
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
func (w *writePath) runRequest(ctx context.Context, req *Request, now func() time.Time) *handlerRun {
	contentType := req.HTTP.Header.Get("Content-Type")
	run := &handlerRun{now: now, start: now(), actual: req.Actual, verb: req.Info.Verb, bodyRV: resourceVersionOf(req.Body),
		dryRun: dryRunRequest(req.Info.Verb, req.HTTP.URL.Query(), req.Body, contentType), read: !IsWrite(req.Info)}
	run.marks[phaseDecode] = run.start
	rec := &warningRecorder{}
	hctx := withRun(ctx, run)
	hctx = apirequest.WithRequestInfo(hctx, req.Info)
	hctx = apirequest.WithUser(hctx, req.User)
	hctx = apirequest.WithNamespace(hctx, req.Info.Namespace)
	hctx = apirequest.WithReceivedTimestamp(hctx, req.Arrival)
	hctx = warning.WithWarningRecorder(hctx, rec)
	hctx = audit.WithAuditContext(hctx)
	r := req.HTTP.Clone(hctx)
	if req.BodyTruncated && len(req.Body) < MaxBodyBytes {
		run.unknown = "the apiserver did not read the whole request body, so kproxy did not see it"
		run.end = now()
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
	case run.read:
		if run.narrowed = narrowList(req.Info, q); run.narrowed != "" {
			r.URL.RawQuery = q.Encode()
		}
	case connectSubresource(req.Info.Subresource):
		// Connect handlers write nothing, and refuse a dryRun option;
		// admission sees them as dry runs (connectAsDryRun).
	default:
		var ct string
		q, body, ct = forceDryRun(req.Info.Verb, q, body, contentType)
		r.URL.RawQuery = q.Encode()
		if ct != contentType {
			r.Header = r.Header.Clone()
			r.Header.Set("Content-Type", ct)
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	resp := recorder{httptest.NewRecorder()}
	w.handler.ServeHTTP(resp, r)
	run.end = now()
	run.code = resp.Code
	run.etag = resp.Header().Get("ETag")
	run.warnings = rec.list()
	if reachedBackend(resp.Body.String()) {
		run.markUnknown(backendReached("a kubelet or proxied backend"))
	}
	if resp.Code >= 300 && resp.Code != http.StatusNotModified {
		if st, ok := kdecode.Status(resp.Header().Get("Content-Type"), resp.Body.Bytes()); ok {
			run.status = st
		} else {
			run.status = &metav1.Status{Status: metav1.StatusFailure, Code: int32(resp.Code), Message: strings.TrimSpace(resp.Body.String())}
		}
		run.decided = run.attribute(run.status)
	} else if !run.read {
		run.object = resp.Body.Bytes()
	}
	return run
}

// recorder records the handler's answer; it can take a watch's stream
// (the handler wants a Flusher and a CloseNotifier).
type recorder struct{ *httptest.ResponseRecorder }

func (recorder) CloseNotify() <-chan bool { return make(chan bool) }

// narrowList makes a list read at most one object, with the same
// resourceVersion semantics: a list's storage outcome (resourceVersion
// too large or too old, an invalid continue token) does not depend on
// its size, and the replay must not read a big collection a second
// time. A resourceVersion with a limit means an exact read (the legacy
// rule), so a list that named one without a limit gets NotOlderThan
// said explicitly; a list that pages already keeps its semantics with a
// page of one. Watches are left as they are. It returns what it
// changed, or "".
func narrowList(info *apirequest.RequestInfo, q url.Values) string {
	if info.Verb != "list" {
		return ""
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.ParseInt(l, 10, 64)
		switch {
		case err != nil || n < 0 || len(q["limit"]) > 1:
			return "" // the handler judges it as given
		case n > 1:
			q.Set("limit", "1")
			return "limit=1 instead of " + l
		case n == 1:
			return ""
		}
	}
	what := "limit=1"
	if rv := q.Get("resourceVersion"); rv != "" && rv != "0" && q.Get("resourceVersionMatch") == "" && q.Get("continue") == "" {
		q.Set("resourceVersionMatch", string(metav1.ResourceVersionMatchNotOlderThan))
		what += ", resourceVersionMatch=NotOlderThan"
	}
	q.Set("limit", "1")
	return what
}

// attribute names the stage whose code produced st, following the
// contract's labelling rules.
func (r *handlerRun) attribute(st *metav1.Status) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pluginErr != nil {
		if ps, ok := r.pluginErr.(apierrors.APIStatus); ok && ps.Status().Message == st.Message {
			return phaseStage[r.pluginErrPhase]
		}
		if strings.Contains(st.Message, r.pluginErr.Error()) {
			return phaseStage[r.pluginErrPhase]
		}
	}
	switch st.Reason {
	case metav1.StatusReasonNotFound, metav1.StatusReasonAlreadyExists, metav1.StatusReasonConflict:
		if len(r.reads) == 0 && r.phase == phaseDecode {
			return record.StageDecode // no route: the version or resource is not served
		}
		return record.StageStorage
	case metav1.StatusReasonForbidden:
		if strings.Contains(st.Message, "attempting to grant RBAC permissions not currently held") ||
			strings.Contains(st.Message, "must have cluster-admin privileges to use the aggregationRule") {
			return record.StageAuthorization
		}
	case metav1.StatusReasonInvalid:
		// A patch that parses but cannot be applied to the stored object
		// (a failing JSON-patch test) is refused after the read.
		if r.verb == "patch" && r.phase == phaseDecode && len(r.reads) > 0 {
			return record.StageStorage
		}
	case metav1.StatusReasonRequestEntityTooLarge:
		if r.phase < phaseValidation {
			return record.StageDecode
		}
		return record.StageStorage
	}
	return phaseStage[r.phase]
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

// phaseTimes returns when a stage's phase began and ended in the run.
func (r *handlerRun) phaseTimes(phase int) (start, end time.Time, reached bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if phase != phaseDecode && r.marks[phase].IsZero() {
		return time.Time{}, time.Time{}, false
	}
	start = r.marks[phase]
	end = r.end
	for p := phase + 1; p < len(r.marks); p++ {
		if !r.marks[p].IsZero() {
			end = r.marks[p]
			break
		}
	}
	return start, end, true
}

// statusMessage describes a refusal for an explanation.
func statusMessage(st *metav1.Status) string {
	return fmt.Sprintf("%d %s: %s", st.Code, st.Reason, st.Message)
}

// childFor is a plugin call as a stage child.
func childFor(c pluginCall) record.StageResult {
	ch := record.StageResult{Name: c.Name, Outcome: record.Pass, DurationNs: c.End.Sub(c.Start).Nanoseconds()}
	switch {
	case c.Err != nil:
		ch.Outcome, ch.Explanation = record.Reject, c.Err.Error()
		if c.Detail != "" {
			ch.Explanation += " [" + c.Detail + "]"
		}
	case c.Patch != "":
		ch.Explanation = "changed the object: " + c.Patch
	default:
		ch.Explanation = "admitted, no change"
	}
	return ch
}
