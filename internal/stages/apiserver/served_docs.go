package apiserver

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	aggregatorinformers "k8s.io/kube-aggregator/pkg/client/informers/externalversions"
	apiregistrationlisters "k8s.io/kube-aggregator/pkg/client/listers/apiregistration/v1"
)

// What the apiserver serves about itself. Some answers depend on documents
// the aggregator assembles (built-in groups, CustomResourceDefinitions,
// APIServices) and the replay server does not: the ETags of the
// aggregated discovery roots that conditional requests are answered
// against (kubectl and every client-go program cache /api and /apis and
// ask again with If-None-Match), the apiserver's index of the paths it
// serves, the OpenAPI v3 index. kproxy reads them from the apiserver, as
// cluster state: once, then again after CustomResourceDefinitions or
// APIServices change. The aggregator updates its documents a moment after
// such a change, so for a while after one they are read on every use.

// ServedDocs caches what kproxy read of the apiserver's own documents.
type ServedDocs struct {
	http *http.Client
	base string
	now  func() time.Time

	// APIServices lists the aggregator's APIServices, once
	// APIServicesSynced.
	APIServices       apiregistrationlisters.APIServiceLister
	APIServicesSynced cache.InformerSynced

	mu      sync.Mutex
	docs    map[string]cachedDoc
	changed time.Time // the last change of what the documents list
	// groups: the last change of each API group's CRDs and APIServices
	// (a group's OpenAPI v3 document and its place in the index change
	// with them only); anyGroup: of an object whose group is not known
	// (a deletion's tombstone), which counts for every group.
	groups   map[string]time.Time
	anyGroup time.Time
	seen     map[string][]Seen
}

// Seen is what one read of a document showed of its version (its ETag
// and Last-Modified headers), and when kproxy had the answer: the
// document was at least that new from then on.
type Seen struct {
	At           time.Time
	ETag         string
	LastModified string
}

// seenKept is how many reads of each document are remembered: a replay
// asks for the last read before its request arrived, and replays run
// moments after their requests.
const seenKept = 8

// ServedDoc is one read: its status, the headers that matter, the body.
type ServedDoc struct {
	Status int
	Header http.Header
	Body   []byte
}

// cachedDoc is a read kept, and when kproxy made it.
type cachedDoc struct {
	ServedDoc
	read time.Time
}

// discoverySettle is how long after a change the documents are read anew
// on every use.
const discoverySettle = 30 * time.Second

// aggregatedDiscovery is the media type of the aggregated documents.
const aggregatedDiscovery = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"

func newServedDocs(ctx context.Context, s *ClusterState, crds cache.SharedIndexInformer, now func() time.Time) (*ServedDocs, error) {
	hc, err := rest.HTTPClientFor(s.Config)
	if err != nil {
		return nil, fmt.Errorf("served documents: %w", err)
	}
	d := &ServedDocs{http: hc, base: strings.TrimSuffix(s.Config.Host, "/"), now: now, docs: map[string]cachedDoc{}}
	bump := d.changes()
	if _, err := crds.AddEventHandler(bump); err != nil {
		return nil, err
	}
	ac, err := aggregatorclient.NewForConfig(s.Config)
	if err != nil {
		return nil, fmt.Errorf("served documents: %w", err)
	}
	f := aggregatorinformers.NewSharedInformerFactory(ac, 0)
	inf := f.Apiregistration().V1().APIServices()
	if _, err := inf.Informer().AddEventHandler(bump); err != nil {
		return nil, err
	}
	d.APIServices, d.APIServicesSynced = inf.Lister(), inf.Informer().HasSynced
	f.Start(ctx.Done())
	return d, nil
}

// changes is the handler of the CRD and APIService informers' events:
// what the documents list changed.
func (d *ServedDocs) changes() cache.ResourceEventHandlerDetailedFuncs {
	// The objects the informers list at start changed when their
	// metadata says, not when kproxy started: a kproxy just started had
	// doubted every document for 30 s (found by a probe: kproxy test
	// run, a fresh process each time, said every document by hash was
	// "changed around its arrival").
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			if initial {
				d.listed(obj)
				return
			}
			d.invalidate(obj)
		},
		UpdateFunc: func(old, obj any) {
			// A resync (apiextensions' informers resync every 5
			// minutes) is no change: it had made every group's
			// documents doubted (probe AC).
			if o, err := meta.Accessor(old); err == nil {
				if n, err := meta.Accessor(obj); err == nil && o.GetResourceVersion() == n.GetResourceVersion() {
					return
				}
			}
			d.invalidate(obj)
		},
		DeleteFunc: func(obj any) { d.invalidate(obj) },
	}
}

