package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kproxy/kproxy/internal/kubeconfig"
	"github.com/kproxy/kproxy/internal/serve"
)

func newKubeconfigCommand() *cobra.Command {
	var o kubeconfig.Options
	var from, pkiDir string
	cmd := &cobra.Command{
		Use:   "kubeconfig",
		Short: "Print a kubeconfig that sends a context's requests through kproxy",
		Long: `Print a kubeconfig for one context (default: the current one) that sends its
requests through kproxy, keeping the user's credentials.

Reverse mode: the cluster's server becomes kproxy's address and its CA
becomes kproxy's CA. Forward mode: the server stays, proxy-url points at
kproxy, and kproxy's CA is added to the trusted CAs.

  kproxy kubeconfig --from ~/.kube/config > /tmp/kproxy.kubeconfig
  KUBECONFIG=/tmp/kproxy.kubeconfig kubectl get pods`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rules := clientcmd.NewDefaultClientConfigLoadingRules()
			if from != "" {
				rules.ExplicitPath = from
			}
			cfg, err := rules.Load()
			if err != nil {
				return fmt.Errorf("read kubeconfig: %w", err)
			}
			caPEM, err := os.ReadFile(filepath.Join(pkiDir, "ca.crt"))
			if err != nil {
				return fmt.Errorf("read kproxy's CA %s: %w (start `kproxy serve` once, or give --pki-dir)", filepath.Join(pkiDir, "ca.crt"), err)
			}
			o.KproxyCA = caPEM
			out, err := kubeconfig.ThroughKproxy(cfg, o)
			if err != nil {
				return err
			}
			b, err := clientcmd.Write(*out)
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(b)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&from, "from", "", "kubeconfig to start from (default: $KUBECONFIG, then ~/.kube/config)")
	f.StringVar(&o.Context, "context", "", "context to route through kproxy (default: the current context)")
	f.StringVar(&o.Server, "server", "https://127.0.0.1:8443", "kproxy's address (reverse mode: https URL; forward mode: the proxy URL is derived)")
	f.StringVar(&o.Mode, "mode", "reverse", "reverse or forward, as kproxy serve runs")
	f.StringVar(&pkiDir, "pki-dir", serve.DefaultPKIDir(), "directory of kproxy's CA")
	return cmd
}
