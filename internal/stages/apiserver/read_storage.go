package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	kdecode "github.com/kproxy/kproxy/internal/decode"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
)

// Reads of a get, list or watch request, under the registry the replay
// runs. A get of the latest answered 200 takes the object from the answer
// (answered.go). Otherwise, with etcd access they go to the apiserver's own etcd3 store, whose
// code decides what the apiserver's does: NotFound, a resourceVersion too
// large (the watch cache answers the same, after waiting up to 3 seconds)
// or compacted, an invalid or expired continue token. Without etcd access
// kproxy can only see the latest state, through the apiserver: reads that
// name a resourceVersion or continue a list are then unknown.

func (s *snapshotStorage) readGet(ctx context.Context, run *Run, key string, opts storage.GetOptions, out runtime.Object) error {
	run.enter(PhaseStorage)
	read := StorageRead{Key: key, Start: s.clock.Now(), Options: rvOption(opts.ResourceVersion, "")}
	read.Path, _, _, _ = s.apiPath(key, false)
	read.NoEtcd = s.noEtcd
	defer func() { run.addRead(read) }()
	if opts.ResourceVersion != "" {
		// A get naming a resourceVersion goes to the watch cache, which
		// parses it first (a plain error, so 500), unlike the etcd3 store.
		if _, err := (storage.APIObjectVersioner{}).ParseResourceVersion(opts.ResourceVersion); err != nil {
			read.Refused, read.BeforeRead = err, true
			return err
		}
	}
	if rv, ok := s.fromAnswer(ctx, run, key, opts, out); ok {
		read.FromAnswer, read.Found, read.ResourceVersion = true, true, rv
		read.Duration = s.clock.Since(read.Start)
		s.unencoded.hold(run, out)
		return nil
	}
	if s.etcd != nil {
		c, ok, err := s.etcdRead(ctx, &read, func(ctx context.Context, st storage.Interface) error { return st.Get(ctx, key, opts, out) })
		if ok {
			// What etcd answered the store: the key's revisions, encoding
			// and encryption, without reading it again.
			kv := s.access.kvInfo(ctx, c.key, c.resp, c.latency)
			read.Etcd, read.EtcdStart = &kv, c.start
		}
		if read.Err != nil {
			return err
		}
		s.unencoded.hold(run, out)
		return lateRead(ctx, run, &read, settleRead(&read, err, out))
	}
	if opts.ResourceVersion != "" && opts.ResourceVersion != "0" {
		read.Err = errors.New("a get at a resourceVersion is answered from the watch cache, which waits for it: " + needsEtcd + s.noEtcd)
		return read.Err
	}
	raw, err := s.state.Client.Discovery().RESTClient().Get().AbsPath(read.Path).SetHeader("Accept", "application/json").Do(ctx).Raw()
	read.Duration = s.clock.Since(read.Start)
	switch {
	case apierrors.IsNotFound(err):
		return lateRead(ctx, run, &read, settleRead(&read, storage.NewKeyNotFoundError(key, 0), out))
	case err != nil:
		// The refusal's own words, where the client's error has only
		// its status's (kproxy test's local engine: a snapshot's "secrets
		// are never written to a snapshot" read as "the server is
		// currently unable to handle the request", found by a probe).
		read.Err = fmt.Errorf("kproxy could not read it through the apiserver: %w", err)
		if st, ok := kdecode.Status("application/json", raw); ok && st.Message != "" && !strings.Contains(err.Error(), st.Message) {
			read.Err = fmt.Errorf("kproxy could not read it through the apiserver: %w (%s)", err, st.Message)
		}
		return read.Err
	}
	if err := runtime.DecodeInto(s.decoder, raw, out); err != nil {
		read.Err = err
		return err
	}
	return lateRead(ctx, run, &read, settleRead(&read, nil, out))
}

// lateRead checks a get of the latest against the apiserver's answer. The
// replay reads after the request, and a write in between (a controller
// deleting what it just read, creating what it just looked for) makes the
// two disagree: the apiserver answered 200 and the replay finds the object
// gone, or 404 and the replay finds it. Then the state the request met is
// not known, and the run says so instead of predicting the other answer.
// (A get names no revision in its request, and a 404 none in its answer,
// so there is no revision to read at, as a write's replay does.)
func lateRead(ctx context.Context, run *Run, read *StorageRead, err error) error {
	if run.actual == nil || read.Err != nil || read.Options != rvOption("", "") {
		return err
	}
	if storage.IsCorruptObject(err) {
		return corruptRead(ctx, run, read, err)
	}
	found := err == nil
	if !found && !storage.IsNotFound(err) {
		return err
	}
	aw, ok := run.actual(ctx)
	switch {
	case !ok:
		return err
	case found && aw.Status == http.StatusInternalServerError && aw.Refusal != nil && strings.Contains(aw.Refusal.Message, corruptObject):
		read.Err = fmt.Errorf("the apiserver answered 500 (it could not decrypt, decode or convert the object: %s), and kproxy's read could: "+
			"a conversion webhook or an encryption provider answers each read on its own, so the request's outcome is not known", aw.Refusal.Message)
	case found && aw.Status == http.StatusNotFound && !connectSubresource(run.Subresource) && run.Subresource != "log":
		// (A pod's log or a connection to it answers 404 for its node
		// too, which the replay reads next: found by a probe, a pod
		// naming a node that does not exist.)
		read.Err = errors.New("the apiserver answered 404 (no such object), and the replay found it: it was created after this request, before the replay read it, so the state on arrival is not known")
	case !found && aw.Status == http.StatusOK:
		read.Err = errors.New("the apiserver answered 200 (the object existed), and the replay found it absent: it was deleted after this request, before the replay read it, so the state on arrival is not known")
	default:
		return err
	}
	return read.Err
}

