package apiserver

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
)

// DefaultObject applies the defaults the apiserver applies to a built-in
// object when it is created (a ValidatingAdmissionPolicy's empty
// selectors, a RoleBinding's apiGroup, ...): an overlay's objects must
// look to the replay as they would once stored. Objects of kinds the
// apiserver does not build in (custom resources) are returned unchanged.
func DefaultObject(obj map[string]any) (map[string]any, error) {
	u := &unstructured.Unstructured{Object: obj}
	gvk := u.GroupVersionKind()
	typed, err := legacyscheme.Scheme.New(gvk)
	if err != nil {
		return obj, nil //nolint:nilerr // not a built-in kind: nothing to default
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, typed); err != nil {
		return nil, fmt.Errorf("%s %s: %w", gvk.Kind, u.GetName(), err)
	}
	legacyscheme.Scheme.Default(typed)
	out, err := runtime.DefaultUnstructuredConverter.ToUnstructured(typed)
	if err != nil {
		return nil, err
	}
	out["apiVersion"], out["kind"] = gvk.GroupVersion().String(), gvk.Kind
	return out, nil
}
