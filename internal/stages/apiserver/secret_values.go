package apiserver

import (
	"encoding/base64"
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	api "k8s.io/kubernetes/pkg/apis/core"

	"github.com/kproxy/kproxy/internal/record"
)

// noteSecrets keeps the secret values of the objects admission is given
// (record.SecretStrings: a Secret's data, a ConfigMap's kubeconfigs and
// Helm release): a policy's or a webhook's message may quote them in
// free text, and the request's body alone may not carry them. The object
// a patch or a delete is about is the stored one (probe AG: a label
// patch of a Secret refused by a policy quoting its data, the value in
// the record and in Jaeger); a protobuf body is an object here too.
func (r *Run) noteSecrets(a admission.Attributes) {
	var values []string
	for _, o := range []runtime.Object{a.GetObject(), a.GetOldObject()} {
		values = append(values, secretValuesOf(o)...)
	}
	if len(values) == 0 {
		return
	}
	r.mu.Lock()
	r.secretValues = append(r.secretValues, values...)
	r.mu.Unlock()
}

// SecretValues are the secret values of the objects the run's admission
// was given (noteSecrets).
func (r *Run) SecretValues() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.secretValues...)
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
		resource, name, body = "configmaps", x.Name, map[string]any{"kind": "ConfigMap", "data": x.Data, "binaryData": bytesMap(x.BinaryData)}
	case *corev1.ConfigMap:
		resource, name, body = "configmaps", x.Name, map[string]any{"kind": "ConfigMap", "data": x.Data, "binaryData": bytesMap(x.BinaryData)}
	default:
		return nil
	}
	j, err := json.Marshal(body)
	if err != nil {
		return nil
	}
	return record.SecretStrings(resource, name, j)
}

// bytesMap is m as JSON has it: each value base64-encoded.
func bytesMap(m map[string][]byte) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = base64.StdEncoding.EncodeToString(v)
	}
	return out
}
