package snapshot

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/record"
)

// ObjectRef names one object a case reads or writes.
type ObjectRef struct {
	GVR             schema.GroupVersionResource
	Namespace, Name string
}

// Options say what Take collects.
type Options struct {
	// Config reads the cluster (GET only).
	Config *rest.Config
	// Collect are the resources collected whole (what the replay lists
	// and watches: see Recorder).
	Collect []schema.GroupVersionResource
	// Named are single objects (what the cases name).
	Named []ObjectRef
	// Docs are served documents to keep beyond discovery, /version and
	// the OpenAPI index.
	Docs []DocRef
	// APIServerArgs are the apiserver's mirrored flags.
	APIServerArgs []string
	// LeftOut are notes to add (what the command knows it left out).
	LeftOut []string
	// Progress reports each step.
	Progress func(format string, a ...any)
	Now      func() time.Time
}

// DocRef is a served document to keep.
type DocRef struct{ Path, Accept string }

// aggregatedDiscovery is the Accept of aggregated discovery.
const aggregatedDiscovery = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"

var (
	secrets    = schema.GroupResource{Resource: "secrets"}
	configMaps = schema.GroupResource{Resource: "configmaps"}
)

// Take writes a snapshot of the cluster to dir.
func Take(ctx context.Context, dir string, o Options) (*Manifest, error) {
	progress := o.Progress
	if progress == nil {
		progress = func(string, ...any) {}
	}
	now := o.Now
	if now == nil {
		now = time.Now
	}
	cfg := rest.CopyConfig(o.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return getOnly{rt} })
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	m := &Manifest{APIVersion: APIVersion, Kind: Kind, Taken: now().UTC().Truncate(time.Second), Server: cfg.Host,
		APIServerArgs: o.APIServerArgs}
	if v, err := dc.ServerVersion(); err == nil {
		m.KubernetesVersion = v.GitVersion
	}
	_, lists, err := dc.ServerGroupsAndResources()
	if err != nil && len(lists) == 0 {
		return nil, fmt.Errorf("discovery of %s: %w", cfg.Host, err)
	}
	index := map[schema.GroupVersionResource]int{}
	var gvs []string
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			continue
		}
		gvs = append(gvs, l.GroupVersion)
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") {
				continue
			}
			index[gv.WithResource(r.Name)] = len(m.Resources)
			m.Resources = append(m.Resources, Resource{Group: gv.Group, Version: gv.Version, Resource: r.Name, Kind: r.Kind, Namespaced: r.Namespaced})
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "objects"), 0o755); err != nil {
		return nil, err
	}
	var maxRV uint64
	bump := func(rv string) {
		if n, err := strconv.ParseUint(rv, 10, 64); err == nil && n > maxRV {
			maxRV = n
		}
	}
	params, err := policyParams(ctx, dyn, index, m.Resources)
	if err != nil {
		return nil, err
	}
	collected := map[schema.GroupVersionResource][]map[string]any{}
	collect := dedupe(append(slices.Clip(o.Collect), params...))
	sort.Slice(collect, func(i, j int) bool { return collect[i].String() < collect[j].String() })
	for _, gvr := range collect {
		i, ok := index[gvr]
		if !ok {
			continue
		}
		if gvr.GroupResource() == secrets {
			m.Resources[i].Collected = CollectedWithheld
			continue
		}
		var items []map[string]any
		cont := ""
		for {
			l, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 500, Continue: cont})
			if err != nil {
				return nil, fmt.Errorf("list %s: %w (kproxy snapshot needs list on what the replay reads; see the README's ClusterRole)", gvr.String(), err)
			}
			bump(l.GetResourceVersion())
			for _, it := range l.Items {
				items = append(items, it.Object)
			}
			if cont = l.GetContinue(); cont == "" {
				break
			}
		}
		collected[gvr] = items
		m.Resources[i].Collected = CollectedAll
		progress("collected %d %s", len(items), resourceName(gvr))
	}
	for _, ref := range o.Named {
		i, ok := index[ref.GVR]
		if !ok || m.Resources[i].Collected == CollectedAll {
			continue
		}
		if ref.GVR.GroupResource() == secrets {
			m.Resources[i].Collected = CollectedWithheld
			continue
		}
		key := objKey(ref.Namespace, ref.Name)
		if m.Resources[i].Collected == CollectedNamed && (slices.Contains(m.Resources[i].Absent, key) || hasObject(collected[ref.GVR], ref)) {
			continue
		}
		m.Resources[i].Collected = CollectedNamed
		var ri dynamic.ResourceInterface = dyn.Resource(ref.GVR)
		if ref.Namespace != "" {
			ri = dyn.Resource(ref.GVR).Namespace(ref.Namespace)
		}
		obj, err := ri.Get(ctx, ref.Name, metav1.GetOptions{})
		switch {
		case err == nil:
			bump(obj.GetResourceVersion())
			collected[ref.GVR] = append(collected[ref.GVR], obj.Object)
		case apierrors.IsNotFound(err):
			m.Resources[i].Absent = append(m.Resources[i].Absent, key)
		default:
			return nil, fmt.Errorf("get %s %s: %w", resourceName(ref.GVR), key, err)
		}
	}
	for gvr, items := range collected {
		if gvr.GroupResource() == configMaps {
			// Whole collections and named objects alike: the credentials
			// of kubeconfigs a ConfigMap holds are never written.
			for _, it := range items {
				record.RedactConfigMapObject(it)
			}
		}
		i := index[gvr]
		r := &m.Resources[i]
		r.File = filepath.Join("objects", fileName(gvr))
		if err := writeList(filepath.Join(dir, r.File), items); err != nil {
			return nil, err
		}
	}
	for i := range m.Resources {
		if m.Resources[i].Resource == "secrets" && m.Resources[i].Group == "" {
			m.Resources[i].Collected = CollectedWithheld
		}
	}
	m.ResourceVersion = strconv.FormatUint(maxRV, 10)
	docs, err := takeDocs(ctx, hc, cfg.Host, gvs, o.Docs)
	if err != nil {
		return nil, err
	}
	progress("kept %d served documents (discovery, /version, the OpenAPI index)", len(docs))
	if err := os.MkdirAll(filepath.Join(dir, "served"), 0o755); err != nil {
		return nil, err
	}
	db, err := json.MarshalIndent(docs, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "served", "docs.json"), db, 0o644); err != nil {
		return nil, err
	}
	m.LeftOut = append([]string{
		"Secrets: never written, not their data nor their names; lists of them are empty and reads of one are unknown, so bootstrap tokens and legacy service-account token secrets cannot be checked offline",
		"bearer tokens: the local engine cannot authenticate a token offline; cases with a token say unknown there (give user and groups, or use --engine cluster)",
		"resources the replay does not list and the cases do not name: reads of them are unknown",
		"etcd: the local engine reads the snapshot, never etcd; resourceVersion semantics are the snapshot's",
		"kubeconfigs in ConfigMaps: their credentials (token, password, client-key-data, auth-provider tokens, secret-looking exec env values) are written as REDACTED, in data, binaryData and kubectl apply's last-applied annotation",
	}, o.LeftOut...)
	mb, err := yaml.Marshal(m)
	if err != nil {
		return nil, err
	}
	header := []byte("# A kproxy snapshot: what the replay reads from the cluster, for kproxy test run --engine local.\n# Written by `kproxy snapshot`; see docs/testing.md. Secrets are never written.\n")
	if err := os.WriteFile(filepath.Join(dir, ManifestFile), append(header, mb...), 0o644); err != nil {
		return nil, err
	}
	return m, nil
}

