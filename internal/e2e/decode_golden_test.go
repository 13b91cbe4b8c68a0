package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"mime"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/decode"
)

var update = flag.Bool("update", false, "rewrite the golden values under testdata/decode/etcd and testdata/decode/responses from the real apiserver")

// goldenNS holds the objects of TestDecodeGolden; no other test uses it.
const goldenNS = "decode-golden"

const (
	etcdGoldenDir     = "../../testdata/decode/etcd"
	responseGoldenDir = "../../testdata/decode/responses"
)

// goldenValue is one entry of testdata/decode/etcd/manifest.yaml (the
// decode package's unit test reads the same fields).
type goldenValue struct {
	Name string `json:"name"`
	// Key is the value's etcd key: AES-GCM authenticates it.
	Key string `json:"key"`
	// Value is the file holding the raw value, as etcd returned it.
	Value string `json:"value"`
	// Decoded is the file holding the value decrypted and decoded, as YAML.
	Decoded string `json:"decoded"`
	// Encoding is the stored object's encoding once decrypted.
	Encoding   decode.Format          `json:"encoding"`
	Encryption *decode.EncryptionInfo `json:"encryption,omitempty"`
}

// goldenResponse is one entry of testdata/decode/responses/manifest.yaml.
type goldenResponse struct {
	Name        string `json:"name"`
	Request     string `json:"request"`
	Accept      string `json:"accept"`
	Status      int    `json:"status"`
	ContentType string `json:"contentType"`
	// Body is the file holding the response body as the apiserver sent it.
	Body string `json:"body"`
	// Watch is set for a watch stream; Decoded then holds one YAML
	// document per event.
	Watch   bool   `json:"watch,omitempty"`
	Kind    string `json:"kind,omitempty"`
	Decoded string `json:"decoded"`
	// Table and Wide hold a Table rendered as columns (RenderTable),
	// without and with the priority columns.
	Table string `json:"table,omitempty"`
	Wide  string `json:"wide,omitempty"`
}

// goldenObject is an object TestDecodeGolden creates and reads back
// from etcd.
type goldenObject struct {
	name       string // golden file name
	collection string // API path of the collection it is created in
	objName    string
	key        string // etcd key
	body       string
	encoding   decode.Format
	provider   string // "" when stored unencrypted
	keyName    string
}

