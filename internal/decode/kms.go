package decode

import (
	"encoding/binary"
	"fmt"
	"sort"

	"google.golang.org/protobuf/proto"
	"k8s.io/apiserver/pkg/storage/value/encrypt/envelope/kmsv2"
	kmstypes "k8s.io/apiserver/pkg/storage/value/encrypt/envelope/kmsv2/v2"
)

// KMSEnvelope is what a KMS-encrypted etcd value says about itself, read
// without the plugin. Secret bytes (the encrypted DEK, the annotations'
// values, the data) are only counted, never shown.
type KMSEnvelope struct {
	// KeyID is the KMS key the plugin encrypted the DEK (source) with
	// (kms v2; kms v1 values do not record it).
	KeyID string `json:"keyID,omitempty"`
	// AnnotationKeys are the keys of the annotations the plugin returned
	// with the encrypted DEK source (kms v2), sorted.
	AnnotationKeys []string `json:"annotationKeys,omitempty"`
	// EncryptedDEKSourceType is how the DEK derives from the decrypted DEK
	// source (kms v2): AES_GCM_KEY (it is the DEK) or
	// HKDF_SHA256_XNONCE_AES_GCM_SEED (a seed, one DEK per write).
	EncryptedDEKSourceType string `json:"encryptedDEKSourceType,omitempty"`
	// EncryptedDEKBytes is the size of the encrypted DEK (kms v1) or DEK
	// source (kms v2).
	EncryptedDEKBytes int `json:"encryptedDEKBytes"`
	// EncryptedDataBytes is the size of the encrypted object.
	EncryptedDataBytes int `json:"encryptedDataBytes"`
}

// parseKMSv2 reads the EncryptedObject protobuf kms v2 stores after
// k8s:enc:kms:v2:<name>:, checked as the apiserver checks it.
func parseKMSv2(b []byte) (*KMSEnvelope, error) {
	o := &kmstypes.EncryptedObject{}
	if err := proto.Unmarshal(b, o); err != nil {
		return nil, fmt.Errorf("the KMS v2 EncryptedObject does not parse (truncated or corrupt?): %w", err)
	}
	if err := kmsv2.ValidateEncryptedObject(o); err != nil {
		return nil, fmt.Errorf("the KMS v2 EncryptedObject is invalid (truncated or corrupt?): %w", err)
	}
	e := &KMSEnvelope{KeyID: o.KeyID, EncryptedDEKSourceType: o.EncryptedDEKSourceType.String(),
		EncryptedDEKBytes: len(o.EncryptedDEKSource), EncryptedDataBytes: len(o.EncryptedData)}
	for k := range o.Annotations {
		e.AnnotationKeys = append(e.AnnotationKeys, k)
	}
	sort.Strings(e.AnnotationKeys)
	return e, nil
}

// parseKMSv1 reads what kms v1 stores after k8s:enc:kms:v1:<name>:, a
// 2-byte big-endian length, the encrypted DEK, then the data encrypted
// with the DEK (AES-GCM or AES-CBC).
func parseKMSv1(b []byte) (*KMSEnvelope, error) {
	if len(b) < 2 {
		return nil, fmt.Errorf("the KMS v1 value is %d bytes, too short for the encrypted DEK's length: the value is truncated", len(b))
	}
	n := int(binary.BigEndian.Uint16(b))
	if n == 0 || len(b) < 2+n+1 {
		return nil, fmt.Errorf("the KMS v1 value holds %d bytes after the length, the encrypted DEK alone is %d: the value is truncated", len(b)-2, n)
	}
	return &KMSEnvelope{EncryptedDEKBytes: n, EncryptedDataBytes: len(b) - 2 - n}, nil
}

// needed says what decrypting a value encrypted this way takes.
func (e EncryptionInfo) needed() string {
	if e.Provider == "kms" {
		return fmt.Sprintf("encrypted at rest by %s: to decrypt it, give the apiserver's --encryption-provider-config "+
			"and run kproxy where that provider's plugin socket is reachable (kproxy decrypts KMS values through the plugin)", e.describe())
	}
	n := fmt.Sprintf("encrypted at rest with %s: to decrypt it, give the apiserver's --encryption-provider-config (it holds the key)", e.describe())
	if e.Provider == "aesgcm" {
		n += " and the value's exact etcd key (--key): AES-GCM authenticates it"
	}
	return n
}
