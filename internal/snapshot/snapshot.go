// Package snapshot is what kproxy's replay reads from a cluster, written
// to a directory so the replay can run with no cluster at all (kproxy test
// run --engine local).
//
// # What it holds
//
// A snapshot is a manifest (snapshot.yaml: when and where it was taken,
// the apiserver's mirrored flags, every resource the cluster serves and
// how much of it was collected, and what was left out and why), one List
// file per collected resource under objects/, and the documents the
// apiserver serves about itself (discovery, its version, the OpenAPI
// index) under served/. Which collections it holds is not a hand-kept
// list: `kproxy snapshot` builds the replay against the cluster and
// collects every collection the replay itself lists and watches, and
// those the cluster's admission policies take their params from (the
// policy plugins list them once they load a policy), plus the objects
// the test cases name. Secrets are never written: not their data,
// not their names.
//
// # Serving it
//
// Server answers the replay's reads from a snapshot the way the apiserver
// would (get, list with label and field selectors, watch with the initial
// events and a bookmark, the served documents), read-only. What the
// snapshot does not hold is answered with 503 and a message saying so,
// never with a 404: a read the snapshot cannot answer makes the
// prediction unknown, not confidently wrong.
//
// # Overlays
//
// An overlay is a directory of manifests applied on top (added or
// replaced by apiVersion, kind, namespace and name; removed when
// annotated kproxy.dev/overlay: absent): the what-if of a policy change.
package snapshot

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// APIVersion and Kind of snapshot.yaml.
const (
	APIVersion   = "kproxy.dev/v1alpha1"
	Kind         = "Snapshot"
	ManifestFile = "snapshot.yaml"
)

// How much of a resource a snapshot holds.
const (
	CollectedAll      = "all"      // every object
	CollectedNamed    = "named"    // the objects the cases name (and which of them were absent)
	CollectedWithheld = "withheld" // never written (Secrets): lists are empty, gets unknown
)

// Manifest is snapshot.yaml.
type Manifest struct {
	APIVersion        string    `json:"apiVersion"`
	Kind              string    `json:"kind"`
	Taken             time.Time `json:"taken"`
	Server            string    `json:"server,omitempty"`
	KubernetesVersion string    `json:"kubernetesVersion,omitempty"`
	// ResourceVersion is the highest resourceVersion collected.
	ResourceVersion string `json:"resourceVersion"`
	// APIServerArgs are the apiserver's mirrored flags, as
	// --name=value.
	APIServerArgs []string `json:"apiserverArgs,omitempty"`
	// Resources are every resource the cluster serves.
	Resources []Resource `json:"resources"`
	// LeftOut says what the snapshot does not hold, and why.
	LeftOut []string `json:"leftOut,omitempty"`
}

// Resource is one served resource and how much of it was collected.
type Resource struct {
	Group      string `json:"group,omitempty"`
	Version    string `json:"version"`
	Resource   string `json:"resource"`
	Kind       string `json:"kind"`
	Namespaced bool   `json:"namespaced,omitempty"`
	// Collected is all, named, withheld, or empty (not collected).
	Collected string `json:"collected,omitempty"`
	// File holds the objects (a List), relative to the snapshot.
	File string `json:"file,omitempty"`
	// Absent are the names (namespace/name) asked for that did not exist.
	Absent []string `json:"absent,omitempty"`
}

// GroupVersion is the resource's apiVersion.
func (r Resource) GroupVersion() string {
	if r.Group == "" {
		return r.Version
	}
	return r.Group + "/" + r.Version
}

// Doc is a document the apiserver serves about itself.
type Doc struct {
	Path        string `json:"path"`
	Accept      string `json:"accept,omitempty"`
	Status      int    `json:"status"`
	ContentType string `json:"contentType,omitempty"`
	ETag        string `json:"etag,omitempty"`
	// LastModified and CacheControl are the headers conditional
	// requests and the replay's handlers read.
	LastModified string `json:"lastModified,omitempty"`
	CacheControl string `json:"cacheControl,omitempty"`
	Body         string `json:"body"`
}

// Snapshot is a loaded snapshot.
type Snapshot struct {
	Dir      string
	Manifest Manifest
	Docs     []Doc
	// objects by resource (group/version/resource), then namespace/name.
	objects map[string]map[string]*Object
	rv      uint64
}

// Object is one stored object.
type Object struct {
	Namespace, Name string
	Labels          map[string]string
	Raw             []byte
	parsed          map[string]any
}

func resKey(group, version, resource string) string { return group + "/" + version + "/" + resource }

func objKey(ns, name string) string { return ns + "/" + name }

