package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/serve"
	"github.com/kproxy/kproxy/internal/stages"

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
use are accepted, reported and ignored. Any other unknown flag is an error.

Tracing follows the OTEL_* environment variables (OTEL_EXPORTER_OTLP_ENDPOINT,
OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_SERVICE_NAME, OTEL_TRACES_EXPORTER); the
--otlp-* flags override them. With no exporter configured nothing is
exported.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Log = newLogger(logLevel)
			serve.RouteKlog(o.Log)
			reportIgnored(cmd.Flags(), o.Log)
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
// flags to cmd, and lists them apart in --help. Every other kube-apiserver
// flag is accepted, hidden, and reported as unused (reportIgnored), so an
// apiserver's flag list can be handed over as is; any other flag is an
// error that names the nearest real one (a mistyped --token must never
// silently run as someone else).
func groupedFlags(cmd *cobra.Command, own, apiserver *pflag.FlagSet) {
	cmd.Flags().AddFlagSet(own)
	cmd.Flags().AddFlagSet(apiserver)
	stages.AddOtherAPIServerFlags(cmd.Flags())
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		if name, ok := strings.CutPrefix(err.Error(), "unknown flag: --"); ok {
			if near := nearestFlag(c.Flags(), name); near != "" {
				return fmt.Errorf("%w (did you mean --%s?); see %s --help", err, near, c.CommandPath())
			}
			return fmt.Errorf("%w: it is neither a kproxy flag nor a kube-apiserver flag; see %s --help", err, c.CommandPath())
		}
		return fmt.Errorf("%w; see %s --help", err, c.CommandPath())
	})
	cmd.SetUsageFunc(func(c *cobra.Command) error {
		w := c.OutOrStderr()
		fmt.Fprintf(w, "Usage:\n  %s\n\nkproxy flags:\n%s\n", c.UseLine(), own.FlagUsages())
		fmt.Fprintf(w, "kube-apiserver flags kproxy mirrors (parsed by kube-apiserver's own options; give them as the apiserver has them, or use --apiserver-manifest;\nother kube-apiserver flags are accepted and ignored):\n%s", apiserver.FlagUsages())
		return nil
	})
}

// nearestFlag is the visible flag whose name is closest to name, if it
// is close enough to be a typo.
func nearestFlag(fs *pflag.FlagSet, name string) string {
	best, bestD := "", 3
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		if d := editDistance(name, f.Name); d < bestD {
			best, bestD = f.Name, d
		}
	})
	return best
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
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

// reportIgnored names the kube-apiserver flags kproxy accepted without
// using them.
func reportIgnored(fs *pflag.FlagSet, log *slog.Logger) {
	if ignored := stages.GivenOtherAPIServerFlags(fs); len(ignored) > 0 {
		log.Info("kube-apiserver flags kproxy does not use (ignored)", "flags", strings.Join(ignored, " "))
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