// SettledBefore reports that what the documents list (the groups the
// CustomResourceDefinitions and APIServices make) last changed
// discoverySettle or more before t, and not since: a document served at t
// is the one served now, though its Last-Modified, when the apiserver
// builds it at the first request after a change, may be later than t.
func (d *ServedDocs) SettledBefore(t time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.changed.IsZero() && d.changed.Before(t.Add(-discoverySettle))
}

// GroupSettledBefore is SettledBefore for what one API group's OpenAPI v3
// document depends on: its own CustomResourceDefinitions and APIServices.
// A change to another group's leaves it as it was (a probe: every
// document of every group was doubted after any CRD change).
func (d *ServedDocs) GroupSettledBefore(group string, t time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.changed.IsZero() && d.groupChanged(group).Before(t.Add(-discoverySettle))
}

// GroupChangedSince reports that group's CRDs or APIServices were seen
// to change after t (or the documents never seen settled at all).
func (d *ServedDocs) GroupChangedSince(group string, t time.Time) bool {
	at, seen := d.GroupChangedAt(group)
	return !seen || at.After(t)
}

// GroupChangedAt is when kproxy last saw group's CRDs or APIServices
// change (zero: never, since those it listed at its start were last
// written), and whether it has listed them at all yet.
func (d *ServedDocs) GroupChangedAt(group string) (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.groupChanged(group), !d.changed.IsZero()
}

// ChangedAt is when kproxy last saw any CRD or APIService change, and
// whether it has listed them at all yet.
func (d *ServedDocs) ChangedAt() (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.changed, !d.changed.IsZero()
}

func (d *ServedDocs) groupChanged(group string) time.Time {
	if g := d.groups[group]; g.After(d.anyGroup) {
		return g
	}
	return d.anyGroup
}

// groupOf is the API group a CustomResourceDefinition or APIService
// serves, or false for anything else (a tombstone's lost object).
func groupOf(obj any) (string, bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	switch o := obj.(type) {
	case *apiextensionsv1.CustomResourceDefinition:
		return o.Spec.Group, true
	case *apiregistrationv1.APIService:
		return o.Spec.Group, true
	}
	return "", false
}

// changedAt records a change of obj's group at t, under d.mu.
func (d *ServedDocs) changedAt(obj any, t time.Time) {
	g, ok := groupOf(obj)
	if !ok {
		if t.After(d.anyGroup) {
			d.anyGroup = t
		}
		return
	}
	if d.groups == nil {
		d.groups = map[string]time.Time{}
	}
	if t.After(d.groups[g]) {
		d.groups[g] = t
	}
}

