package decode

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/decode/kmstest"
)

// The golden values under testdata/decode/etcd and testdata/decode/responses
// were written by the real kube-apiserver of the e2e tests and captured by
// TestDecodeGolden (go test ./internal/e2e -run TestDecodeGolden -update),
// which also checks that each decodes to what the apiserver returns.
const (
	etcdGoldenDir     = "../../testdata/decode/etcd"
	responseGoldenDir = "../../testdata/decode/responses"
	// kmsEndpointPlaceholder is the KMS endpoint in the stored encryption
	// configuration; the tests point it at their own test plugin.
	kmsEndpointPlaceholder = "unix:///run/kproxy-test-kms.sock"
)

type goldenValue struct {
	Name       string          `json:"name"`
	Key        string          `json:"key"`
	Value      string          `json:"value"`
	Decoded    string          `json:"decoded"`
	Encoding   Format          `json:"encoding"`
	Encryption *EncryptionInfo `json:"encryption,omitempty"`
}

type goldenResponse struct {
	Name        string `json:"name"`
	Request     string `json:"request"`
	Accept      string `json:"accept"`
	Status      int    `json:"status"`
	ContentType string `json:"contentType"`
	Body        string `json:"body"`
	Watch       bool   `json:"watch,omitempty"`
	Kind        string `json:"kind,omitempty"`
	Decoded     string `json:"decoded"`
	Table       string `json:"table,omitempty"`
	Wide        string `json:"wide,omitempty"`
}

func readManifest[T any](t *testing.T, dir string) []T {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "manifest.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct{ Entries []T }
	if err := yaml.UnmarshalStrict(b, &m); err != nil {
		t.Fatalf("%s/manifest.yaml: %v", dir, err)
	}
	if len(m.Entries) == 0 {
		t.Fatalf("%s/manifest.yaml lists nothing", dir)
	}
	return m.Entries
}

func readGolden(t *testing.T, dir, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// goldenDecrypter loads the e2e apiserver's encryption configuration
// (testdata/decode/etcd/encryption-config.yaml), its KMS provider pointed
// at a test KMS plugin with the key the e2e plugin had.
func goldenDecrypter(t *testing.T) *Decrypter {
	t.Helper()
	dir, err := os.MkdirTemp("", "kms") // short: unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	plugin, err := kmstest.Start(filepath.Join(dir, "kms.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(plugin.Stop)
	return decrypterFor(t, func(cfg string) string { return strings.ReplaceAll(cfg, kmsEndpointPlaceholder, plugin.Endpoint) })
}

// TestGoldenEtcdValues decrypts and decodes the raw etcd values the real
// apiserver wrote (aescbc, aesgcm, secretbox, KMS v2, plain protobuf, a
// custom resource's JSON) and compares each with its decoded YAML.
func TestGoldenEtcdValues(t *testing.T) {
	dec := goldenDecrypter(t)
	providers := map[string]bool{}
	for _, g := range readManifest[goldenValue](t, etcdGoldenDir) {
		t.Run(g.Name, func(t *testing.T) {
			raw := readGolden(t, etcdGoldenDir, g.Value)
			d, err := Payload(raw)
			if err != nil {
				t.Fatal(err)
			}
			if g.Encryption != nil {
				providers[g.Encryption.Provider+":"+g.Encryption.Version] = true
				if d.Format != Encrypted || !reflect.DeepEqual(d.Encryption, *g.Encryption) {
					t.Fatalf("%s %+v, want encrypted %+v", d.Format, d.Encryption, *g.Encryption)
				}
				plain, err := dec.Decrypt(context.Background(), g.Key, raw)
				if err != nil {
					t.Fatal(err)
				}
				if d, err = Payload(plain); err != nil {
					t.Fatal(err)
				}
			}
			if d.Format != g.Encoding {
				t.Errorf("stored as %s, want %s", d.Format, g.Encoding)
			}
			got, err := d.YAML()
			if err != nil {
				t.Fatal(err)
			}
			if want := readGolden(t, etcdGoldenDir, g.Decoded); !bytes.Equal(got, want) {
				t.Errorf("decodes to\n%s\nwant (%s)\n%s", got, g.Decoded, want)
			}
		})
	}
	for _, p := range []string{"aescbc:v1", "aesgcm:v1", "secretbox:v1", "kms:v2"} {
		if !providers[p] {
			t.Errorf("no golden value encrypted with %s", p)
		}
	}
}

// TestGoldenResponses decodes what the real apiserver answered: Tables
// (rendered as columns too), PartialObjectMetadata, Status bodies, CBOR
// (or its refusal), watch streams in JSON and protobuf framing.
func TestGoldenResponses(t *testing.T) {
	for _, g := range readManifest[goldenResponse](t, responseGoldenDir) {
		t.Run(g.Name, func(t *testing.T) {
			body := readGolden(t, responseGoldenDir, g.Body)
			var got []byte
			if g.Watch {
				ct, ok := DetectWatch(body)
				if !ok {
					t.Fatalf("not detected as a watch stream (%s)", g.ContentType)
				}
				if !strings.HasPrefix(g.ContentType, strings.SplitN(ct, ";", 2)[0]) {
					t.Errorf("detected as %s, the apiserver sent %s", ct, g.ContentType)
				}
				err := WatchStream(bytes.NewReader(body), ct, func(e Event) error {
					y, err := e.YAML()
					got = append(append(got, "---\n"...), y...)
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
			} else {
				if _, ok := DetectWatch(body); ok {
					t.Errorf("detected as a watch stream")
				}
				d, err := Payload(body)
				if err != nil {
					t.Fatal(err)
				}
				if d.GVK.String() != g.Kind {
					t.Errorf("kind %s, want %s", d.GVK, g.Kind)
				}
				if got, err = d.YAML(); err != nil {
					t.Fatal(err)
				}
				tb, isTable := d.Table()
				if isTable != (g.Table != "") {
					t.Fatalf("Table() %v, the manifest says table %q", isTable, g.Table)
				}
				if isTable {
					for file, wide := range map[string]bool{g.Table: false, g.Wide: true} {
						var out bytes.Buffer
						if err := RenderTable(&out, tb, wide, true); err != nil {
							t.Fatal(err)
						}
						if want := readGolden(t, responseGoldenDir, file); !bytes.Equal(out.Bytes(), want) {
							t.Errorf("renders (wide %v) as\n%s\nwant (%s)\n%s", wide, out.Bytes(), file, want)
						}
					}
				}
			}
			if want := readGolden(t, responseGoldenDir, g.Decoded); !bytes.Equal(got, want) {
				t.Errorf("decodes to\n%s\nwant (%s)\n%s", got, g.Decoded, want)
			}
		})
	}
}