// corruptRead holds a get that found the object undecodable to the
// apiserver's answer: what the store makes of the bytes is a conversion
// webhook's or an encryption provider's answer at the moment each read
// them, so where the apiserver answered otherwise, the replay's failure
// says nothing about the request.
func corruptRead(ctx context.Context, run *Run, read *StorageRead, err error) error {
	want := apierrors.NewInternalError(err).ErrStatus.Message
	aw, ok := run.actual(ctx)
	switch {
	case !ok:
		return err
	case aw.Status == http.StatusInternalServerError && aw.Refusal != nil && aw.Refusal.Message == want:
		return err // the apiserver's read failed alike
	case aw.Refusal != nil:
		read.Err = fmt.Errorf("kproxy's read of etcd could not decrypt, decode or convert the object (%w), and the apiserver answered %d: %s: "+
			"the apiserver's read did not fail alike (a conversion webhook answers each call on its own; kproxy's encryption keys may not be the apiserver's), so the request's outcome is not known", err, aw.Status, aw.Refusal.Message)
	default:
		read.Err = fmt.Errorf("kproxy's read of etcd could not decrypt, decode or convert the object (%w), and the apiserver answered %d: "+
			"the apiserver's read did not fail alike (a conversion webhook answers each call on its own; kproxy's encryption keys may not be the apiserver's), so the request's outcome is not known", err, aw.Status)
	}
	read.Refused = nil
	return read.Err
}

// needsEtcd says what kproxy lacks to predict a read's storage outcome.
const needsEtcd = "kproxy predicts resourceVersion semantics only by reading etcd: it needs the apiserver's etcd (give it --etcd-servers and the etcd TLS flags, as the apiserver has them)"

func (s *snapshotStorage) readList(ctx context.Context, run *Run, key string, opts storage.ListOptions, listObj runtime.Object) error {
	if run.Read {
		run.enter(PhaseStorage)
	}
	read := StorageRead{Key: key, List: true, Start: s.clock.Now(), Options: rvOption(opts.ResourceVersion, string(opts.ResourceVersionMatch))}
	if opts.Predicate.Continue != "" {
		read.Options += ", continue token"
	}
	if run.Read && run.Verb == "list" && opts.Predicate.Limit == 1 && !opts.Predicate.Empty() {
		// The list's read is narrowed to one item (narrowList). A
		// selector decides which objects it holds, never its outcome
		// (the etcd3 store files an object its predicate cannot judge
		// as no match), but with one the store reads on, page after
		// page, until a page holds a match: the whole collection for a
		// selector that matches nothing (probe S: 180 to 280 ms of
		// etcd reads where the apiserver's watch cache took 22 ms).
		opts.Predicate.Label, opts.Predicate.Field = labels.Everything(), fields.Everything()
		read.Options += ", its label and field selectors left out (they choose the items, not the outcome)"
	}
	read.Path, _ = s.listPath(key, opts)
	read.NoEtcd = s.noEtcd
	defer func() {
		// A deletecollection lists before it admits each item: its list
		// moves the run to storage only when it ends the request.
		if !run.Read && (read.Err != nil || read.Refused != nil) {
			run.enter(PhaseStorage)
		}
		run.addRead(read)
	}()
	if s.etcd != nil {
		c, ok, err := s.etcdRead(ctx, &read, func(ctx context.Context, st storage.Interface) error { return st.GetList(ctx, key, opts, listObj) })
		if read.Err != nil {
			return err
		}
		if ok {
			// etcd counts every key of the range, whatever the limit.
			read.EtcdCount, read.EtcdRev, read.EtcdStart, read.EtcdLatency = c.resp.Count, c.resp.Header.Revision, c.start, c.latency
		}
		if apierrors.IsResourceExpired(err) && utilfeature.DefaultFeatureGate.Enabled(features.ListFromCacheSnapshot) {
			// The apiserver asks its watch cache first: it keeps a snapshot
			// of every revision since it started (or since its own last
			// compaction), and falls back to etcd only without one.
			seen, ok := s.compactedFor(key, opts, run.arrival)
			if !ok {
				read.Err = fmt.Errorf("etcd has compacted the revision this list asks for (%v), but the apiserver's watch cache keeps snapshots of past revisions (ListFromCacheSnapshot) and may still serve it; which it holds is not visible from outside", err)
				return read.Err
			}
			read.Compacted = fmt.Sprintf("the apiserver compacted etcd at revision %d (compact_rev_key, seen by kproxy %v before the request): its watch cache has dropped its snapshots before it, so etcd answers",
				seen.rev, run.arrival.Sub(seen.at).Truncate(time.Second))
		}
		read.EtcdPrefix = strings.TrimSuffix(s.access.key(key), "/") + "/"
		if !opts.Recursive {
			read.EtcdPrefix = s.access.key(key) // one object's key (listPath)
		}
		s.unencoded.hold(run, listObj)
		return settleRead(&read, err, listObj)
	}
	if (opts.ResourceVersion != "" && opts.ResourceVersion != "0") || opts.ResourceVersionMatch != "" || opts.Predicate.Continue != "" {
		read.Err = errors.New("a list at a resourceVersion, or continuing an earlier one, depends on etcd's revisions: " + needsEtcd + s.noEtcd)
		return read.Err
	}
	err := s.listViaAPI(ctx, key, opts, listObj)
	read.Duration = s.clock.Since(read.Start)
	if err != nil {
		read.Err = err
		return err
	}
	return settleRead(&read, nil, listObj)
}