// Load reads a snapshot directory.
func Load(dir string) (*Snapshot, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		if os.IsNotExist(err) {
			return nil, fmt.Errorf("snapshot %s: no %s there; take one with `kproxy snapshot -o %s`", dir, ManifestFile, dir)
		}
		return nil, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	s := &Snapshot{Dir: dir, objects: map[string]map[string]*Object{}}
	if err := yaml.UnmarshalStrict(b, &s.Manifest); err != nil {
		return nil, fmt.Errorf("snapshot %s: %s: %w", dir, ManifestFile, err)
	}
	if s.Manifest.APIVersion != APIVersion || s.Manifest.Kind != Kind {
		return nil, fmt.Errorf("snapshot %s: %s is %s %s; want %s %s (a snapshot written by kproxy snapshot)", dir, ManifestFile, s.Manifest.APIVersion, s.Manifest.Kind, APIVersion, Kind)
	}
	s.rv, _ = strconv.ParseUint(s.Manifest.ResourceVersion, 10, 64)
	for _, r := range s.Manifest.Resources {
		if r.File == "" {
			continue
		}
		p := filepath.Join(dir, r.File)
		lb, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("snapshot %s: %w", dir, err)
		}
		var list struct {
			Items []map[string]any `json:"items"`
		}
		if err := yaml.Unmarshal(lb, &list); err != nil {
			return nil, fmt.Errorf("snapshot %s: %s is not a List: %w", dir, r.File, err)
		}
		m := s.collection(r)
		for _, it := range list.Items {
			o, err := newObject(it)
			if err != nil {
				return nil, fmt.Errorf("snapshot %s: %s: %w", dir, r.File, err)
			}
			m[objKey(o.Namespace, o.Name)] = o
		}
	}
	if db, err := os.ReadFile(filepath.Join(dir, "served", "docs.json")); err == nil {
		if err := json.Unmarshal(db, &s.Docs); err != nil {
			return nil, fmt.Errorf("snapshot %s: served/docs.json: %w", dir, err)
		}
	} else if !os.IsNotExist(err) {
		return nil, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	return s, nil
}

func (s *Snapshot) collection(r Resource) map[string]*Object {
	k := resKey(r.Group, r.Version, r.Resource)
	m := s.objects[k]
	if m == nil {
		m = map[string]*Object{}
		s.objects[k] = m
	}
	return m
}

func newObject(it map[string]any) (*Object, error) {
	md, _ := it["metadata"].(map[string]any)
	name, _ := md["name"].(string)
	if name == "" {
		return nil, fmt.Errorf("an object without metadata.name (kind %v)", it["kind"])
	}
	ns, _ := md["namespace"].(string)
	labels := map[string]string{}
	if l, ok := md["labels"].(map[string]any); ok {
		for k, v := range l {
			labels[k], _ = v.(string)
		}
	}
	raw, err := json.Marshal(it)
	if err != nil {
		return nil, err
	}
	return &Object{Namespace: ns, Name: name, Labels: labels, Raw: raw, parsed: it}, nil
}

// Field is the value at a dotted path (metadata.name, spec.nodeName,
// type) as a field selector compares it.
func (o *Object) Field(path string) string {
	var cur any = o.parsed
	for _, p := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return ""
		}
		cur = m[p]
	}
	switch v := cur.(type) {
	case nil:
		return ""
	case string:
		return v
	case bool:
		return strconv.FormatBool(v)
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	default:
		return fmt.Sprint(v)
	}
}

// Resource finds a served resource.
func (s *Snapshot) Resource(group, version, resource string) (Resource, bool) {
	for _, r := range s.Manifest.Resources {
		if r.Group == group && r.Version == version && r.Resource == resource {
			return r, true
		}
	}
	return Resource{}, false
}

// ResourceForKind finds the served resource of an apiVersion and kind.
func (s *Snapshot) ResourceForKind(apiVersion, kind string) (Resource, bool) {
	for _, r := range s.Manifest.Resources {
		if r.GroupVersion() == apiVersion && r.Kind == kind && !strings.Contains(r.Resource, "/") {
			return r, true
		}
	}
	return Resource{}, false
}

// Objects are a resource's objects in namespace ns ("" for all), sorted.
func (s *Snapshot) Objects(r Resource, ns string) []*Object {
	var out []*Object
	for _, o := range s.objects[resKey(r.Group, r.Version, r.Resource)] {
		if ns == "" || o.Namespace == ns {
			out = append(out, o)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// Get is one object.
func (s *Snapshot) Get(r Resource, ns, name string) (*Object, bool) {
	o, ok := s.objects[resKey(r.Group, r.Version, r.Resource)][objKey(ns, name)]
	return o, ok
}

// ResourceVersion is the snapshot's current resourceVersion.
func (s *Snapshot) ResourceVersion() string { return strconv.FormatUint(s.rv, 10) }
