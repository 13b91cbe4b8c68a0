package decode

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	kmstypes "k8s.io/apiserver/pkg/storage/value/encrypt/envelope/kmsv2/v2"
	"k8s.io/client-go/kubernetes/scheme"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/decode")

func configMap() *corev1.ConfigMap {
	return &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: "settings", Namespace: "prod", UID: "0c9f2b3e-1f1a-4a8e-9b7e-3f8c2d1a0b9c", ResourceVersion: "42"},
		Data:       map[string]string{"mode": "fast"}}
}

func encode(t *testing.T, f Format, obj runtime.Object) []byte {
	t.Helper()
	var b []byte
	var err error
	switch f {
	case Protobuf:
		b, err = runtime.Encode(protobuf.NewSerializer(scheme.Scheme, scheme.Scheme), obj)
	case CBOR:
		b, err = runtime.Encode(cbor.NewSerializer(scheme.Scheme, scheme.Scheme), obj)
	case JSON:
		b, err = runtime.Encode(payloadCodecs.LegacyCodec(corev1.SchemeGroupVersion), obj)
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPayloadFormats decodes the same object in every encoding the
// apiserver speaks or stores, and checks each gives the same YAML: the
// golden file testdata/decode/configmap.yaml (go test -update rewrites it).
func TestPayloadFormats(t *testing.T) {
	golden := filepath.Join("..", "..", "testdata", "decode", "configmap.yaml")
	yamlIn := []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: prod\n  uid: 0c9f2b3e-1f1a-4a8e-9b7e-3f8c2d1a0b9c\n  resourceVersion: \"42\"\ndata:\n  mode: fast\n")
	cases := []struct {
		format Format
		in     []byte
	}{
		{Protobuf, encode(t, Protobuf, configMap())},
		{CBOR, encode(t, CBOR, configMap())},
		{JSON, encode(t, JSON, configMap())},
		{YAML, yamlIn},
	}
	if *update {
		d, err := Payload(cases[0].in)
		if err != nil {
			t.Fatal(err)
		}
		out, err := d.YAML()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/decode -update)", err)
	}
	for _, tc := range cases {
		t.Run(string(tc.format), func(t *testing.T) {
			d, err := Payload(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if d.Format != tc.format || d.GVK.Kind != "ConfigMap" {
				t.Fatalf("format %s kind %s, want %s ConfigMap", d.Format, d.GVK.Kind, tc.format)
			}
			if _, typed := d.Object.(*corev1.ConfigMap); !typed {
				t.Errorf("object is %T, want *v1.ConfigMap", d.Object)
			}
			got, err := d.YAML()
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("YAML differs from %s:\n%s", golden, got)
			}
		})
	}
}

