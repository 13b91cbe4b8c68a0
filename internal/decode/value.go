package decode

import (
	"encoding/json"
	"fmt"

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
	}
	d, err := Payload(body)
	if err != nil || d.Object == nil {
		return nil, fmt.Errorf("the %s body does not decode: %v", f, err)
	}
	return runtime.DefaultUnstructuredConverter.ToUnstructured(d.Object)
}
