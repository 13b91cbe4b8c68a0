package decode

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"sigs.k8s.io/yaml"
)

// The fuzz targets of this package are seeded from the golden values the
// real apiserver wrote (testdata/decode), the request bodies and fixtures
// of the conformance corpus (testdata/conformance), the same objects
// re-encoded in protobuf and CBOR, and a few hand-made edge cases.

// testdataFiles reads every file under the repository's testdata/dir
// whose name ends in one of exts.
func testdataFiles(f *testing.F, dir string, exts ...string) [][]byte {
	f.Helper()
	var out [][]byte
	err := filepath.WalkDir(filepath.Join("..", "..", "testdata", dir), func(path string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		for _, ext := range exts {
			if strings.HasSuffix(path, ext) {
				b, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				out = append(out, b)
				break
			}
		}
		return nil
	})
	if err != nil {
		f.Fatal(err)
	}
	if len(out) == 0 {
		f.Fatalf("no %v files under testdata/%s", exts, dir)
	}
	return out
}

// conformanceBodies are the request bodies of the conformance cases and
// the objects of their fixtures (one per YAML document).
func conformanceBodies(f *testing.F) [][]byte {
	f.Helper()
	var out [][]byte
	for _, b := range testdataFiles(f, "conformance", ".yaml") {
		var cases []struct {
			Body string `json:"body"`
		}
		if yaml.Unmarshal(b, &cases) == nil && len(cases) > 0 {
			for _, c := range cases {
				if c.Body != "" {
					out = append(out, []byte(c.Body))
				}
			}
			continue
		}
		for _, doc := range strings.Split(string(b), "\n---\n") {
			out = append(out, []byte(doc))
		}
	}
	return out
}

// reencoded are the seeds' objects again in protobuf and CBOR (the
// golden responses hold no CBOR body: the apiserver refused it), and a
// Secret, the kind whose bodies matter most.
func reencoded(f *testing.F, seeds [][]byte) [][]byte {
	f.Helper()
	pb := protobuf.NewSerializer(payloadScheme, payloadScheme)
	objs := []runtime.Object{&corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ns", Annotations: map[string]string{"a": "b"}},
		Data:       map[string][]byte{"password": []byte("hunter2")}, StringData: map[string]string{"token": "t0k3n"}, Type: corev1.SecretTypeOpaque}}
	for _, s := range seeds {
		if d, err := Payload(s); err == nil && d.Object != nil {
			objs = append(objs, d.Object)
		}
	}
	var out [][]byte
	for _, o := range objs {
		for _, enc := range []runtime.Encoder{pb, cborDecoder} {
			if b, err := runtime.Encode(enc, o); err == nil {
				out = append(out, b)
			}
		}
	}
	return out
}

// fuzzing reports a run with -fuzz (rather than go test's seed run).
func fuzzing() bool {
	fl := flag.Lookup("test.fuzz")
	return fl != nil && fl.Value.String() != ""
}

// sampleSeeds is seeds, or when fuzzing n of them spread evenly: with the
// Kubernetes packages instrumented, each seed's baseline coverage takes
// tens of milliseconds, so a fuzzing run starts from a sample. The seed
// run (go test) takes them all.
func sampleSeeds[T any](seeds []T, n int) []T {
	if !fuzzing() {
		return seeds
	}
	return spread(seeds, n)
}

// spread is n of seeds, spread evenly.
func spread[T any](seeds []T, n int) []T {
	if len(seeds) <= n {
		return seeds
	}
	out := make([]T, 0, n)
	for i := range n {
		out = append(out, seeds[i*len(seeds)/n])
	}
	return out
}

// addSeeds adds each seed to f's corpus.
func addSeeds(f *testing.F, seeds [][]byte) {
	for _, s := range seeds {
		f.Add(s)
	}
}

