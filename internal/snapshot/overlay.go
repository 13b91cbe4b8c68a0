package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// OverlayAnnotation on an overlay object: "absent" removes the object
// from the snapshot (a webhook removed, a binding deleted).
const OverlayAnnotation = "kproxy.dev/overlay"

// Apply applies an overlay: every manifest (*.yaml, *.yml, *.json;
// several documents and Lists allowed) in dir, or the file dir names.
// Objects are added or replaced by apiVersion, kind, namespace and name
// in every version of their resource the snapshot holds; annotated
// kproxy.dev/overlay: absent, removed. defaults, when given, applies the
// apiserver's defaults first. It returns one line per change.
// Defaulter applies the apiserver's defaults to an object, as creating it
// would (nil: objects are taken as written).
type Defaulter func(map[string]any) (map[string]any, error)

func (s *Snapshot) Apply(dir string, defaults Defaulter) ([]string, error) {
	var files []string
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("overlay %s: %w", dir, err)
	}
	if st.IsDir() {
		err = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml") || strings.HasSuffix(p, ".json")) {
				files = append(files, p)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("overlay %s: %w", dir, err)
		}
	} else {
		files = []string{dir}
	}
	sort.Strings(files)
	if len(files) == 0 {
		return nil, fmt.Errorf("overlay %s has no manifests (*.yaml, *.yml, *.json)", dir)
	}
	var changes []string
	var errs []error
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("overlay %s: %w", f, err))
			continue
		}
		objs, err := decodeManifests(b)
		if err != nil {
			errs = append(errs, fmt.Errorf("overlay %s: %w", f, err))
			continue
		}
		for i, obj := range objs {
			if defaults != nil && !isAbsent(obj) {
				if obj, err = defaults(obj); err != nil {
					errs = append(errs, fmt.Errorf("overlay %s, document %d: %w", f, i+1, err))
					continue
				}
			}
			c, err := s.applyObject(obj)
			if err != nil {
				errs = append(errs, fmt.Errorf("overlay %s, document %d: %w", f, i+1, err))
				continue
			}
			changes = append(changes, c)
		}
	}
	return changes, errors.Join(errs...)
}

func isAbsent(obj map[string]any) bool {
	md, _ := obj["metadata"].(map[string]any)
	ann, _ := md["annotations"].(map[string]any)
	return ann[OverlayAnnotation] == "absent"
}

func decodeManifests(b []byte) ([]map[string]any, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var out []map[string]any
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if err == io.EOF {
				return out, nil
			}
			return nil, err
		}
		if obj == nil {
			continue
		}
		if kind, _ := obj["kind"].(string); strings.HasSuffix(kind, "List") {
			items, _ := obj["items"].([]any)
			for _, it := range items {
				if m, ok := it.(map[string]any); ok {
					out = append(out, m)
				}
			}
			continue
		}
		out = append(out, obj)
	}
}

func (s *Snapshot) applyObject(obj map[string]any) (string, error) {
	apiVersion, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	if apiVersion == "" || kind == "" {
		return "", errors.New("an object without apiVersion and kind")
	}
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return "", fmt.Errorf("apiVersion %q: %w", apiVersion, err)
	}
	md, _ := obj["metadata"].(map[string]any)
	if md == nil {
		return "", fmt.Errorf("%s without metadata.name", kind)
	}
	name, _ := md["name"].(string)
	ns, _ := md["namespace"].(string)
	if name == "" {
		return "", fmt.Errorf("%s without metadata.name", kind)
	}
	// Every version of the resource the snapshot holds gets the object
	// (the replay may read either); the versions differ in apiVersion
	// only for the kinds overlays change (policies, bindings, RBAC).
	var targets []int
	for i, r := range s.Manifest.Resources {
		if r.Group == gv.Group && r.Kind == kind && !strings.Contains(r.Resource, "/") && r.Collected != CollectedWithheld {
			targets = append(targets, i)
		}
	}
	if len(targets) == 0 {
		if kind == "Secret" {
			return "", errors.New("a Secret: Secrets are never part of a snapshot, and an overlay cannot add one")
		}
		return "", fmt.Errorf("the snapshot's cluster does not serve %s %s: check apiVersion and kind (a custom resource needs its CRD in the cluster when the snapshot is taken)", apiVersion, kind)
	}
	ann, _ := md["annotations"].(map[string]any)
	absent := ann[OverlayAnnotation] == "absent"
	where := name
	if ns != "" {
		where = ns + "/" + name
	}
	if absent {
		for _, i := range targets {
			r := s.Manifest.Resources[i]
			delete(s.collection(r), objKey(ns, name))
			if r.Collected == CollectedNamed && !slices.Contains(r.Absent, objKey(ns, name)) {
				s.Manifest.Resources[i].Absent = append(s.Manifest.Resources[i].Absent, objKey(ns, name))
			}
		}
		return fmt.Sprintf("removed %s %s", kind, where), nil
	}
	s.rv++
	md["resourceVersion"] = s.ResourceVersion()
	if _, ok := md["uid"]; !ok {
		md["uid"] = fmt.Sprintf("kproxy-overlay-%d", s.rv)
	}
	if _, ok := md["creationTimestamp"]; !ok {
		md["creationTimestamp"] = s.Manifest.Taken.UTC().Format("2006-01-02T15:04:05Z")
	}
	verb := "added"
	for _, i := range targets {
		r := s.Manifest.Resources[i]
		if _, ok := s.Get(r, ns, name); ok {
			verb = "replaced"
		}
		cp := cloneMap(obj)
		cp["apiVersion"] = r.GroupVersion()
		o, err := newObject(cp)
		if err != nil {
			return "", err
		}
		s.collection(r)[objKey(ns, name)] = o
		if r.Collected == "" {
			s.Manifest.Resources[i].Collected = CollectedNamed
		}
	}
	return fmt.Sprintf("%s %s %s", verb, kind, where), nil
}

func cloneMap(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		if mm, ok := v.(map[string]any); ok {
			v = cloneMap(mm)
		}
		out[k] = v
	}
	return out
}