// admissionPolicies are the policy kinds whose paramKind names a kind
// of objects the policy plugins read whole (an informer each).
var admissionPolicies = []schema.GroupVersionResource{
	{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicies"},
	{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingadmissionpolicies"},
}

// policyParams are the collections the cluster's admission policies take
// their params from. The replay's policy plugins list and watch them
// once they load a policy, which may be after the replay the Recorder
// watched had synced; a snapshot holding only some of them would leave
// such a policy unevaluated (the replay says unknown). Secrets stay
// withheld.
func policyParams(ctx context.Context, dyn dynamic.Interface, index map[schema.GroupVersionResource]int, resources []Resource) ([]schema.GroupVersionResource, error) {
	byKind := map[schema.GroupVersionKind]schema.GroupVersionResource{}
	for gvr, i := range index {
		byKind[gvr.GroupVersion().WithKind(resources[i].Kind)] = gvr
	}
	var out []schema.GroupVersionResource
	for _, p := range admissionPolicies {
		if _, ok := index[p]; !ok {
			continue // not served by this cluster
		}
		l, err := dyn.Resource(p).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list %s, for the collections their params live in: %w (kproxy snapshot needs list on what the replay reads; see the README's ClusterRole)", p.Resource, err)
		}
		for _, it := range l.Items {
			apiVersion, _, _ := unstructured.NestedString(it.Object, "spec", "paramKind", "apiVersion")
			kind, _, _ := unstructured.NestedString(it.Object, "spec", "paramKind", "kind")
			gv, err := schema.ParseGroupVersion(apiVersion)
			if kind == "" || err != nil {
				continue
			}
			if gvr, ok := byKind[gv.WithKind(kind)]; ok {
				out = append(out, gvr)
			}
		}
	}
	return out, nil
}

func dedupe(in []schema.GroupVersionResource) []schema.GroupVersionResource {
	seen := map[schema.GroupVersionResource]bool{}
	var out []schema.GroupVersionResource
	for _, g := range in {
		if !seen[g] {
			seen[g] = true
			out = append(out, g)
		}
	}
	return out
}

func hasObject(items []map[string]any, ref ObjectRef) bool {
	for _, it := range items {
		u := unstructured.Unstructured{Object: it}
		if u.GetName() == ref.Name && u.GetNamespace() == ref.Namespace {
			return true
		}
	}
	return false
}

func resourceName(gvr schema.GroupVersionResource) string {
	if gvr.Group == "" {
		return gvr.Resource + " (" + gvr.Version + ")"
	}
	return gvr.Resource + "." + gvr.Group + " (" + gvr.Version + ")"
}

func fileName(gvr schema.GroupVersionResource) string {
	g := gvr.Group
	if g == "" {
		g = "core"
	}
	return filepath.Join(g, gvr.Version, gvr.Resource+".yaml")
}

func writeList(p string, items []map[string]any) error {
	sort.Slice(items, func(i, j int) bool {
		a, b := unstructured.Unstructured{Object: items[i]}, unstructured.Unstructured{Object: items[j]}
		if a.GetNamespace() != b.GetNamespace() {
			return a.GetNamespace() < b.GetNamespace()
		}
		return a.GetName() < b.GetName()
	})
	if items == nil {
		items = []map[string]any{}
	}
	b, err := yaml.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, b, 0o644)
}

func takeDocs(ctx context.Context, hc *http.Client, host string, gvs []string, extra []DocRef) ([]Doc, error) {
	refs := []DocRef{{Path: "/"}, {Path: "/version"}, {Path: "/api"}, {Path: "/apis"},
		{Path: "/api", Accept: aggregatedDiscovery}, {Path: "/apis", Accept: aggregatedDiscovery}, {Path: "/openapi/v3"}}
	for _, gv := range gvs {
		if strings.Contains(gv, "/") {
			refs = append(refs, DocRef{Path: "/apis/" + gv})
		} else {
			refs = append(refs, DocRef{Path: "/api/" + gv})
		}
	}
	refs = append(refs, extra...)
	seen := map[DocRef]bool{}
	var docs []Doc
	host = strings.TrimSuffix(host, "/")
	for _, r := range refs {
		if seen[r] {
			continue
		}
		seen[r] = true
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, host+r.Path, nil)
		if err != nil {
			return nil, err
		}
		if r.Accept != "" {
			req.Header.Set("Accept", r.Accept)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", r.Path, err)
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", r.Path, err)
		}
		docs = append(docs, Doc{Path: r.Path, Accept: r.Accept, Status: resp.StatusCode,
			ContentType: resp.Header.Get("Content-Type"), ETag: resp.Header.Get("ETag"),
			LastModified: resp.Header.Get("Last-Modified"), CacheControl: resp.Header.Get("Cache-Control"), Body: string(body)})
	}
	return docs, nil
}