// payloadSeeds are every kind of payload the package decodes.
func payloadSeeds(f *testing.F) [][]byte {
	f.Helper()
	seeds := sampleSeeds(testdataFiles(f, "decode", ".bin", ".json", ".yaml"), 16)
	seeds = append(seeds, sampleSeeds(conformanceBodies(f), 12)...)
	seeds = append(seeds, sampleSeeds(reencoded(f, seeds), 10)...)
	for _, s := range []string{"", " \n", "{", "[]", "null", "{}", `{"kind":""}`, `{"kind":"Widget","apiVersion":"x.io/v1","spec":{"n":1e400}}`,
		`{"apiVersion":"v1","kind":"ConfigMap","data":5}`, "kind: ConfigMap\napiVersion: v1\ndata: {a: [1]}\n", "kind: Foo\n---\nkind: Bar\n",
		"a: &a [*a]\n", "k8s\x00", "k8s\x00\x0a\x02", "\xd9\xd9\xf7", "\xd9\xd9\xf7\xa0", "\xff\xfe", "k8s:enc:", "k8s:enc:aescbc:v1:k:",
		"k8s:enc:kms:v1:k:\x00\x04dekk" + strings.Repeat("x", 20), "k8s:enc:kms:v2:k:\x0a\x00", `{"apiVersion":"v1","kind":"Pod","metadata":{"creationTimestamp":"9999-12-31T23:59:59Z"}}`} {
		seeds = append(seeds, []byte(s))
	}
	// What YAML cannot carry: DEL and C1 controls in a value, invalid
	// UTF-8 in a Table row's raw object; and what JSON cannot: a
	// protobuf object whose managedFields hold bytes that are not JSON.
	seeds = append(seeds, []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"a":"\u007f\u0086"}}`),
		[]byte(`{"kind":"Table","apiVersion":"meta.k8s.io/v1","rows":[{"cells":[],"object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"`+"\xbd"+`"}}}]}`))
	cm := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"}, ObjectMeta: metav1.ObjectMeta{Name: "c",
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m", FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1("\x12 not JSON")}}}}
	b, err := runtime.Encode(protobuf.NewSerializer(payloadScheme, payloadScheme), cm)
	if err != nil {
		f.Fatal(err)
	}
	return append(seeds, b)
}

// FuzzPayload decodes arbitrary bytes as a request or response body or an
// etcd value (JSON, YAML, protobuf, CBOR, an encrypted value). It checks
// that Payload never panics and agrees with Detect; that whatever decodes
// renders as JSON and YAML; that the JSON decodes again to the same kind;
// and that from there decode and encode are stable (a fixpoint).
func FuzzPayload(f *testing.F) {
	addSeeds(f, payloadSeeds(f))
	f.Fuzz(func(t *testing.T, b []byte) {
		format, detectErr := Detect(b)
		d, err := Payload(b)
		_ = ResourceVersion(b)
		if detectErr != nil {
			if err == nil {
				t.Fatalf("Detect fails (%v) but Payload decodes %q", detectErr, b)
			}
			return
		}
		if err != nil {
			if d != nil && d.Format != Encrypted {
				t.Fatalf("Payload(%q) returns a %s result with its error %v", b, d.Format, err)
			}
			return
		}
		if d.Format != format {
			t.Fatalf("Payload says %s, Detect %s", d.Format, format)
		}
		if (d.Object == nil) != (format == Encrypted) {
			t.Fatalf("%s payload decodes to object %T", format, d.Object)
		}
		j1, err := d.JSON()
		if rawNotJSON(err) {
			return
		}
		if err != nil {
			t.Fatalf("%s payload %q decodes to %T but does not render as JSON: %v", format, b, d.Object, err)
		}
		if _, err := d.YAML(); err != nil && !yamlUnprintable(j1) {
			t.Fatalf("%s payload %q renders as JSON but not as YAML: %v", format, b, err)
		}
		if format == Encrypted {
			return
		}
		d2, err := Payload(j1)
		if err != nil {
			t.Fatalf("%s payload %q renders as JSON that does not decode: %v\n%s", format, b, err, j1)
		}
		if d2.GVK != d.GVK {
			t.Fatalf("%s payload %q is %s, its JSON %s", format, b, d.GVK, d2.GVK)
		}
		j2, err := d2.JSON()
		if err != nil {
			t.Fatal(err)
		}
		d3, err := Payload(j2)
		if err != nil {
			t.Fatalf("JSON %s does not decode again: %v", j2, err)
		}
		j3, err := d3.JSON()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(j2, j3) {
			t.Fatalf("decoding is not stable: %q\n-> %s\n-> %s\n-> %s", b, j1, j2, j3)
		}
	})
}

// yamlUnprintable reports JSON holding a character YAML does not allow
// unescaped (DEL, C1 controls, U+FFFE, U+FFFF), which encoding/json does
// not escape, or invalid UTF-8 (a Table row's raw object is copied as
// is): sigs.k8s.io/yaml cannot turn that JSON into YAML ("control
// characters are not allowed"), so neither can Decoded.YAML.
func yamlUnprintable(j []byte) bool {
	if !utf8.Valid(j) {
		return true
	}
	for _, r := range string(j) {
		switch {
		case r == '\t' || r == '\n' || r == '\r' || r == 0x85:
		case r < 0x20, r == 0x7f, r >= 0x80 && r < 0xa0, r == 0xfffe, r == 0xffff:
			return true
		}
	}
	return false
}

// rawNotJSON reports a failure to render an object as JSON because a
// field it carries as raw JSON (managedFields' FieldsV1, a
// RawExtension) is not JSON: protobuf and CBOR carry such fields as
// opaque bytes. The only way a decoded object may fail to render.
func rawNotJSON(err error) bool {
	var m *json.MarshalerError
	return errors.As(err, &m)
}
