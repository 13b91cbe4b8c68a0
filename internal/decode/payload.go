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

// EncryptionInfo describes an encrypted-at-rest prefix
// (k8s:enc:<provider>:<version>:<key name>:) and, for KMS, the envelope
// after it.
type EncryptionInfo struct {
	Provider string `json:"provider"`
	Version  string `json:"version"`
	// KeyName is the key's name in the EncryptionConfiguration (aescbc,
	// aesgcm, secretbox) or the KMS provider's name (kms).
	KeyName string `json:"keyName"`
	// KMS describes the envelope of a KMS-encrypted value, without its
	// secret bytes; nil for the other providers.
	KMS *KMSEnvelope `json:"kms,omitempty"`
}

var (
	payloadCodecs = serializer.NewCodecFactory(payloadScheme)
	cborDecoder   = cbor.NewSerializer(payloadScheme, payloadScheme)
)

// Payload decodes any Kubernetes payload: an API request or response body
// or an etcd value, in JSON, YAML, protobuf or CBOR, into an object. The
// meta.k8s.io kinds the apiserver answers other shapes with (Table,
// PartialObjectMetadata, Status) decode to typed objects. An encrypted
// etcd value is recognized and described (provider, key name, the KMS
// envelope) but not decrypted: see Decrypter.
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

// EncryptionPrefix is the "k8s:enc:<provider>:<version>:<key name>:"
// prefix of a value encrypted at rest, or "k8s:enc:" when the value is cut
// short before it ends (the one parser of the prefix, in kproxy).
func EncryptionPrefix(v []byte) string {
	n := 0
	// As far as parseEncryption reads: a long key name is still a prefix.
	for i, c := range v[:min(len(v), 512)] {
		if c == ':' {
			if n++; n == 5 {
				return string(v[:i+1])
			}
		}
	}
	return encryptedPrefix
}

// IsEncrypted reports a value stored encrypted at rest.
func IsEncrypted(v []byte) bool { return bytes.HasPrefix(v, []byte(encryptedPrefix)) }

func parseEncryption(b []byte) (EncryptionInfo, error) {
	// k8s:enc:<provider>:<version>:<key name>:<ciphertext>
	parts := strings.SplitN(string(b[len(encryptedPrefix):min(len(b), 512)]), ":", 4)
	if len(parts) < 4 {
		return EncryptionInfo{}, errors.New("the value starts with k8s:enc: but has no provider:version:key: prefix")
	}
	info := EncryptionInfo{Provider: parts[0], Version: parts[1], KeyName: parts[2]}
	prefix := encryptedPrefix + strings.Join(parts[:3], ":") + ":"
	ciphertext := b[len(prefix):]
	var err error
	switch info.Provider + ":" + info.Version {
	case "aescbc:v1", "aesgcm:v1", "secretbox:v1":
		err = checkCiphertextSize(info.Provider, ciphertext)
	case "kms:v1":
		info.KMS, err = parseKMSv1(ciphertext)
	case "kms:v2":
		info.KMS, err = parseKMSv2(ciphertext)
	default:
		return info, fmt.Errorf("unknown encryption prefix %q: kproxy knows k8s:enc:aescbc:v1:, k8s:enc:aesgcm:v1:, k8s:enc:secretbox:v1:, k8s:enc:kms:v1: and k8s:enc:kms:v2: (identity values are stored unprefixed)", prefix)
	}
	if err != nil {
		return info, fmt.Errorf("value encrypted with %s (%s): %w", info.describe(), prefix, err)
	}
	return info, nil
}

// describe names the provider and key: "aescbc key cbc-key-1", "KMS v2
// provider vault".
func (e EncryptionInfo) describe() string {
	if e.Provider == "kms" {
		return fmt.Sprintf("KMS %s provider %s", e.Version, e.KeyName)
	}
	return fmt.Sprintf("%s key %s", e.Provider, e.KeyName)
}

// checkCiphertextSize rejects a value too short to hold what the provider
// writes: aescbc an IV and whole 16-byte blocks, aesgcm a 12-byte nonce
// and a 16-byte tag, secretbox a 24-byte nonce and a 16-byte tag.
func checkCiphertextSize(provider string, c []byte) error {
	switch provider {
	case "aescbc":
		if len(c) < 32 || len(c)%16 != 0 {
			return fmt.Errorf("the ciphertext is %d bytes; AES-CBC writes a 16-byte IV and whole 16-byte blocks: the value is truncated or corrupt", len(c))
		}
	case "aesgcm":
		if len(c) < 12+16 {
			return fmt.Errorf("the ciphertext is %d bytes, shorter than AES-GCM's 12-byte nonce and 16-byte tag: the value is truncated", len(c))
		}
	case "secretbox":
		if len(c) < 24+16 {
			return fmt.Errorf("the ciphertext is %d bytes, shorter than secretbox's 24-byte nonce and 16-byte tag: the value is truncated", len(c))
		}
	}
	return nil
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
		return json.MarshalIndent(map[string]any{"encrypted": d.Encryption, "note": d.Encryption.needed()}, "", "  ")
	}
	if u, ok := d.Object.(*unstructured.Unstructured); ok {
		return json.MarshalIndent(u.Object, "", "  ")
	}
	obj := d.Object.DeepCopyObject()
	obj.GetObjectKind().SetGroupVersionKind(d.GVK)
	return json.MarshalIndent(obj, "", "  ")
}
