package e2e

import (
	"context"
	"encoding/json"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/decode"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// TestEtcdDecrypt reads values the real apiserver wrote into the real etcd
// with encryption at rest (secrets: aescbc, configmaps: aesgcm), decrypts
// them with the apiserver's own configuration file and compares the
// decoded object with what the apiserver returns for it.
func TestEtcdDecrypt(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	_, err := cs.CoreV1().Secrets(testNS).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "enc-secret"},
		StringData: map[string]string{"password": "hunter2"}}, createOpts)
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	_, err = cs.CoreV1().ConfigMaps(testNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "enc-cm"},
		Data: map[string]string{"colour": "blue"}}, createOpts)
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	sec, _ := cs.CoreV1().Secrets(testNS).Get(ctx, "enc-secret", metav1.GetOptions{})
	cm, _ := cs.CoreV1().ConfigMaps(testNS).Get(ctx, "enc-cm", metav1.GetOptions{})
	etcd := etcdClient(t)
	dec, err := decode.LoadDecrypter(ctx, encryptionConfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		resource, name, provider, keyName string
		want                              metav1.Object
		same                              func(obj any) bool
	}{
		{"secrets", "enc-secret", "aescbc", "cbc-key-1", sec, func(obj any) bool {
			s, ok := obj.(*corev1.Secret)
			return ok && string(s.Data["password"]) == "hunter2"
		}},
		{"configmaps", "enc-cm", "aesgcm", "gcm-key-1", cm, func(obj any) bool {
			c, ok := obj.(*corev1.ConfigMap)
			return ok && c.Data["colour"] == "blue"
		}},
	} {
		t.Run(c.resource, func(t *testing.T) {
			key, err := apiserver.EtcdKey(apiserver.NewOptions(), c.resource, testNS, c.name)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := etcd.Get(ctx, key)
			if err != nil || len(resp.Kvs) != 1 {
				t.Fatalf("etcd get %s: %v (%d keys)", key, err, len(resp.Kvs))
			}
			kv := resp.Kvs[0]
			raw, err := decode.Payload(kv.Value)
			if err != nil {
				t.Fatal(err)
			}
			if raw.Format != decode.Encrypted || raw.Encryption.Provider != c.provider || raw.Encryption.KeyName != c.keyName {
				t.Fatalf("stored as %s %+v, want encrypted with %s/%s", raw.Format, raw.Encryption, c.provider, c.keyName)
			}
			plain, err := dec.Decrypt(ctx, key, kv.Value)
			if err != nil {
				t.Fatal(err)
			}
			d, err := decode.Payload(plain)
			if err != nil {
				t.Fatal(err)
			}
			if d.Format != decode.Protobuf {
				t.Errorf("decrypted value is %s, want protobuf (built-in types are stored as protobuf)", d.Format)
			}
			m, err := meta.Accessor(d.Object)
			if err != nil {
				t.Fatal(err)
			}
			if m.GetUID() != c.want.GetUID() || m.GetName() != c.want.GetName() || !c.same(d.Object) {
				t.Errorf("decrypted %+v, the apiserver returns %s/%s uid %s", d.Object, c.want.GetNamespace(), c.want.GetName(), c.want.GetUID())
			}
			if rv := c.want.GetResourceVersion(); rv != "" && rv != itoa(kv.ModRevision) {
				t.Errorf("mod revision %d, the apiserver's resourceVersion %s", kv.ModRevision, rv)
			}
			if c.provider == "aesgcm" {
				// AES-GCM authenticates the exact key: another key fails.
				if _, err := dec.Decrypt(ctx, key+"-elsewhere", kv.Value); err == nil {
					t.Error("aesgcm decrypted under a different etcd key; the key is authenticated data")
				}
			}
		})
	}
}