// getOnly refuses every request but GET: taking a snapshot only reads.
type getOnly struct{ rt http.RoundTripper }

func (g getOnly) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodGet {
		return nil, fmt.Errorf("kproxy snapshot only reads: refused %s %s", r.Method, r.URL.Path)
	}
	return g.rt.RoundTrip(r)
}

// Recorder watches what a client reads: the collections it lists and
// watches (what the replay's informers need) and the other documents it
// GETs. Wrap the replay's client config with it while it syncs.
type Recorder struct {
	mu    sync.Mutex
	colls map[schema.GroupVersionResource]bool
	docs  map[DocRef]bool
	info  *apirequest.RequestInfoFactory
}

// NewRecorder is an empty recorder.
func NewRecorder() *Recorder {
	return &Recorder{colls: map[schema.GroupVersionResource]bool{}, docs: map[DocRef]bool{},
		info: newRequestInfoFactory()}
}

// Wrap records every request of rt.
func (rec *Recorder) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		rec.observe(r)
		return rt.RoundTrip(r)
	})
}

func (rec *Recorder) observe(r *http.Request) {
	if r.Method != http.MethodGet {
		return
	}
	info, err := rec.info.NewRequestInfo(r)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	switch {
	case err == nil && info.IsResourceRequest && (info.Verb == "list" || info.Verb == "watch") && info.Subresource == "":
		rec.colls[schema.GroupVersionResource{Group: info.APIGroup, Version: info.APIVersion, Resource: info.Resource}] = true
	case err == nil && !info.IsResourceRequest:
		p := r.URL.Path
		if r.URL.RawQuery != "" {
			p += "?" + r.URL.RawQuery
		}
		rec.docs[DocRef{Path: p, Accept: r.Header.Get("Accept")}] = true
	}
}

// Collections are the collections listed or watched so far.
func (rec *Recorder) Collections() []schema.GroupVersionResource {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	out := make([]schema.GroupVersionResource, 0, len(rec.colls))
	for g := range rec.colls {
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// Docs are the other documents read so far.
func (rec *Recorder) Docs() []DocRef {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	out := make([]DocRef, 0, len(rec.docs))
	for d := range rec.docs {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path+out[i].Accept < out[j].Path+out[j].Accept })
	return out
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
