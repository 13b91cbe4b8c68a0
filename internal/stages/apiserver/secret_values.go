package apiserver

import (
	"encoding/base64"
	"encoding/json"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	api "k8s.io/kubernetes/pkg/apis/core"

	"github.com/kproxy/kproxy/internal/record"
)

// noteSecrets keeps the Secrets and ConfigMaps admission is given, for
// their secret values (record.SecretStrings: a Secret's data, a
// ConfigMap's kubeconfigs and Helm release), which a policy's or a
// webhook's message may quote in free text where the request's body
// does not carry them. The object a patch or a delete is about is the
// stored one (probe AG: a label patch of a Secret refused by a policy
// quoting its data, the value in the record and in Jaeger); a protobuf
// body is an object here too. Only kept: the values are found when
// asked for (a refusal, a warning), not on every write's replay.
func (r *Run) noteSecrets(a admission.Attributes) {
	for _, o := range []runtime.Object{a.GetObject(), a.GetOldObject()} {
		switch o.(type) {
		case *api.Secret, *corev1.Secret, *api.ConfigMap, *corev1.ConfigMap:
		default:
			continue
		}
		r.mu.Lock()
		if !slices.Contains(r.secretObjects, o) {
			r.secretObjects = append(r.secretObjects, o)
		}
		r.mu.Unlock()
	}
}

// SecretValues are the secret values of the objects the run's admission
// was given (noteSecrets), found once, when first asked for.
func (r *Run) SecretValues() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.secretsFound {
		r.secretsFound = true
		for _, o := range r.secretObjects {
			r.secretValues = append(r.secretValues, secretValuesOf(o)...)
		}
		r.secretObjects = nil
	}
	return r.secretValues
}

// secretValuesOf are the secret values of a Secret or a ConfigMap, as
// the apiserver's code holds it (internal or v1), as record.SecretStrings
// finds them in a body.
func secretValuesOf(o runtime.Object) []string {
	var resource, name string
	var body map[string]any
	switch x := o.(type) {
	case *api.Secret:
		resource, name, body = "secrets", x.Name, map[string]any{"kind": "Secret", "data": bytesMap(x.Data)}
	case *corev1.Secret:
		resource, name, body = "secrets", x.Name, map[string]any{"kind": "Secret", "data": bytesMap(x.Data), "stringData": x.StringData}
	case *api.ConfigMap:
		if !configMapMayHold(x.Name, x.Labels, x.Data, x.BinaryData) {
			return nil
		}
		resource, name, body = "configmaps", x.Name, map[string]any{"kind": "ConfigMap", "data": x.Data, "binaryData": bytesMap(x.BinaryData),
			"metadata": map[string]any{"labels": x.Labels}}
	case *corev1.ConfigMap:
		if !configMapMayHold(x.Name, x.Labels, x.Data, x.BinaryData) {
			return nil
		}
		resource, name, body = "configmaps", x.Name, map[string]any{"kind": "ConfigMap", "data": x.Data, "binaryData": bytesMap(x.BinaryData),
			"metadata": map[string]any{"labels": x.Labels}}
	default:
		return nil
	}
	j, err := json.Marshal(body)
	if err != nil {
		return nil
	}
	return record.SecretStrings(resource, name, j)
}

// configMapMayHold is record.ConfigMapMayHoldSecrets for a decoded
// ConfigMap: most hold no kubeconfig or Helm release, and are not
// marshalled and walked for nothing.
func configMapMayHold(name string, labels, data map[string]string, bin map[string][]byte) bool {
	if strings.Contains(name, "helm") || labels["owner"] == "helm" || len(bin) > 0 {
		return true
	}
	for _, v := range data {
		if strings.Contains(v, "users") {
			return true
		}
	}
	return false
}

// bytesMap is m as JSON has it: each value base64-encoded.
func bytesMap(m map[string][]byte) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = base64.StdEncoding.EncodeToString(v)
	}
	return out
}
