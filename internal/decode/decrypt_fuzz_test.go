package decode

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"
	kmstypes "k8s.io/apiserver/pkg/storage/value/encrypt/envelope/kmsv2/v2"
	"sigs.k8s.io/yaml"
)

var (
	fuzzDecrypterOnce sync.Once
	fuzzDecrypter     *Decrypter
	fuzzDecrypterErr  error
)

// goldenConfigDecrypter is the e2e apiserver's encryption configuration
// (aescbc, aesgcm and secretbox keys; its KMS plugin is not running, so
// its values fail to decrypt saying so), loaded once per process.
func goldenConfigDecrypter(t testing.TB) *Decrypter {
	fuzzDecrypterOnce.Do(func() {
		fuzzDecrypter, fuzzDecrypterErr = LoadDecrypter(context.Background(), filepath.Join(etcdGoldenDir, "encryption-config.yaml"))
	})
	if fuzzDecrypterErr != nil {
		t.Fatal(fuzzDecrypterErr)
	}
	return fuzzDecrypter
}

// FuzzEncryptedValue reads arbitrary bytes as an etcd value, with the key
// it is stored under. It checks that describing a value encrypted at rest
// never panics and agrees with EncryptionPrefix (the other parser of the
// prefix); that a KMS envelope's sizes fit in the value; and that
// decrypting it with the apiserver's own transformers (aescbc, aesgcm,
// secretbox keys) never panics, returns a value that is not encrypted,
// and leaves values that are not encrypted as they are.
func FuzzEncryptedValue(f *testing.F) {
	b, err := os.ReadFile(filepath.Join(etcdGoldenDir, "manifest.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	var m struct{ Entries []goldenValue }
	if err := yaml.Unmarshal(b, &m); err != nil {
		f.Fatal(err)
	}
	for _, g := range m.Entries {
		v, err := os.ReadFile(filepath.Join(etcdGoldenDir, g.Value))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(g.Key, v)
		if IsEncrypted(v) {
			f.Add(g.Key, v[:len(v)/2])
			f.Add("", v)
		}
	}
	for _, v := range []string{"k8s:enc:", "k8s:enc:aescbc:v1:k1:", "k8s:enc:aesgcm:v1:gcm-key-1:" + strings.Repeat("\x00", 28),
		"k8s:enc:secretbox:v1:sb-key-1:" + strings.Repeat("s", 40), "k8s:enc:aescbc:v1:cbc-key-1:" + strings.Repeat("\x10", 48),
		"k8s:enc:kms:v1:old:\x00\x04dekk" + strings.Repeat("d", 16), "k8s:enc:kms:v1:old:\xff\xff", "k8s:enc:kms:v2:test-kms:",
		"k8s:enc:kms:v2:test-kms:\x0a\x01k\x12\x01d\x1a\x01e", "k8s:enc:identity:v1:x:", "k8s:enc:" + strings.Repeat(":", 300),
		"k8s:enc:aescbc:v1:" + strings.Repeat("k", 300) + ":" + strings.Repeat("c", 32)} {
		f.Add("/registry/secrets/ns/s", []byte(v))
	}
	f.Fuzz(func(t *testing.T, key string, v []byte) {
		dec := goldenConfigDecrypter(t)
		ctx := context.Background()
		d, err := Payload(v)
		if IsEncrypted(v) {
			if d == nil || d.Format != Encrypted {
				t.Fatalf("Payload(%q) is %+v (%v), not an encrypted value", v, d, err)
			}
			if err == nil {
				checkEncryptionInfo(t, v, d.Encryption)
				if _, err := d.JSON(); err != nil {
					t.Fatalf("the description of %q does not render: %v", v, err)
				}
			}
		}
		plain, err := dec.Decrypt(ctx, key, v)
		switch {
		case !IsEncrypted(v) && (err != nil || !bytes.Equal(plain, v)):
			t.Fatalf("Decrypt changed a value that is not encrypted: %q -> %q, %v", v, plain, err)
		case err == nil && IsEncrypted(plain):
			t.Fatalf("Decrypt(%q) returns a value still encrypted: %q", v, plain)
		}
		_, enc, err := DecodeStored(ctx, nil, key, v)
		if IsEncrypted(v) && enc != nil && !errors.Is(err, ErrNotDecrypted) {
			t.Fatalf("DecodeStored without a decrypter: %v, want ErrNotDecrypted", err)
		}
		_, _, _ = DecodeStored(ctx, dec, key, v)
	})
}

// checkEncryptionInfo holds the description of an encrypted value against
// the value's bytes.
func checkEncryptionInfo(t *testing.T, v []byte, info EncryptionInfo) {
	t.Helper()
	prefix := encryptedPrefix + info.Provider + ":" + info.Version + ":" + info.KeyName + ":"
	if !bytes.HasPrefix(v, []byte(prefix)) {
		t.Fatalf("%q is described as %+v", v, info)
	}
	// EncryptionPrefix reads the first 256 bytes only.
	if got := EncryptionPrefix(v); got != prefix && (len(prefix) <= 256 || got != encryptedPrefix) {
		t.Fatalf("EncryptionPrefix(%q) = %q, Payload read %q", v, got, prefix)
	}
	if (info.KMS != nil) != (info.Provider == "kms") {
		t.Fatalf("%q: provider %s with KMS envelope %+v", v, info.Provider, info.KMS)
	}
	if k := info.KMS; k != nil && (k.EncryptedDEKBytes <= 0 || k.EncryptedDataBytes < 0 || k.EncryptedDEKBytes+k.EncryptedDataBytes > len(v)-len(prefix)) {
		t.Fatalf("%q: the KMS envelope %+v does not fit in the value", v, k)
	}
}

// FuzzKMSv2Envelope builds KMS v2 values from their parts. It checks
// that the description of a value depends on its secret bytes (the
// encrypted DEK source, the annotations' values, the encrypted data) only
// through their sizes: the same value with every secret byte changed is
// described, or refused, identically; and that what is described is what
// was written.
func FuzzKMSv2Envelope(f *testing.F) {
	f.Add("test-kms", "kproxy-test-kms-key-1", int32(1), bytes.Repeat([]byte{7}, 60), bytes.Repeat([]byte{9}, 979), "version.kms.kproxy.test", []byte("1"))
	f.Add("k", "key", int32(0), []byte{1}, []byte{2}, "", []byte(nil))
	f.Add("k", "", int32(2), []byte(nil), []byte{2}, "not a domain", []byte("x"))
	f.Add("k", strings.Repeat("i", 1025), int32(0), bytes.Repeat([]byte{1}, 1025), []byte{2}, "a.b", bytes.Repeat([]byte{3}, 33<<10))
	f.Fuzz(func(t *testing.T, name, keyID string, sourceType int32, dek, data []byte, annKey string, annVal []byte) {
		if strings.Contains(name, ":") {
			t.Skip("the name ends the prefix at its first colon: the rest would be the envelope")
		}
		value := func(flip byte) []byte {
			o := &kmstypes.EncryptedObject{KeyID: keyID, EncryptedDEKSource: xor(dek, flip), EncryptedData: xor(data, flip),
				EncryptedDEKSourceType: kmstypes.EncryptedDEKSourceType(sourceType)}
			if annKey != "" {
				o.Annotations = map[string][]byte{annKey: xor(annVal, flip)}
			}
			b, err := proto.Marshal(o)
			if err != nil {
				t.Skip(err) // a key ID or annotation key that is not UTF-8
			}
			return append([]byte("k8s:enc:kms:v2:"+name+":"), b...)
		}
		describe := func(v []byte) string {
			d, err := Payload(v)
			if err != nil {
				return "error: " + err.Error()
			}
			j, err := d.JSON()
			if err != nil {
				t.Fatalf("the description of %q does not render: %v", v, err)
			}
			return string(j)
		}
		v := value(0)
		got, flipped := describe(v), describe(value(0x5a))
		if got != flipped {
			t.Fatalf("the description depends on secret bytes:\n%s\nwith every secret byte changed:\n%s", got, flipped)
		}
		d, err := Payload(v)
		if err != nil {
			return
		}
		checkEncryptionInfo(t, v, d.Encryption)
		k := d.Encryption.KMS
		var keys []string
		if annKey != "" {
			keys = []string{annKey}
		}
		if d.Encryption.KeyName != name || k.KeyID != keyID || k.EncryptedDEKBytes != len(dek) || k.EncryptedDataBytes != len(data) || !reflect.DeepEqual(k.AnnotationKeys, keys) {
			t.Fatalf("%q is described as %+v %+v", v, d.Encryption, *k)
		}
	})
}

// xor is b with every byte xored with x (a copy; nil stays nil).
func xor(b []byte, x byte) []byte {
	if b == nil {
		return nil
	}
	out := make([]byte, len(b))
	for i, c := range b {
		out[i] = c ^ x
	}
	return out
}