var goldenObjects = []goldenObject{
	{name: "secret-aescbc", collection: "/api/v1/namespaces/" + goldenNS + "/secrets", objName: "golden-secret",
		key: "/registry/secrets/" + goldenNS + "/golden-secret", encoding: decode.Protobuf, provider: "aescbc", keyName: "cbc-key-1",
		body: `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"golden-secret","labels":{"golden":"yes"}},"type":"Opaque","stringData":{"username":"kproxy","password":"golden-hunter2"}}`},
	{name: "configmap-aesgcm", collection: "/api/v1/namespaces/" + goldenNS + "/configmaps", objName: "golden-cm",
		key: "/registry/configmaps/" + goldenNS + "/golden-cm", encoding: decode.Protobuf, provider: "aesgcm", keyName: "gcm-key-1",
		body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"golden-cm","labels":{"golden":"yes"}},"data":{"colour":"teal","size":"3"}}`},
	{name: "podtemplate-secretbox", collection: "/api/v1/namespaces/" + goldenNS + "/podtemplates", objName: "golden-pt",
		key: "/registry/podtemplates/" + goldenNS + "/golden-pt", encoding: decode.Protobuf, provider: "secretbox", keyName: "sb-key-1",
		body: `{"apiVersion":"v1","kind":"PodTemplate","metadata":{"name":"golden-pt","labels":{"golden":"yes"}},"template":{"metadata":{"labels":{"app":"golden"}},"spec":{"containers":[{"name":"app","image":"registry.k8s.io/pause:3.10"}]}}}`},
	{name: "replicationcontroller-kmsv2", collection: "/api/v1/namespaces/" + goldenNS + "/replicationcontrollers", objName: "golden-rc",
		key: "/registry/controllers/" + goldenNS + "/golden-rc", encoding: decode.Protobuf, provider: "kms", keyName: "test-kms",
		body: `{"apiVersion":"v1","kind":"ReplicationController","metadata":{"name":"golden-rc","labels":{"golden":"yes"}},"spec":{"replicas":0,"selector":{"app":"golden"},"template":{"metadata":{"labels":{"app":"golden"}},"spec":{"containers":[{"name":"app","image":"registry.k8s.io/pause:3.10"}]}}}}`},
	{name: "serviceaccount-protobuf", collection: "/api/v1/namespaces/" + goldenNS + "/serviceaccounts", objName: "golden-sa",
		key: "/registry/serviceaccounts/" + goldenNS + "/golden-sa", encoding: decode.Protobuf,
		body: `{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"golden-sa","labels":{"golden":"yes"}},"automountServiceAccountToken":false}`},
	{name: "customresource-json", collection: "/apis/decode.kproxy.test/v1/namespaces/" + goldenNS + "/goldenwidgets", objName: "golden-widget",
		key: "/registry/decode.kproxy.test/goldenwidgets/" + goldenNS + "/golden-widget", encoding: decode.JSON,
		body: `{"apiVersion":"decode.kproxy.test/v1","kind":"GoldenWidget","metadata":{"name":"golden-widget","labels":{"golden":"yes"}},"spec":{"size":3,"colour":"teal"}}`},
}

// goldenCRD is the custom resource of TestDecodeGolden, with printer
// columns (one of priority 1) for its Table.
const goldenCRD = `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
"metadata":{"name":"goldenwidgets.decode.kproxy.test"},
"spec":{"group":"decode.kproxy.test","scope":"Namespaced",
 "names":{"plural":"goldenwidgets","singular":"goldenwidget","kind":"GoldenWidget","listKind":"GoldenWidgetList"},
 "versions":[{"name":"v1","served":true,"storage":true,
  "schema":{"openAPIV3Schema":{"type":"object","properties":{"spec":{"type":"object","properties":{"size":{"type":"integer"},"colour":{"type":"string"}}}}}},
  "additionalPrinterColumns":[{"name":"Size","type":"integer","jsonPath":".spec.size"},
   {"name":"Colour","type":"string","jsonPath":".spec.colour","priority":1},
   {"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}]}]}}`

// TestDecodeGolden creates fixed objects through the real apiserver,
// reads what it stored in etcd (encrypted with aescbc, aesgcm, secretbox
// and KMS v2, or plain protobuf and JSON) and what it answers in other
// shapes (Tables, PartialObjectMetadata, Status, watch streams, CBOR),
// and checks that kproxy decodes (and decrypts) each to what the
// apiserver returns. Keys, nonces, uids and timestamps change every run,
// so nothing here compares with the golden bytes; with -update the values
// are written under testdata/decode for the decode package's unit tests.
func TestDecodeGolden(t *testing.T) {
	ctx := context.Background()
	r := directRoute()
	c := r.client(nil)
	admin := func(method, path, body, accept string) exchange {
		return do(t, c, r.base, request{method: method, path: path, body: body, accept: accept, user: "admin"})
	}
	if ex := admin("POST", "/api/v1/namespaces", `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"`+goldenNS+`"}}`, ""); ex.status != 201 && ex.status != 409 {
		t.Fatalf("create namespace %s: %d %s", goldenNS, ex.status, ex.body)
	}
	if ex := admin("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", goldenCRD, ""); ex.status != 201 && ex.status != 409 {
		t.Fatalf("create the CRD: %d %s", ex.status, ex.body)
	}
	waitEstablished(t, admin, "goldenwidgets.decode.kproxy.test")

	etcd := etcdClient(t)
	dec, err := decode.LoadDecrypter(ctx, encryptionConfig)
	if err != nil {
		t.Fatal(err)
	}

	values := map[string][]byte{}
	var manifest []goldenValue
	for _, o := range goldenObjects {
		t.Run("etcd/"+o.name, func(t *testing.T) {
			// A custom resource's REST handler can lag its CRD's
			// Established condition: retry the create for a while.
			deadline := time.Now().Add(time.Minute)
			for {
				ex := admin("POST", o.collection, o.body, "")
				if ex.status == 201 || ex.status == 409 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("create %s: %d %s", o.objName, ex.status, ex.body)
				}
				time.Sleep(500 * time.Millisecond)
			}
			got := admin("GET", o.collection+"/"+o.objName, "", "application/json")
			if got.status != 200 {
				t.Fatalf("get %s: %d %s", o.objName, got.status, got.body)
			}
			var want map[string]any
			if err := json.Unmarshal(got.body, &want); err != nil {
				t.Fatal(err)
			}
			resp, err := etcd.Get(ctx, o.key)
			if err != nil || len(resp.Kvs) != 1 {
				t.Fatalf("etcd get %s: %v (%d keys)", o.key, err, len(resp.Kvs))
			}
			kv := resp.Kvs[0]
			rv := want["metadata"].(map[string]any)["resourceVersion"]
			if rv != strconv.FormatInt(kv.ModRevision, 10) {
				t.Errorf("etcd mod revision %d, the apiserver's resourceVersion %v", kv.ModRevision, rv)
			}
			raw, err := decode.Payload(kv.Value)
			if err != nil {
				t.Fatalf("decode the raw value: %v", err)
			}
			g := goldenValue{Name: o.name, Key: o.key, Value: o.name + ".bin", Decoded: o.name + ".decoded.yaml", Encoding: o.encoding}
			plain := kv.Value
			if o.provider != "" {
				if raw.Format != decode.Encrypted || raw.Encryption.Provider != o.provider || raw.Encryption.KeyName != o.keyName {
					t.Fatalf("stored as %s %+v, want encrypted with %s %s", raw.Format, raw.Encryption, o.provider, o.keyName)
				}
				if o.provider == "kms" {
					k := raw.Encryption.KMS
					if raw.Encryption.Version != "v2" || k == nil || k.KeyID == "" || k.EncryptedDEKSourceType != "HKDF_SHA256_XNONCE_AES_GCM_SEED" || len(k.AnnotationKeys) != 1 {
						t.Errorf("KMS v2 envelope %+v", k)
					}
				}
				note, _ := raw.JSON()
				if !strings.Contains(string(note), "--encryption-provider-config") {
					t.Errorf("the undecrypted value does not say what decrypting it takes:\n%s", note)
				}
				enc := raw.Encryption
				g.Encryption = &enc
				if plain, err = dec.Decrypt(ctx, o.key, kv.Value); err != nil {
					t.Fatal(err)
				}
			}
			d, err := decode.Payload(plain)
			if err != nil {
				t.Fatalf("decode the stored object: %v", err)
			}
			if d.Format != o.encoding {
				t.Errorf("stored as %s, want %s", d.Format, o.encoding)
			}
			j, err := d.JSON()
			if err != nil {
				t.Fatal(err)
			}
			var stored map[string]any
			if err := json.Unmarshal(j, &stored); err != nil {
				t.Fatal(err)
			}
			// The apiserver fills in resourceVersion from the mod revision
			// on reads; the stored object has none.
			delete(want["metadata"].(map[string]any), "resourceVersion")
			if !reflect.DeepEqual(stored, want) {
				t.Errorf("decoded from etcd:\n%s\nthe apiserver returns:\n%s", j, got.body)
			}
			y, err := d.YAML()
			if err != nil {
				t.Fatal(err)
			}
			values[g.Value], values[g.Decoded] = kv.Value, y
			manifest = append(manifest, g)
		})
	}

	responses := map[string][]byte{}
	var rmanifest []goldenResponse
	cms := "/api/v1/namespaces/" + goldenNS + "/configmaps"
	cmWatch := cms + "?watch=1&resourceVersion=0&timeoutSeconds=1&labelSelector=golden%3Dyes"
	for _, q := range []struct {
		name, path, accept string
		check              func(t *testing.T, ex exchange, d *decode.Decoded, events []decode.Event)
	}{
		{"table-configmaps-json", cms + "?labelSelector=golden%3Dyes", decode.TableAccept, checkTable("golden-cm")},
		{"table-configmaps-yaml", cms + "?labelSelector=golden%3Dyes", "application/yaml;as=Table;v=v1;g=meta.k8s.io", checkTable("golden-cm")},
		{"table-customresources-json", "/apis/decode.kproxy.test/v1/namespaces/" + goldenNS + "/goldenwidgets", decode.TableAccept, checkTable("golden-widget", "Size", "Colour", "Age")},
		{"table-protobuf-not-acceptable", cms, "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io", checkStatus(http.StatusNotAcceptable)},
		{"partialobjectmetadata-protobuf", cms + "/golden-cm", "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;v=v1;g=meta.k8s.io",
			func(t *testing.T, ex exchange, d *decode.Decoded, _ []decode.Event) {
				if m, ok := d.Object.(*metav1.PartialObjectMetadata); !ok || ex.status != 200 || m.Name != "golden-cm" || d.Format != decode.Protobuf {
					t.Errorf("%d %s %T, want a protobuf PartialObjectMetadata of golden-cm", ex.status, d.Format, d.Object)
				}
			}},
		{"status-notfound-protobuf", cms + "/no-such-configmap", "application/vnd.kubernetes.protobuf", checkStatus(http.StatusNotFound)},
		{"configmap-cbor", cms + "/golden-cm", "application/cbor", checkCBOR},
		{"watch-configmaps-json", cmWatch, "application/json", checkWatch("golden-cm")},
		{"watch-configmaps-protobuf", cmWatch, decode.WatchProtobuf, checkWatch("golden-cm")},
	} {
		t.Run("response/"+q.name, func(t *testing.T) {
			ex := admin("GET", q.path, "", q.accept)
			ct := ex.header.Get("Content-Type")
			g := goldenResponse{Name: q.name, Request: "GET " + q.path, Accept: q.accept, Status: ex.status, ContentType: ct,
				Body: q.name + bodyExt(ct), Decoded: q.name + ".decoded.yaml"}
			var d *decode.Decoded
			var events []decode.Event
			var decoded []byte
			if wct, ok := decode.DetectWatch(ex.body); ok && strings.Contains(q.path, "watch=1") {
				g.Watch = true
				err := decode.WatchStream(bytes.NewReader(ex.body), wct, func(e decode.Event) error {
					events = append(events, e)
					y, err := e.YAML()
					decoded = append(append(decoded, "---\n"...), y...)
					return err
				})
				if err != nil {
					t.Fatalf("decode the %s watch stream: %v\n%q", wct, err, ex.body)
				}
			} else {
				var err error
				if d, err = decode.Payload(ex.body); err != nil {
					t.Fatalf("decode the answer (%d, %s): %v\n%q", ex.status, ct, err, ex.body)
				}
				g.Kind = d.GVK.String()
				if decoded, err = d.YAML(); err != nil {
					t.Fatal(err)
				}
				if tb, ok := d.Table(); ok {
					var tbl, wide bytes.Buffer
					if err := decode.RenderTable(&tbl, tb, false, true); err != nil {
						t.Fatal(err)
					}
					if err := decode.RenderTable(&wide, tb, true, true); err != nil {
						t.Fatal(err)
					}
					g.Table, g.Wide = q.name+".table.txt", q.name+".wide.txt"
					responses[g.Table], responses[g.Wide] = tbl.Bytes(), wide.Bytes()
				}
			}
			q.check(t, ex, d, events)
			responses[g.Body], responses[g.Decoded] = ex.body, decoded
			rmanifest = append(rmanifest, g)
		})
	}

	t.Run("cli", func(t *testing.T) {
		if values["replicationcontroller-kmsv2.bin"] == nil || responses["table-customresources-json.table.txt"] == nil || responses["watch-configmaps-protobuf.bin"] == nil {
			t.Fatal("the values the CLI decodes are missing: an earlier subtest failed")
		}
		bin, _ := kproxyBinary(t, t.TempDir())
		for _, c := range []struct {
			name  string
			args  []string
			input []byte
			want  []string
		}{
			{"a Table as columns", []string{"-o", "wide"}, responses["table-customresources-json.json"], []string{string(responses["table-customresources-json.wide.txt"])}},
			{"a protobuf watch stream", nil, responses["watch-configmaps-protobuf.bin"], []string{"object:\n  apiVersion: v1\n", "type: ADDED", "name: golden-cm"}},
			{"a KMS v2 value, through the plugin", []string{"--encryption-provider-config", encryptionConfig, "--key", "/registry/controllers/" + goldenNS + "/golden-rc"},
				values["replicationcontroller-kmsv2.bin"], []string{"kind: ReplicationController", "name: golden-rc"}},
		} {
			t.Run(c.name, func(t *testing.T) {
				cmd := exec.Command(bin, append([]string{"decode"}, append(c.args, "-")...)...)
				cmd.Stdin = bytes.NewReader(c.input)
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				out, err := cmd.Output()
				if err != nil {
					t.Fatalf("kproxy decode %s: %v\n%s", strings.Join(c.args, " "), err, stderr.Bytes())
				}
				for _, w := range c.want {
					if !strings.Contains(string(out), w) {
						t.Errorf("output lacks %q:\n%s", w, out)
					}
				}
			})
		}
	})

	// The unit tests decrypt with a copy of the apiserver's configuration.
	configCopy := filepath.Join(etcdGoldenDir, "encryption-config.yaml")
	if *update {
		if t.Failed() {
			t.Fatal("not writing golden files: the checks above failed")
		}
		files := map[string][]byte{"encryption-config.yaml": []byte(encryptionConfiguration)}
		for k, v := range values {
			files[k] = v
		}
		files["manifest.yaml"] = goldenManifest(t, "etcd values", manifest)
		writeGolden(t, etcdGoldenDir, files)
		responses["manifest.yaml"] = goldenManifest(t, "API responses", rmanifest)
		writeGolden(t, responseGoldenDir, responses)
		return
	}
	if b, err := os.ReadFile(configCopy); err != nil || string(b) != encryptionConfiguration {
		t.Errorf("%s differs from the e2e apiserver's encryptionConfiguration (%v): run go test ./internal/e2e -run TestDecodeGolden -update", configCopy, err)
	}
}

// waitEstablished waits for a CRD's Established condition.
func waitEstablished(t *testing.T, admin func(method, path, body, accept string) exchange, name string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ex := admin("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"+name, "", "application/json")
		var crd struct {
			Status struct {
				Conditions []struct{ Type, Status string } `json:"conditions"`
			} `json:"status"`
		}
		_ = json.Unmarshal(ex.body, &crd)
		for _, c := range crd.Status.Conditions {
			if c.Type == "Established" && c.Status == "True" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("CRD %s not established: %d %s", name, ex.status, ex.body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkTable wants a Table whose first row is name, with the given
// columns among its definitions.
func checkTable(name string, columns ...string) func(*testing.T, exchange, *decode.Decoded, []decode.Event) {
	return func(t *testing.T, ex exchange, d *decode.Decoded, _ []decode.Event) {
		tb, ok := d.Table()
		if ex.status != 200 || !ok || d.GVK.Group != "meta.k8s.io" || d.GVK.Kind != "Table" {
			t.Fatalf("%d %s %T (%s), want a meta.k8s.io Table\n%s", ex.status, d.Format, d.Object, d.GVK, ex.body)
		}
		if len(tb.Rows) != 1 || len(tb.Rows[0].Cells) == 0 || tb.Rows[0].Cells[0] != name {
			t.Errorf("rows %+v, want one, %s", tb.Rows, name)
		}
		have := map[string]bool{}
		for _, c := range tb.ColumnDefinitions {
			have[c.Name] = true
		}
		for _, c := range columns {
			if !have[c] {
				t.Errorf("no column %s in %+v", c, tb.ColumnDefinitions)
			}
		}
		// Decoding loses nothing: the decoded Table renders back to the
		// apiserver's answer.
		if d.Format == decode.JSON {
			sameJSON(t, d, ex.body)
		}
	}
}

// checkStatus wants a metav1.Status of the given code, in the content
// type the apiserver answered with.
func checkStatus(code int) func(*testing.T, exchange, *decode.Decoded, []decode.Event) {
	return func(t *testing.T, ex exchange, d *decode.Decoded, _ []decode.Event) {
		st, ok := d.Object.(*metav1.Status)
		if ex.status != code || !ok || int(st.Code) != code {
			t.Fatalf("%d %T, want a Status %d\n%q", ex.status, d.Object, code, ex.body)
		}
		if s, ok := decode.Status(ex.header.Get("Content-Type"), ex.body); !ok || s.Code != st.Code || s.Message != st.Message {
			t.Errorf("decode.Status: %+v %v, decode.Payload: %+v", s, ok, st)
		}
	}
}

// checkCBOR: the apiserver serves CBOR only with the alpha
// CBORServingAndStorage feature gate; off (v1.37's default), it answers
// 406. Either way kproxy decodes the answer.
func checkCBOR(t *testing.T, ex exchange, d *decode.Decoded, _ []decode.Event) {
	if ex.status == http.StatusNotAcceptable {
		checkStatus(http.StatusNotAcceptable)(t, ex, d, nil)
		t.Logf("the apiserver does not serve CBOR (406): the golden holds its Status")
		return
	}
	if ex.status != 200 || d.Format != decode.CBOR || d.GVK.Kind != "ConfigMap" {
		t.Fatalf("%d %s %s, want a CBOR ConfigMap", ex.status, d.Format, d.GVK)
	}
	asJSON := do(t, directRoute().client(nil), cluster.URL, request{method: "GET", path: "/api/v1/namespaces/" + goldenNS + "/configmaps/golden-cm", user: "admin", accept: "application/json"})
	sameJSON(t, d, asJSON.body)
}

// checkWatch wants a watch stream holding an ADDED event for name.
func checkWatch(name string) func(*testing.T, exchange, *decode.Decoded, []decode.Event) {
	return func(t *testing.T, ex exchange, _ *decode.Decoded, events []decode.Event) {
		for _, e := range events {
			if m, err := meta.Accessor(e.Object.Object); err == nil && e.Type == "ADDED" && m.GetName() == name {
				return
			}
		}
		t.Errorf("%d: no ADDED event for %s in %d events", ex.status, name, len(events))
	}
}

// sameJSON compares the decoded object's JSON with a JSON body.
func sameJSON(t *testing.T, d *decode.Decoded, body []byte) {
	t.Helper()
	j, err := d.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var got, want any
	if err := json.Unmarshal(j, &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(body, &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("decoded:\n%s\nthe apiserver's JSON:\n%s", j, body)
	}
}

func bodyExt(contentType string) string {
	mt, params, _ := mime.ParseMediaType(contentType)
	switch {
	case mt == "application/json" && params["stream"] == "watch":
		return ".jsonl"
	case mt == "application/json":
		return ".json"
	case mt == "application/yaml":
		return ".yaml"
	case mt == "application/cbor":
		return ".cbor"
	}
	return ".bin"
}

func goldenManifest[T any](t *testing.T, what string, entries []T) []byte {
	t.Helper()
	b, err := yaml.Marshal(map[string][]T{"entries": entries})
	if err != nil {
		t.Fatal(err)
	}
	head := fmt.Sprintf("# Golden %s written by the real kube-apiserver of the e2e tests,\n"+
		"# captured by TestDecodeGolden (go test ./internal/e2e -run TestDecodeGolden -update).\n"+
		"# The decode package's unit tests decode each and compare with the files named here.\n", what)
	return append([]byte(head), b...)
}

// writeGolden replaces dir's golden files with files.
func writeGolden(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("wrote %d golden files under %s", len(files), dir)
}