// listed counts an object the informers found at start as changed at
// its last write: its creation, the latest time in its managed fields
// (each field manager's last write), and its conditions' transitions.
func (d *ServedDocs) listed(obj any) {
	m, err := meta.Accessor(obj)
	if err != nil {
		d.invalidate(obj)
		return
	}
	last := m.GetCreationTimestamp().Time
	for _, f := range m.GetManagedFields() {
		if f.Time != nil && f.Time.After(last) {
			last = f.Time.Time
		}
	}
	later := func(t metav1.Time) {
		if t.After(last) {
			last = t.Time
		}
	}
	switch o := obj.(type) {
	case *apiextensionsv1.CustomResourceDefinition:
		for _, c := range o.Status.Conditions {
			later(c.LastTransitionTime)
		}
	case *apiregistrationv1.APIService:
		for _, c := range o.Status.Conditions {
			later(c.LastTransitionTime)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if last.After(d.changed) {
		d.changed = last
	}
	d.changedAt(obj, last)
}

// invalidate forgets every read kept: obj changed now.
func (d *ServedDocs) invalidate(obj any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.docs = map[string]cachedDoc{}
	d.changed = d.now()
	d.changedAt(obj, d.changed)
}

// Get returns the apiserver's answer to kproxy's GET of path with accept,
// from the cache while nothing it depends on changed.
func (d *ServedDocs) Get(ctx context.Context, path, accept string) (ServedDoc, error) {
	key := path + " " + accept
	d.mu.Lock()
	c, ok := d.docs[key]
	d.mu.Unlock()
	if ok {
		return c.ServedDoc, nil
	}
	read := d.now()
	doc, err := d.Read(ctx, path, accept)
	if err != nil {
		return doc, err
	}
	d.keep(key, cachedDoc{ServedDoc: doc, read: read})
	return doc, nil
}

// keep caches c when it was read after the documents settled: a read
// made while the aggregator was still updating them (a new
// CustomResourceDefinition's group missing from the OpenAPI v3 index a
// second after its creation) would be served from the cache until the
// next change, minutes later (probe M: a document predicted 404, 7
// minutes after its CRD was created, that the apiserver served). A read
// begun before the last change is not kept either.
func (d *ServedDocs) keep(key string, c cachedDoc) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c.read.Sub(d.changed) > discoverySettle {
		d.docs[key] = c
	}
}

// Read GETs path from the apiserver with kproxy's identity, now.
func (d *ServedDocs) Read(ctx context.Context, path, accept string) (ServedDoc, error) {
	return d.read(ctx, path, accept, "")
}

// Version reads which version of the document at path the apiserver
// serves now (its ETag and Last-Modified) without the document: its first
// byte (Range: bytes=0-0), which net/http's ServeContent, serving the
// OpenAPI documents, answers 206 with the version's headers. The OpenAPI
// v2 document is megabytes; a conditional request of it is answered from
// its version alone.
func (d *ServedDocs) Version(ctx context.Context, path, accept string) (ServedDoc, error) {
	return d.read(ctx, path, accept, "bytes=0-0")
}

func (d *ServedDocs) read(ctx context.Context, path, accept, byteRange string) (ServedDoc, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.base+path, nil)
	if err != nil {
		return ServedDoc{}, err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	if byteRange != "" {
		req.Header.Set("Range", byteRange)
	}
	resp, err := d.http.Do(req)
	if err != nil {
		return ServedDoc{}, fmt.Errorf("kproxy could not read %s from the apiserver: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return ServedDoc{}, fmt.Errorf("kproxy could not read %s from the apiserver: %w", path, err)
	}
	if resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusUnauthorized {
		return ServedDoc{}, fmt.Errorf("kproxy's identity may not read %s (%s): grant it get on that nonResourceURL (the README's ClusterRole)", path, resp.Status)
	}
	// A path with a query (a health check's, the client's own) is not a
	// document whose versions are compared, and would grow the map.
	version := resp.StatusCode == http.StatusOK || (byteRange != "" && resp.StatusCode == http.StatusPartialContent)
	if version && resp.Header.Get("Last-Modified") != "" && !strings.Contains(path, "?") {
		d.remember(path, Seen{At: d.now(), ETag: resp.Header.Get("Etag"), LastModified: resp.Header.Get("Last-Modified")})
	}
	return ServedDoc{Status: resp.StatusCode, Header: resp.Header, Body: body}, nil
}

func (d *ServedDocs) remember(path string, s Seen) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.seen == nil {
		d.seen = map[string][]Seen{}
	}
	kept := append(d.seen[path], s)
	if len(kept) > seenKept {
		kept = kept[len(kept)-seenKept:]
	}
	d.seen[path] = kept
}

// SeenBefore is the last read of path that kproxy had by t: at t the
// document was that version or a newer one.
func (d *ServedDocs) SeenBefore(path string, t time.Time) (Seen, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	kept := d.seen[path]
	for i := len(kept) - 1; i >= 0; i-- {
		if !kept[i].At.After(t) {
			return kept[i], true
		}
	}
	return Seen{}, false
}

// etag returns the apiserver's current ETag of the aggregated discovery
// document at path (/api or /apis), quoted as in its ETag header.
func (d *ServedDocs) ETag(ctx context.Context, path string) (string, error) {
	doc, err := d.Get(ctx, path, aggregatedDiscovery)
	if err != nil {
		return "", err
	}
	e := doc.Header.Get("ETag")
	if doc.Status != http.StatusOK || e == "" {
		return "", fmt.Errorf("the apiserver answered kproxy's read of %s with %d and no ETag", path, doc.Status)
	}
	return e, nil
}
