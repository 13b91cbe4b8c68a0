package kubeconfig

import (
	"strings"
	"testing"

	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

func sample() *clientcmdapi.Config {
	c := clientcmdapi.NewConfig()
	c.Clusters["prod"] = &clientcmdapi.Cluster{Server: "https://10.0.0.1:6443", CertificateAuthorityData: []byte("CLUSTER-CA"), TLSServerName: "api"}
	c.Clusters["dev"] = &clientcmdapi.Cluster{Server: "https://10.0.0.2:6443"}
	c.AuthInfos["me"] = &clientcmdapi.AuthInfo{Token: "tok"}
	c.Contexts["prod"] = &clientcmdapi.Context{Cluster: "prod", AuthInfo: "me", Namespace: "web"}
	c.Contexts["dev"] = &clientcmdapi.Context{Cluster: "dev", AuthInfo: "me"}
	c.CurrentContext = "prod"
	return c
}

func TestThroughKproxy(t *testing.T) {
	rev, err := ThroughKproxy(sample(), Options{Server: "https://127.0.0.1:8443", Mode: "reverse", KproxyCA: []byte("KPROXY-CA")})
	if err != nil {
		t.Fatal(err)
	}
	c := rev.Clusters["prod"]
	if c.Server != "https://127.0.0.1:8443" || string(c.CertificateAuthorityData) != "KPROXY-CA" || c.TLSServerName != "" {
		t.Errorf("reverse cluster: %+v", c)
	}
	if len(rev.Contexts) != 1 || rev.CurrentContext != "prod" || rev.AuthInfos["me"].Token != "tok" || rev.Contexts["prod"].Namespace != "web" {
		t.Errorf("reverse keeps only the context, with its user and namespace: %+v", rev)
	}

	fwd, err := ThroughKproxy(sample(), Options{Server: "https://127.0.0.1:8443", Mode: "forward", KproxyCA: []byte("KPROXY-CA")})
	if err != nil {
		t.Fatal(err)
	}
	c = fwd.Clusters["prod"]
	if c.Server != "https://10.0.0.1:6443" || c.ProxyURL != "http://127.0.0.1:8443" {
		t.Errorf("forward cluster: %+v", c)
	}
	if ca := string(c.CertificateAuthorityData); !strings.Contains(ca, "CLUSTER-CA") || !strings.Contains(ca, "KPROXY-CA") {
		t.Errorf("forward CA bundle %q must trust both", ca)
	}

	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Context: "nope", Server: "https://x:1"}, `context "nope" not found`},
		{Options{Server: "not a url"}, "want kproxy's URL"},
		{Options{Server: "https://x:1", Mode: "sideways"}, `--mode="sideways"`},
	} {
		if _, err := ThroughKproxy(sample(), tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.o, err, tc.want)
		}
	}
}
