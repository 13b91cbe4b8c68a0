package apiserver

import (
	"net"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	_ "k8s.io/kubernetes/pkg/apis/core/install"

	kdecode "github.com/kproxy/kproxy/internal/decode"
)

func TestStoredKind(t *testing.T) {
	info, ok := runtime.SerializerInfoForMediaType(legacyscheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	if !ok {
		t.Fatal("no protobuf serializer")
	}
	pb, err := runtime.Encode(legacyscheme.Codecs.EncoderForVersion(info.Serializer, corev1.SchemeGroupVersion),
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		value []byte
		want  string
	}{
		{"protobuf envelope", pb, "v1 ConfigMap"},
		{"JSON custom resource", []byte(`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w"}}`), "example.com/v1 Widget"},
		{"JSON without a kind", []byte(`{"metadata":{}}`), ""},
		{"truncated protobuf", pb[:6], ""},
		{"encrypted", []byte("k8s:enc:aescbc:v1:key1:xxxx"), ""},
		{"empty", nil, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := storedKind(c.value); got != c.want {
				t.Errorf("storedKind = %q, want %q", got, c.want)
			}
		})
	}
}

func TestEncryptionPrefix(t *testing.T) {
	cases := []struct{ value, want string }{
		{"k8s:enc:aescbc:v1:key1:\x00\x01ciphertext", "k8s:enc:aescbc:v1:key1:"},
		{"k8s:enc:kms:v2:vault:\x0a\x0bproto", "k8s:enc:kms:v2:vault:"},
		{"k8s:enc:truncated", "k8s:enc:"},
	}
	for _, c := range cases {
		if got := kdecode.EncryptionPrefix([]byte(c.value)); got != c.want {
			t.Errorf("encryptionPrefix(%q) = %q, want %q", c.value, got, c.want)
		}
	}
}

func TestEtcdMaxRequestBytesFlag(t *testing.T) {
	cases := []struct {
		args    []string
		want    int
		wantErr string
	}{
		{nil, DefaultEtcdMaxRequestBytes, ""},
		{[]string{"--etcd-max-request-bytes=10485760"}, 10485760, ""},
		{[]string{"--etcd-max-request-bytes=0"}, 0, "--etcd-max-request-bytes=0: etcd's limit is a positive number of bytes"},
		{[]string{"--etcd-max-request-bytes=lots"}, 0, "lots"},
	}
	for _, c := range cases {
		// Only what Complete says of this flag matters here.
		o, _, err := OptionsFromArgs(c.args)
		if err == nil {
			err = o.Complete()
		}
		switch {
		case c.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%v: error %v, want one containing %q", c.args, err, c.wantErr)
			}
		case err != nil && strings.Contains(err.Error(), "etcd-max-request-bytes"):
			t.Errorf("%v: %v", c.args, err)
		case o.EtcdMaxRequestBytes != c.want:
			t.Errorf("%v: %d, want %d", c.args, o.EtcdMaxRequestBytes, c.want)
		}
	}
}

func TestDialAny(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + closed.Addr().String()
	closed.Close()
	cases := []struct {
		name      string
		endpoints []string
		wantErr   string
	}{
		{"listening", []string{"https://" + ln.Addr().String()}, ""},
		{"first refused, second listening", []string{refused, "http://" + ln.Addr().String()}, ""},
		{"refused", []string{refused}, "connection refused"},
		{"not a URL", []string{"127.0.0.1:2379"}, "not a URL"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := dialAny(c.endpoints)
			switch {
			case c.wantErr == "" && err != nil:
				t.Errorf("dialAny(%v) = %v", c.endpoints, err)
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
				t.Errorf("dialAny(%v) = %v, want an error with %q", c.endpoints, err, c.wantErr)
			}
		})
	}
}

// TestNewEtcdClientUnreachable: an etcd kproxy cannot reach is named at
// once (kproxy etcd get had waited out its 30 s deadline and said
// "context deadline exceeded").
func TestNewEtcdClientUnreachable(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + closed.Addr().String()
	closed.Close()
	for _, tc := range []struct {
		name      string
		endpoints []string
		want      []string
	}{
		{"none", nil, []string{"no etcd to read", "--apiserver-manifest"}},
		{"refused", []string{refused}, []string{"etcd [" + refused + "] is not reachable from kproxy", "connection refused", "check --etcd-servers"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			o.EtcdServers = tc.endpoints
			c, err := NewEtcdClient(o)
			if c != nil {
				c.Close()
			}
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("NewEtcdClient: %v, want an error containing %q", err, w)
				}
			}
		})
	}
}
