package serve

import (
	"os"

	"path/filepath"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

func TestValidate(t *testing.T) {
	good := func() Options { return Options{Mode: "reverse", Listen: "127.0.0.1:8443"} }
	for _, tc := range []struct {
		name   string
		mutate func(*Options)
		want   string
	}{
		{"ok", func(*Options) {}, ""},
		{"bad mode", func(o *Options) { o.Mode = "sideways" }, `--mode="sideways"`},
		{"half a certificate", func(o *Options) { o.TLSCertFile = "c.crt" }, "--tls-cert-file and --tls-private-key-file go together"},
		{"bad listen", func(o *Options) { o.Listen = "8443" }, `--listen="8443"`},
		{"http upstream", func(o *Options) { o.Upstream = "http://10.0.0.1:6443" }, `--upstream="http://10.0.0.1:6443"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := good()
			tc.mutate(&o)
			err := o.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestCertAuthenticatorErrorsNameTheFlag(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--client-ca-file=" + filepath.Join(dir, "missing.crt")}, "--client-ca-file="},
		{[]string{"--client-ca-file=" + notPEM}, "no PEM certificates"},
		{[]string{"--requestheader-client-ca-file=" + notPEM}, "--requestheader-client-ca-file="},
	} {
		o, _, err := apiserver.OptionsFromArgs(tc.args)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := certAuthenticator(o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.want)
		}
	}
}
