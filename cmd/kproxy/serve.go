package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kproxy/kproxy/internal/serve"
	"github.com/kproxy/kproxy/internal/stages"
	"sigs.k8s.io/yaml"

	corev1 "k8s.io/api/core/v1"
)

const kubeVersion = stages.KubernetesVersion

func newServeCommand() *cobra.Command {
	o := &serve.Options{APIServer: stages.NewAPIServerOptions()}
	var logLevel, manifest string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run kproxy in front of an apiserver",
		Long: `Run kproxy in front of an apiserver.

Reverse mode (default): point clients at kproxy with
  kproxy kubeconfig --from ~/.kube/config > kproxy.kubeconfig
Forward mode (--mode forward): clients keep their server URL and use kproxy
as their HTTPS proxy (HTTPS_PROXY, or proxy-url in the kubeconfig).

kproxy's own upstream identity comes from --upstream-kubeconfig (else
$KUBECONFIG or ~/.kube/config); it needs the ClusterRole in the README to
forward certificate callers by impersonation. Bearer tokens pass through
unchanged.

Flags named like kube-apiserver's mean the same as there, so the
apiserver's own flag list can be handed over as is: flags kproxy does not
use yet are reported and ignored (use the --flag=value form for those).

Tracing follows the OTEL_* environment variables (OTEL_EXPORTER_OTLP_ENDPOINT,
OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_SERVICE_NAME, OTEL_TRACES_EXPORTER); the
--otlp-* flags override them. With no exporter configured nothing is
exported.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Log = newLogger(logLevel)
			serve.RouteKlog(o.Log)
			reportIgnored(cmd, o.Log)
			if manifest != "" {
				args, err := manifestArgs(manifest)
				if err != nil {
					return err
				}
				ignored, err := o.APIServer.ParseAPIServerArgs(cmd.Flags(), args)
				if err != nil {
					return fmt.Errorf("--apiserver-manifest=%s: %w", manifest, err)
				}
				o.Log.Info("read the apiserver's flags from its manifest", "file", manifest, "ignored", len(ignored))
				o.Log.Debug("apiserver flags kproxy does not mirror", "flags", strings.Join(ignored, " "))
			}
			s, err := serve.New(cmd.Context(), o)
			if err != nil {
				return err
			}
			return s.Run(cmd.Context())
		},
	}
	cmd.FParseErrWhitelist.UnknownFlags = true
	own := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	addServeFlags(own, o)
	own.StringVar(&manifest, "apiserver-manifest", "", "kube-apiserver static-pod manifest (kubeadm: /etc/kubernetes/manifests/kube-apiserver.yaml): read the apiserver's flags from it; flags given here win")
	own.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	apiserver := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	o.APIServer.AddFlags(apiserver)
	groupedFlags(cmd, own, apiserver)
	return cmd
}

// groupedFlags adds kproxy's own flags and the mirrored kube-apiserver
// flags to cmd, and lists them apart in --help.
func groupedFlags(cmd *cobra.Command, own, apiserver *pflag.FlagSet) {
	cmd.Flags().AddFlagSet(own)
	cmd.Flags().AddFlagSet(apiserver)
	cmd.SetUsageFunc(func(c *cobra.Command) error {
		w := c.OutOrStderr()
		fmt.Fprintf(w, "Usage:\n  %s\n\nkproxy flags:\n%s\n", c.UseLine(), own.FlagUsages())
		fmt.Fprintf(w, "kube-apiserver flags kproxy mirrors (parsed by kube-apiserver's own options; give them as the apiserver has them, or use --apiserver-manifest):\n%s", apiserver.FlagUsages())
		return nil
	})
}

func addServeFlags(f *pflag.FlagSet, o *serve.Options) {
	f.StringVar(&o.Upstream, "upstream", "", "the apiserver's URL (default: the server of --upstream-kubeconfig)")
	f.StringVar(&o.UpstreamKubeconfig, "upstream-kubeconfig", "", "kubeconfig with kproxy's own credentials for the apiserver (default: $KUBECONFIG, then ~/.kube/config)")
	f.StringVar(&o.UpstreamContext, "upstream-context", "", "context in --upstream-kubeconfig (default: its current context)")
	f.StringVar(&o.Listen, "listen", "127.0.0.1:8443", "address to listen on")
	f.StringVar(&o.TLSCertFile, "tls-cert-file", "", "serving certificate (default: made with kproxy's CA)")
	f.StringVar(&o.TLSKeyFile, "tls-private-key-file", "", "serving certificate's key")
	f.StringVar(&o.PKIDir, "pki-dir", serve.DefaultPKIDir(), "directory of kproxy's CA (ca.crt, ca.key), created on first use")
	f.StringVar(&o.DebugAddr, "debug-addr", "", "serve Go's pprof and expvar on this address (e.g. 127.0.0.1:6060); off by default")
	f.StringVar(&o.Capture, "capture", "", "append one JSON record per request to this file (JSON Lines)")
	f.StringVar(&o.Mode, "mode", "reverse", "reverse (clients connect to kproxy) or forward (clients use kproxy as HTTPS proxy)")
	f.StringVar(&o.Telemetry.Endpoint, "otlp-endpoint", "", "OTLP endpoint for traces (overrides OTEL_EXPORTER_OTLP_ENDPOINT), e.g. http://127.0.0.1:4318 or 127.0.0.1:4317 with --otlp-protocol grpc")
	f.StringVar(&o.Telemetry.Protocol, "otlp-protocol", "", "grpc or http/protobuf (overrides OTEL_EXPORTER_OTLP_PROTOCOL; default http/protobuf)")
	o.Telemetry.Version = version
}

// reportIgnored names the flags kproxy accepted without using them, such as
// kube-apiserver flags it does not model yet.
func reportIgnored(cmd *cobra.Command, log *slog.Logger) {
	var ignored []string
	for _, a := range os.Args[1:] {
		if !strings.HasPrefix(a, "--") || a == "--" {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if cmd.Flags().Lookup(name) == nil && cmd.InheritedFlags().Lookup(name) == nil {
			ignored = append(ignored, "--"+name)
		}
	}
	if len(ignored) > 0 {
		log.Warn("ignoring flags kproxy does not use (yet)", "flags", strings.Join(ignored, " "))
	}
}

func newLogger(level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		fmt.Fprintf(os.Stderr, "kproxy: --log-level=%q is not a level (debug, info, warn, error); using info\n", level)
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}

// manifestArgs reads the kube-apiserver container's command line from a
// static-pod manifest.
func manifestArgs(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--apiserver-manifest: %w", err)
	}
	var pod corev1.Pod
	if err := yaml.Unmarshal(b, &pod); err != nil {
		return nil, fmt.Errorf("--apiserver-manifest=%s is not a Pod manifest: %w", path, err)
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == "kube-apiserver" || len(pod.Spec.Containers) == 1 {
			return append(append([]string{}, c.Command...), c.Args...), nil
		}
	}
	return nil, fmt.Errorf("--apiserver-manifest=%s has no kube-apiserver container", path)
}
