package decode

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// decrypterFor loads the golden encryption configuration after edit, as
// a file in a temporary directory.
func decrypterFor(t *testing.T, edit func(string) string) *Decrypter {
	t.Helper()
	cfg := edit(string(readGolden(t, etcdGoldenDir, "encryption-config.yaml")))
	path := filepath.Join(t.TempDir(), "encryption-config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dec, err := LoadDecrypter(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	return dec
}

// TestDecryptErrors: each way decrypting a real value can fail says what
// failed and what would fix it.
func TestDecryptErrors(t *testing.T) {
	golden := func(name string) []byte { return readGolden(t, etcdGoldenDir, name+".bin") }
	same := func(s string) string { return s }
	// Same key names, other secrets (32 bytes each).
	otherSecrets := func(s string) string {
		for _, k := range []string{"c2VjcmV0IGlzIHNlY3VyZSwgdGhpcyBpcyBhIHRlc3Q=", "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=", "a3Byb3h5IGUyZSBzZWNyZXRib3ggdGVzdCBrZXkhMzI="} {
			s = strings.ReplaceAll(s, k, "d3Jvbmcgd3Jvbmcgd3Jvbmcgd3Jvbmcgd3Jvbmcgd3I=")
		}
		return s
	}
	const cmKey = "/registry/configmaps/decode-golden/golden-cm"
	for _, tc := range []struct {
		name   string
		config func(string) string
		key    string
		value  []byte
		want   []string
	}{
		{"aesgcm, wrong key secret", otherSecrets, cmKey, golden("configmap-aesgcm"),
			[]string{"cannot decrypt " + cmKey + " with aesgcm key gcm-key-1", "message authentication failed", "exact key"}},
		{"aesgcm, another etcd key", same, cmKey + "-elsewhere", golden("configmap-aesgcm"),
			[]string{"with aesgcm key gcm-key-1", "is " + cmKey + "-elsewhere the value's exact key?"}},
		{"aesgcm, no etcd key", same, "", golden("configmap-aesgcm"),
			[]string{"cannot decrypt the value with aesgcm key gcm-key-1", "give it exactly (--key)"}},
		{"aescbc, wrong key secret", otherSecrets, "/registry/secrets/decode-golden/golden-secret", golden("secret-aescbc"),
			[]string{"with aescbc key cbc-key-1", "the key's secret differs from the one the apiserver encrypted with"}},
		{"secretbox, wrong key secret", otherSecrets, "/registry/podtemplates/decode-golden/golden-pt", golden("podtemplate-secretbox"),
			[]string{"with secretbox key sb-key-1", "the key's secret differs"}},
		{"key name not configured", same, "/registry/secrets/decode-golden/golden-secret",
			bytes.Replace(golden("secret-aescbc"), []byte("cbc-key-1"), []byte("cbc-key-9"), 1),
			[]string{"encrypted with aescbc key cbc-key-9 (k8s:enc:aescbc:v1:cbc-key-9:)", "does not have (it has aescbc:v1:cbc-key-1, aesgcm:v1:gcm-key-1, kms:v2:test-kms, secretbox:v1:sb-key-1)"}},
		{"KMS plugin unreachable", same, "/registry/controllers/decode-golden/golden-rc", golden("replicationcontroller-kmsv2"),
			[]string{"KMS plugin test-kms at " + kmsEndpointPlaceholder + " is not reachable from here: kproxy decrypts KMS values through the plugin"}},
		{"aescbc, truncated", same, "/registry/secrets/decode-golden/golden-secret", golden("secret-aescbc")[:61],
			[]string{"aescbc key cbc-key-1", "the value is truncated"}},
		{"aesgcm, truncated", same, cmKey, golden("configmap-aesgcm")[:len("k8s:enc:aesgcm:v1:gcm-key-1:")+20],
			[]string{"aesgcm key gcm-key-1", "shorter than AES-GCM's 12-byte nonce and 16-byte tag: the value is truncated"}},
		{"kms v2, truncated", same, "/registry/controllers/decode-golden/golden-rc", golden("replicationcontroller-kmsv2")[:100],
			[]string{"KMS v2 provider test-kms", "EncryptedObject does not parse (truncated or corrupt?)"}},
		{"unknown provider", same, "/registry/secrets/x/y", []byte("k8s:enc:rot13:v1:k1:" + strings.Repeat("x", 40)),
			[]string{`unknown encryption prefix "k8s:enc:rot13:v1:k1:"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			_, err := decrypterFor(t, tc.config).Decrypt(context.Background(), tc.key, tc.value)
			if err == nil {
				t.Fatal("decrypted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("took %s", d)
			}
		})
	}
}

// TestDecryptKMSv1: a configuration with KMS v1 providers loads (the
// KMSv1 feature gate is turned on, as the apiserver that uses it must
// have), and their values need the plugin.
func TestDecryptKMSv1(t *testing.T) {
	dir, err := os.MkdirTemp("", "kms")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// Something listens (not a KMS plugin): the provider is configured.
	l, err := net.Listen("unix", filepath.Join(dir, "v1.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dec := decrypterFor(t, func(string) string {
		return `apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources: [secrets]
  providers:
  - kms:
      name: old-kms
      endpoint: unix:///run/kproxy-no-such-kms-v1.sock
      cachesize: 10
  - identity: {}
- resources: [configmaps]
  providers:
  - kms:
      name: listening-kms
      endpoint: unix://` + l.Addr().String() + `
  - identity: {}
`
	})
	if dec.byGR[schema.GroupResource{Resource: "configmaps"}] == nil {
		t.Errorf("no transformer for configmaps: %v", dec.resources)
	}
	v := append([]byte("k8s:enc:kms:v1:old-kms:\x00\x04dekk"), bytes.Repeat([]byte{1}, 40)...)
	d, err := Payload(v)
	if err != nil || d.Encryption.KMS == nil || d.Encryption.KMS.EncryptedDEKBytes != 4 || d.Encryption.KMS.EncryptedDataBytes != 40 {
		t.Fatalf("%+v %v", d, err)
	}
	_, err = dec.Decrypt(context.Background(), "/registry/secrets/a/b", v)
	if err == nil || !strings.Contains(err.Error(), "KMS plugin old-kms at unix:///run/kproxy-no-such-kms-v1.sock is not reachable from here") {
		t.Errorf("error %v", err)
	}
}

// TestEncryptedNote: an encrypted value decoded without its configuration
// says what decrypting it takes.
func TestEncryptedNote(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"secret-aescbc", "encrypted at rest with aescbc key cbc-key-1: to decrypt it, give the apiserver's --encryption-provider-config"},
		{"configmap-aesgcm", "and the value's exact etcd key (--key)"},
		{"replicationcontroller-kmsv2", "run kproxy where that provider's plugin socket is reachable"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			d, err := Payload(readGolden(t, etcdGoldenDir, tc.file+".bin"))
			if err != nil {
				t.Fatal(err)
			}
			j, err := d.JSON()
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(j), tc.want) || strings.Contains(string(j), "not supported") {
				t.Errorf("note lacks %q:\n%s", tc.want, j)
			}
		})
	}
}
