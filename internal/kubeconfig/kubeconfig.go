// Package kubeconfig rewrites a user's kubeconfig so that one context's
// requests go through kproxy, keeping the user's credentials.
package kubeconfig

import (
	"bytes"
	"fmt"
	"net/url"
	"os"

	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Options choose the context and how it reaches kproxy.
type Options struct {
	Context  string // empty: current context
	Server   string // kproxy's URL, https://host:port
	Mode     string // reverse | forward
	KproxyCA []byte // PEM
}

// ThroughKproxy returns a kubeconfig holding only the chosen context, its
// user (unchanged) and its cluster routed through kproxy. File references
// in the user entry are kept as paths (they stay valid on this machine).
func ThroughKproxy(in *clientcmdapi.Config, o Options) (*clientcmdapi.Config, error) {
	name := o.Context
	if name == "" {
		name = in.CurrentContext
	}
	ctx, ok := in.Contexts[name]
	if !ok || ctx == nil {
		return nil, fmt.Errorf("context %q not found in the kubeconfig (give --context)", name)
	}
	cluster, ok := in.Clusters[ctx.Cluster]
	if !ok || cluster == nil {
		return nil, fmt.Errorf("context %q names cluster %q, which the kubeconfig does not define", name, ctx.Cluster)
	}
	su, err := url.Parse(o.Server)
	if err != nil || su.Host == "" {
		return nil, fmt.Errorf("--server=%q: want kproxy's URL, e.g. https://127.0.0.1:8443", o.Server)
	}
	out := clientcmdapi.NewConfig()
	c := cluster.DeepCopy()
	switch o.Mode {
	case "reverse", "":
		c.Server = "https://" + su.Host
		c.CertificateAuthority, c.CertificateAuthorityData = "", o.KproxyCA
		c.TLSServerName = ""
		c.InsecureSkipTLSVerify = false
		c.ProxyURL = ""
	case "forward":
		ca := cluster.CertificateAuthorityData
		if len(ca) == 0 && cluster.CertificateAuthority != "" {
			if ca, err = os.ReadFile(cluster.CertificateAuthority); err != nil {
				return nil, fmt.Errorf("read the cluster's CA: %w", err)
			}
		}
		// kproxy terminates TLS with a certificate from its own CA; the
		// cluster's CA stays trusted for when kproxy is not in the path.
		c.CertificateAuthority = ""
		c.CertificateAuthorityData = append(append(bytes.TrimSpace(ca), '\n'), o.KproxyCA...)
		c.ProxyURL = "http://" + su.Host
	default:
		return nil, fmt.Errorf("--mode=%q: use reverse or forward", o.Mode)
	}
	out.Clusters[ctx.Cluster] = c
	if u, ok := in.AuthInfos[ctx.AuthInfo]; ok && u != nil {
		out.AuthInfos[ctx.AuthInfo] = u.DeepCopy()
	}
	out.Contexts[name] = ctx.DeepCopy()
	out.CurrentContext = name
	return out, nil
}
