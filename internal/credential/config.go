package credential

import (
	"crypto/tls"
	"fmt"
	"net/http"

	"k8s.io/client-go/rest"
)

// InConfig reports whether a client configuration (a kubeconfig's user)
// carries credentials of its own: a token or token file, a client
// certificate, basic auth, or an exec or auth-provider plugin.
func InConfig(cfg *rest.Config) bool {
	return cfg.BearerToken != "" || cfg.BearerTokenFile != "" || cfg.Username != "" || cfg.Password != "" ||
		len(cfg.CertData) > 0 || cfg.CertFile != "" || cfg.ExecProvider != nil || cfg.AuthProvider != nil
}

// FromConfig returns what a client built from cfg presents to the
// apiserver: the headers client-go adds (Authorization from a token, token
// file, exec or auth-provider plugin, or basic auth; Impersonate-* from the
// kubeconfig's "as" fields) and its client certificate, if any. It runs
// client-go's own transport wrappers, so the request is the one kubectl
// with that kubeconfig would send.
func FromConfig(cfg *rest.Config) (http.Header, *tls.Certificate, error) {
	capture := &capturing{}
	rt, err := rest.HTTPWrappersForConfig(cfg, capture)
	if err != nil {
		return nil, nil, fmt.Errorf("the kubeconfig's credentials: %w", err)
	}
	probe, _ := http.NewRequest(http.MethodGet, "https://kproxy.invalid/version", nil)
	resp, err := rt.RoundTrip(probe)
	if err != nil {
		return nil, nil, fmt.Errorf("the kubeconfig's credentials: %w", err)
	}
	resp.Body.Close()
	h := http.Header{}
	for k, v := range capture.header {
		switch {
		case k == "Authorization", len(k) > len("Impersonate-") && k[:len("Impersonate-")] == "Impersonate-":
			h[k] = v
		}
	}
	tc, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("the kubeconfig's client certificate: %w", err)
	}
	var cert *tls.Certificate
	switch {
	case tc == nil:
	case len(tc.Certificates) > 0:
		cert = &tc.Certificates[0]
	case tc.GetClientCertificate != nil:
		c, err := tc.GetClientCertificate(&tls.CertificateRequestInfo{})
		if err != nil {
			return nil, nil, fmt.Errorf("the kubeconfig's client certificate: %w", err)
		}
		if c != nil && len(c.Certificate) > 0 {
			cert = c
		}
	}
	return h, cert, nil
}

// capturing is the end of client-go's transport chain in FromConfig: it
// keeps the headers the chain set, and sends nothing.
type capturing struct{ header http.Header }

func (c *capturing) RoundTrip(r *http.Request) (*http.Response, error) {
	c.header = r.Header.Clone()
	return &http.Response{StatusCode: http.StatusNoContent, Body: http.NoBody, Request: r}, nil
}
