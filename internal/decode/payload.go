package decode

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

// Format is how a payload is encoded.
type Format string

// Payload formats.
const (
	JSON      Format = "json"
	YAML      Format = "yaml"
	Protobuf  Format = "protobuf"
	CBOR      Format = "cbor"
	Encrypted Format = "encrypted"
)

// cborSelfDescribed is the CBOR self-described tag (55799) the apiserver
// puts in front of every CBOR payload.
var cborSelfDescribed = []byte{0xd9, 0xd9, 0xf7}

// encryptedPrefix starts every value encrypted at rest in etcd:
// k8s:enc:<provider>:v1:<key name>: (kms v2: k8s:enc:kms:v2:<name>:).
const encryptedPrefix = "k8s:enc:"

// Detect says how a payload is encoded, from its first bytes.
func Detect(b []byte) (Format, error) {
	t := bytes.TrimLeft(b, " \t\r\n")
	switch {
	case len(t) == 0:
		return "", errors.New("the payload is empty")
	case bytes.HasPrefix(b, []byte(encryptedPrefix)):
		return Encrypted, nil
	case bytes.HasPrefix(b, protobufPrefix):
		return Protobuf, nil
	case bytes.HasPrefix(b, cborSelfDescribed):
		return CBOR, nil
	case t[0] == '{' || t[0] == '[':
		return JSON, nil
	case utf8.Valid(t):
		return YAML, nil
	}
	return "", fmt.Errorf("the payload is not JSON, YAML, protobuf (k8s\\x00), CBOR or an encrypted etcd value (starts with %q)", t[:min(len(t), 8)])
}

// Decoded is a payload turned into an object.
type Decoded struct {
	Format Format
	GVK    schema.GroupVersionKind
	// Object is the typed object when the kind is a built-in one, else
	// *unstructured.Unstructured (custom resources); nil when encrypted.
	Object runtime.Object
	// Encryption names the provider and key of a value encrypted at rest
	// ("aescbc", key "key1"); the object stays nil.
	Encryption EncryptionInfo
}

// EncryptionInfo describes an encrypted-at-rest prefix.
type EncryptionInfo struct {
	Provider string `json:"provider"`
	Version  string `json:"version"`
	KeyName  string `json:"keyName"`
}

var (
	payloadCodecs = serializer.NewCodecFactory(scheme.Scheme)
	cborDecoder   = cbor.NewSerializer(scheme.Scheme, scheme.Scheme)
)

// Payload decodes any Kubernetes payload: an API request or response body
// or an etcd value, in JSON, YAML, protobuf or CBOR, into an object. An
// encrypted etcd value is recognized and described, not decrypted.
func Payload(b []byte) (*Decoded, error) {
	f, err := Detect(b)
	if err != nil {
		return nil, err
	}
	d := &Decoded{Format: f}
	switch f {
	case Encrypted:
		d.Encryption, err = parseEncryption(b)
		return d, err
	case CBOR:
		obj, gvk, err := cborDecoder.Decode(b, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("decode CBOR: %w", err)
		}
		d.Object, d.GVK = obj, *gvk
		return d, nil
	}
	obj, gvk, err := payloadCodecs.UniversalDeserializer().Decode(b, nil, nil)
	if err == nil {
		d.Object, d.GVK = obj, *gvk
		return d, nil
	}
	if f == Protobuf {
		return nil, fmt.Errorf("decode protobuf: %w", err)
	}
	// A kind the scheme does not know (a custom resource): keep it
	// unstructured, as the apiserver stores custom resources as JSON.
	u := &unstructured.Unstructured{}
	j := b
	if f == YAML {
		if j, err = yaml.YAMLToJSON(b); err != nil {
			return nil, fmt.Errorf("decode YAML: %w", err)
		}
	}
	if err := json.Unmarshal(j, &u.Object); err != nil {
		return nil, fmt.Errorf("decode %s: not a Kubernetes object (%v)", f, err)
	}
	if u.GetKind() == "" {
		return nil, fmt.Errorf("decode %s: the object has no kind", f)
	}
	d.Object, d.GVK = u, u.GroupVersionKind()
	return d, nil
}

func parseEncryption(b []byte) (EncryptionInfo, error) {
	// k8s:enc:<provider>:<version>:<key name>:<ciphertext>
	parts := strings.SplitN(string(b[len(encryptedPrefix):min(len(b), 512)]), ":", 4)
	if len(parts) < 4 {
		return EncryptionInfo{}, errors.New("the value starts with k8s:enc: but has no provider:version:key: prefix")
	}
	return EncryptionInfo{Provider: parts[0], Version: parts[1], KeyName: parts[2]}, nil
}

// YAML renders the decoded object as YAML, or the encryption it carries.
func (d *Decoded) YAML() ([]byte, error) {
	j, err := d.JSON()
	if err != nil {
		return nil, err
	}
	return yaml.JSONToYAML(j)
}

// JSON renders the decoded object as JSON, with apiVersion and kind set.
func (d *Decoded) JSON() ([]byte, error) {
	if d.Object == nil {
		return json.MarshalIndent(map[string]any{"encrypted": d.Encryption,
			"note": "encrypted at rest; decrypting it needs the apiserver's --encryption-provider-config, not supported yet"}, "", "  ")
	}
	if u, ok := d.Object.(*unstructured.Unstructured); ok {
		return json.MarshalIndent(u.Object, "", "  ")
	}
	obj := d.Object.DeepCopyObject()
	obj.GetObjectKind().SetGroupVersionKind(d.GVK)
	return json.MarshalIndent(obj, "", "  ")
}