// compactedFor reports the compaction past the revision a list asks for
// (its resourceVersion, or its continue token's) that kproxy saw long
// enough before the request to know the watch cache no longer holds it.
func (s *snapshotStorage) compactedFor(key string, opts storage.ListOptions, arrival time.Time) (compactionSeen, bool) {
	if s.access == nil {
		return compactionSeen{}, false
	}
	var rv int64
	if c := opts.Predicate.Continue; c != "" {
		_, r, err := storage.DecodeContinue(c, strings.TrimSuffix(key, "/")+"/")
		if err != nil || r <= 0 {
			return compactionSeen{}, false
		}
		rv = r
	} else {
		r, err := strconv.ParseInt(opts.ResourceVersion, 10, 64)
		if err != nil || r <= 0 {
			return compactionSeen{}, false
		}
		rv = r
	}
	return s.access.compactions.expired(rv, arrival)
}

// etcdRead runs one read of the resource's etcd3 store, bounded in time,
// capturing etcd's answer to it.
func (s *snapshotStorage) etcdRead(ctx context.Context, read *StorageRead, call func(context.Context, storage.Interface) error) (capturedRead, bool, error) {
	if err := s.access.admit(); err != nil {
		read.Err = err
		return capturedRead{}, false, err
	}
	st, err := s.etcd.get()
	if err != nil {
		read.Err = err
		return capturedRead{}, false, err
	}
	read.FromEtcd = true
	ectx, cancel := context.WithTimeout(ctx, etcdReadTimeout)
	defer cancel()
	capture := &etcdCapture{}
	err = call(withCapture(ectx, capture), st)
	read.Duration = s.clock.Since(read.Start)
	c, ok := capture.first()
	return c, ok && c.err == nil, err
}

// settleRead files the storage's answer: an error the apiserver answers
// with is the read's outcome; any other failure makes the run unknown.
func settleRead(read *StorageRead, err error, out runtime.Object) error {
	var st apierrors.APIStatus
	switch {
	case err == nil:
		read.Found = true
		if m, merr := meta.CommonAccessor(out); merr == nil {
			read.ResourceVersion = m.GetResourceVersion()
		} else if l, lerr := meta.ListAccessor(out); lerr == nil {
			read.ResourceVersion = l.GetResourceVersion()
		}
	case storage.IsCorruptObject(err) && !read.List && read.Options == rvOption("", ""):
		// An object etcd holds that the store cannot decrypt or decode
		// (a conversion webhook failing, a key the encryption config
		// lacks): a get of the latest reads etcd in the apiserver too,
		// and answers 500 with this error (lateRead holds it to the
		// apiserver's answer).
		read.Refused = err
	case storage.IsCorruptObject(err) || apierrors.ReasonForError(err) == metav1.StatusReasonStoreReadError:
		what := "a get at a resourceVersion"
		if read.List {
			what = "lists"
		}
		read.Err = fmt.Errorf("kproxy's read of etcd could not decrypt, decode or convert the object (%w); the apiserver answers %s from its watch cache, "+
			"which holds objects as they were decoded when stored, so whether it fails alike is not visible from outside", err, what)
	case apierrors.IsInternalError(err):
		read.Err = err // the replay failed (say, a value it cannot decrypt)
	case storage.IsNotFound(err) || storage.IsInvalidError(err) || errors.As(err, &st):
		read.Refused = err
	default:
		read.Err = err
	}
	return err
}

func rvOption(rv, match string) string {
	switch {
	case rv == "" && match == "":
		return "no resourceVersion (the latest, a consistent read)"
	case rv == "0" && match == "":
		return "resourceVersion=0 (any version: the watch cache's)"
	case match == "":
		return "resourceVersion=" + rv + " (not older than)"
	}
	return "resourceVersion=" + rv + ", resourceVersionMatch=" + match
}