// TestEtcdCommand runs kproxy etcd as a binary against the real etcd,
// configured from the apiserver's manifest: a Secret stored encrypted,
// decrypted; keys worked out for special prefixes; a listing.
func TestEtcdCommand(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	if _, err := cs.CoreV1().Secrets(testNS).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "etcd-cmd"},
		StringData: map[string]string{"token": "s3cr3t"}}, createOpts); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin, manifest := kproxyBinary(t, dir)
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, append([]string{"etcd"}, append(args, "--apiserver-manifest", manifest)...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("kproxy etcd %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	var e struct {
		Key        string                 `json:"key"`
		ModRev     int64                  `json:"modRevision"`
		Encoding   string                 `json:"encoding"`
		Stored     string                 `json:"storageVersion"`
		Encryption *decode.EncryptionInfo `json:"encryption"`
		Decrypted  bool                   `json:"decrypted"`
		Object     corev1.Secret          `json:"object"`
	}
	out := run("get", "secrets", "-n", testNS, "etcd-cmd", "-o", "json")
	if err := json.Unmarshal([]byte(out), &e); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if e.Key != "/registry/secrets/"+testNS+"/etcd-cmd" || !e.Decrypted || e.Encryption == nil || e.Encryption.Provider != "aescbc" ||
		e.Encoding != "protobuf" || e.Stored != "v1 Secret" || string(e.Object.Data["token"]) != "s3cr3t" {
		t.Errorf("kproxy etcd get: %s", out)
	}
	// The same key given as a key; the keys of special prefixes.
	if got := run("get", "/registry/secrets/"+testNS+"/etcd-cmd"); !strings.Contains(got, "decrypted: true") {
		t.Errorf("kproxy etcd get KEY: %s", got)
	}
	// A missing key says which key, worked out with the storage factory.
	if out, err := exec.Command(bin, "etcd", "get", "deployments.apps", "-n", "default", "nothing-here", "--apiserver-manifest", manifest).CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "etcd has no key /registry/deployments/default/nothing-here") {
		t.Errorf("kproxy etcd get of a missing key: %v\n%s", err, out)
	}
	if got := run("get", "services", "-n", "default", "kubernetes"); !strings.Contains(got, "key: /registry/services/specs/default/kubernetes") {
		t.Errorf("the kubernetes Service is not under services/specs: %s", got)
	}
	if got := run("ls", "/registry/secrets/"+testNS); !strings.Contains(got, "/registry/secrets/"+testNS+"/etcd-cmd") || !strings.Contains(got, "aescbc/cbc-key-1") {
		t.Errorf("kproxy etcd ls: %s", got)
	}
	if got := run("ls", "/registry/secrets/"+testNS, "-o", "json"); !strings.Contains(got, `"kind": "EtcdKeyList"`) || !strings.Contains(got, `"key": "/registry/secrets/`+testNS+`/etcd-cmd"`) {
		t.Errorf("kproxy etcd ls -o json: %s", got)
	}
	if got := run("ls", "/registry/secrets/"+testNS, "-o", "name"); !strings.Contains(got, "/registry/secrets/"+testNS+"/etcd-cmd\n") || strings.Contains(got, "protobuf") {
		t.Errorf("kproxy etcd ls -o name: %s", got)
	}
	// The raw value, decrypted by kproxy decode.
	key := "/registry/secrets/" + testNS + "/etcd-cmd"
	rawValue := run("get", key, "-o", "raw")
	dec := exec.Command(bin, "decode", "-o", "json", "--encryption-provider-config", encryptionConfig, "--key", key, "-")
	dec.Stdin = strings.NewReader(rawValue)
	if got, err := dec.Output(); err != nil || !strings.Contains(string(got), `"token": "czNjcjN0"`) {
		t.Errorf("kproxy decode of the raw value: %v\n%s", err, got)
	}
	// Without the encryption configuration, it says what is missing.
	raw := exec.Command(bin, "etcd", "get", "/registry/secrets/"+testNS+"/etcd-cmd", "--etcd-servers", cluster.EtcdURL)
	if got, err := raw.CombinedOutput(); err != nil || !strings.Contains(string(got), "give --encryption-provider-config") {
		t.Errorf("without the encryption config: %v\n%s", err, got)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