func TestPayloadOthers(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		format   Format
		want     string // in the JSON rendering, or the error
		err      bool
	}{
		{name: "custom resource stays unstructured", in: `{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w"},"spec":{"size":3}}`, format: JSON, want: `"size": 3`},
		{name: "aescbc at rest", in: "k8s:enc:aescbc:v1:key1:" + strings.Repeat("\x01", 48), format: Encrypted, want: `"keyName": "key1"`},
		{name: "kms v2 at rest", in: "k8s:enc:kms:v2:vault:" + kmsV2Object(t), format: Encrypted, want: `"keyID": "arn:test:key/1"`},
		{name: "kms v2 envelope, no secret bytes", in: "k8s:enc:kms:v2:vault:" + kmsV2Object(t), format: Encrypted, want: `"annotationKeys": [
        "a.example.com",
        "b.example.com"
      ],
      "encryptedDEKSourceType": "HKDF_SHA256_XNONCE_AES_GCM_SEED",
      "encryptedDEKBytes": 9,
      "encryptedDataBytes": 14`},
		{name: "kms v2 truncated", in: "k8s:enc:kms:v2:vault:" + kmsV2Object(t)[:20], err: true, want: "KMS v2 EncryptedObject does not parse (truncated or corrupt?)"},
		{name: "kms v1 at rest", in: "k8s:enc:kms:v1:old:\x00\x03dek" + strings.Repeat("d", 20), format: Encrypted, want: `"encryptedDataBytes": 20`},
		{name: "kms v1 truncated", in: "k8s:enc:kms:v1:old:\x01\x00dek", err: true, want: "the encrypted DEK alone is 256: the value is truncated"},
		{name: "aescbc truncated", in: "k8s:enc:aescbc:v1:key1:\x01\x02\x03", err: true, want: "the ciphertext is 3 bytes; AES-CBC writes a 16-byte IV and whole 16-byte blocks"},
		{name: "secretbox truncated", in: "k8s:enc:secretbox:v1:sb:" + strings.Repeat("\x01", 39), err: true, want: "shorter than secretbox's 24-byte nonce and 16-byte tag"},
		{name: "unknown provider", in: "k8s:enc:rot13:v1:k:abc", err: true, want: `unknown encryption prefix "k8s:enc:rot13:v1:k:"`},
		{name: "broken encryption prefix", in: "k8s:enc:aescbc", err: true, want: "no provider:version:key"},
		{name: "Table stays typed", in: `{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{},"columnDefinitions":[{"name":"Name","type":"string","format":"name","description":"","priority":0}],"rows":[{"cells":["a"],"object":null}]}`, format: JSON, want: `"cells": [`},
		{name: "empty", in: "", err: true, want: "empty"},
		{name: "binary garbage", in: "\xff\xfe\x00\x01", err: true, want: "not JSON, YAML, protobuf"},
		{name: "JSON without kind", in: `{"a":1}`, err: true, want: "no kind"},
		{name: "truncated protobuf", in: "k8s\x00\x0a\x05", err: true, want: "decode protobuf"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Payload([]byte(tc.in))
			if tc.err {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v, want %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.Format != tc.format {
				t.Errorf("format %s, want %s", d.Format, tc.format)
			}
			j, err := d.JSON()
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(j), tc.want) {
				t.Errorf("JSON lacks %q:\n%s", tc.want, j)
			}
		})
	}
}

// kmsV2Object is a KMS v2 EncryptedObject with made-up contents.
func kmsV2Object(t *testing.T) string {
	t.Helper()
	b, err := proto.Marshal(&kmstypes.EncryptedObject{EncryptedData: []byte("secret-payload"), KeyID: "arn:test:key/1",
		EncryptedDEKSource: []byte("dek-bytes"), Annotations: map[string][]byte{"b.example.com": []byte("x"), "a.example.com": []byte("y")},
		EncryptedDEKSourceType: kmstypes.EncryptedDEKSourceType_HKDF_SHA256_XNONCE_AES_GCM_SEED})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestWatchStreamErrors(t *testing.T) {
	noop := func(Event) error { return nil }
	if err := WatchStream(strings.NewReader(""), "text/plain", noop); err == nil || !strings.Contains(err.Error(), "no stream framing") {
		t.Errorf("text/plain: %v", err)
	}
	if err := WatchStream(strings.NewReader(`{"type":"ADDED","object":{"a":1}}`+"\n"), "application/json", noop); err == nil || !strings.Contains(err.Error(), "watch event ADDED") {
		t.Errorf("event without kind: %v", err)
	}
	// A protobuf event whose type is not UTF-8 (a fuzzer's find): JSON
	// would show U+FFFD in its place, a type the stream did not carry.
	notUTF8 := "\x00\x00\x00J\n\b\xffODIFIED\x12>\n<k8s\x00\n\x14\n\x02v1\x12\x0eServiceAccount\x12\x1c\n\x1a\n\abuilder\x12\x00\x1a\x03adm\"\x00*\x002\x008\x00B\x00\x1a\x00\"\x00\x00"
	if err := WatchStream(strings.NewReader(notUTF8), WatchProtobuf, noop); err == nil || !strings.Contains(err.Error(), "is not UTF-8") {
		t.Errorf("event type not UTF-8: %v", err)
	}
	var n int
	stream := `{"type":"ADDED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}}` + "\n" +
		`{"type":"DELETED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}}` + "\n"
	if err := WatchStream(strings.NewReader(stream), "application/json", func(e Event) error { n++; return nil }); err != nil || n != 2 {
		t.Errorf("two events: n=%d err=%v", n, err)
	}
}
