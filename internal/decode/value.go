package decode

import (
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// Value decodes a request body in any encoding the apiserver accepts
// (JSON, YAML, protobuf, CBOR; patches are JSON or YAML) into plain JSON
// values: what a capture records of it, redacted, and where a body's
// secret values are looked for (a protobuf Secret's had been looked for
// as YAML, found none, and a policy quoting them reached records: a
// probe).
func Value(body []byte) (any, error) {
	f, err := Detect(body)
	if err != nil {
		return nil, err
	}
	switch f {
	case JSON, YAML:
		j, err := yaml.YAMLToJSON(body)
		if err != nil {
			return nil, fmt.Errorf("the body is not JSON or YAML: %w", err)
		}
		var v any
		if err := json.Unmarshal(j, &v); err != nil {
			return nil, fmt.Errorf("the body is not JSON or YAML: %w", err)
		}
		return v, nil
	case CBOR:
		// As the body says it, unknown fields too (a typed object
		// drops them: a Strict 400's record did not show the field it
		// refused; probe AH).
		u := &unstructured.Unstructured{}
		if _, _, err := cborDecoder.Decode(body, nil, u); err != nil {
			return nil, fmt.Errorf("the CBOR body does not decode: %w", err)
		}
		return u.Object, nil
	}
	d, err := Payload(body)
	if err != nil || d.Object == nil {
		return nil, fmt.Errorf("the %s body does not decode: %v", f, err)
	}
	return runtime.DefaultUnstructuredConverter.ToUnstructured(d.Object)
}
