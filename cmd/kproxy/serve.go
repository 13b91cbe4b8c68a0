package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel"

	"github.com/kproxy/kproxy/internal/logging"
	"github.com/kproxy/kproxy/internal/serve"
	"github.com/kproxy/kproxy/internal/stages"
)

const kubeVersion = stages.KubernetesVersion

func newServeCommand() *cobra.Command {
	a := newAPIServerConfig()
	o := &serve.Options{APIServer: a.opts}
	var logLevel string
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
			// The OpenTelemetry SDK reports export failures through its
			// process-wide handler: one structured line per window, not
			// one unstructured line per failed batch.
			exportLog := slog.New(logging.RateLimit(o.Log.Handler(), logging.DefaultWindow, nil))
			otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { exportLog.Warn(exportFailed(err), "error", err) }))
			serve.RouteKlog(o.Log)
			if err := a.load(o.Log, false); err != nil {
				return err
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
	own.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	a.addFlags(cmd, own, "kube-apiserver static-pod manifest (kubeadm: /etc/kubernetes/manifests/kube-apiserver.yaml): read the apiserver's flags from it; flags given here win", true)
	return cmd
}

func addServeFlags(f *pflag.FlagSet, o *serve.Options) {
	f.StringVar(&o.Upstream, "upstream", "", "the apiserver's URL (default: the server of --upstream-kubeconfig)")
	f.StringVar(&o.UpstreamKubeconfig, "upstream-kubeconfig", "", "kubeconfig with kproxy's own credentials for the apiserver (default: $KUBECONFIG, then ~/.kube/config)")
	f.StringVar(&o.UpstreamContext, "upstream-context", "", "context in --upstream-kubeconfig (default: its current context)")
	f.StringVar(&o.Listen, "listen", "127.0.0.1:8443", "address to listen on")
	f.StringVar(&o.TLSCertFile, "tls-cert-file", "", "serving certificate (default: made with kproxy's CA)")
	f.StringVar(&o.TLSKeyFile, "tls-private-key-file", "", "serving certificate's key")
	f.StringVar(&o.PKIDir, "pki-dir", serve.DefaultPKIDir(), "directory of kproxy's CA (ca.crt, ca.key), created on first use")
	f.DurationVar(&o.ShutdownDelay, "shutdown-delay", 0, "told to stop, keep serving this long with /readyz answering 503 before refusing new connections, so a load balancer takes the replica out first (as kube-apiserver's --shutdown-delay-duration)")
	f.StringVar(&o.DebugAddr, "debug-addr", "", "serve Go's pprof and expvar on this address (e.g. 127.0.0.1:6060); off by default")
	f.StringVar(&o.Capture, "capture", "", "append one JSON record per request to this file (JSON Lines), or - for standard output (kproxy logs to standard error)")
	f.DurationVar(&o.BodyIdleTimeout, "request-body-idle-timeout", time.Minute, "end a request whose body stops arriving for this long (a client that never finishes its body holds a connection otherwise); 0 for no limit")
	f.IntVar(&o.MaxConnections, "max-connections", 0, "client connections kproxy holds at once; past it, new ones wait to be accepted (0: no limit)")
	f.Var(mebibytes{bytes: &o.CaptureRotation.MaxSize, zero: true}, "capture-maxsize", "rotate the --capture file when it would pass this size in MiB, as kube-apiserver's --audit-log-maxsize: it is renamed FILE-TIME.EXT (TIME in UTC, 2006-01-02T15-04-05.000) and a new one started (default 0: never)")
	f.IntVar(&o.CaptureRotation.MaxBackups, "capture-maxbackup", 0, "with --capture-maxsize: how many rotated capture files to keep, the newest (0: all)")
	f.Var(days{&o.CaptureRotation.MaxAge}, "capture-maxage", "with --capture-maxsize: remove rotated capture files older than this many days, by the time in their names (0: keep)")
	f.BoolVar(&o.CaptureRotation.Compress, "capture-compress", false, "with --capture-maxsize: gzip rotated capture files (FILE-TIME.EXT.gz; kproxy flows and kproxy tui read them as they are)")
	f.BoolVar(&o.CaptureBodies, "capture-bodies", false, "also record each write's body (as JSON; Secret data, tokens and keys redacted) and its Impersonate-* headers")
	f.StringVar(&o.Mode, "mode", "reverse", "reverse (clients connect to kproxy) or forward (clients use kproxy as HTTPS proxy)")
	f.StringVar(&o.Telemetry.Endpoint, "otlp-endpoint", "", "OTLP endpoint for traces (overrides OTEL_EXPORTER_OTLP_ENDPOINT), e.g. http://127.0.0.1:4318 or 127.0.0.1:4317 with --otlp-protocol grpc")
	f.BoolVar(&o.OTLPLogs, "otlp-logs", false, "also export every record as an OpenTelemetry log record over OTLP/HTTP (as OTEL_LOGS_EXPORTER=otlp does), to --otlp-endpoint or OTEL_EXPORTER_OTLP_LOGS_ENDPOINT: a collector fans in the records of several replicas beside their traces")
	f.StringVar(&o.Telemetry.Protocol, "otlp-protocol", "", "grpc or http/protobuf (overrides OTEL_EXPORTER_OTLP_PROTOCOL; default http/protobuf)")
	f.StringVar(&o.APIListen, "api-listen", serve.DefaultAPIListen, "address of the flow API (list, stream and re-run recorded flows; see the README), or off; off loopback it needs --api-tls-* and --api-client-ca-file or --api-token-file")
	f.IntVar(&o.APIBuffer, "api-buffer", serve.DefaultAPIBuffer, "how many of the newest flows the flow API keeps in memory")
	f.StringVar(&o.APITLSCertFile, "api-tls-cert-file", "", "the flow API's serving certificate (required off loopback)")
	f.StringVar(&o.APITLSKeyFile, "api-tls-private-key-file", "", "the flow API's serving certificate's key")
	f.StringVar(&o.APIClientCAFile, "api-client-ca-file", "", "flow API clients must present a certificate signed by this CA (or the --api-token-file token)")
	f.StringVar(&o.APITokenFile, "api-token-file", "", "flow API clients must send this file's content as a bearer token (or a certificate for --api-client-ca-file)")
	f.IntVar(&o.APIRerunKeep, "api-rerun-keep", serve.DefaultAPIRerunKeep, "how many of the newest flows the flow API can re-run; their requests, credentials included, are kept in memory only (never written), and only while the API is on; 0 turns re-runs off")
	f.Var(mebibytes{bytes: &o.APIRerunKeepBytes}, "api-rerun-keep-mib", "bound, in MiB, on the request bodies kept for re-runs (default 16)")
	f.BoolVar(&o.LogFlows, "log-flows", false, "log one line per finished flow: method, path, user, predicted status@stage, actual status, agreement, latency")
	f.StringVar(&o.OTLPReceiverListen, "otlp-receiver-listen", "", "receive the apiserver's own spans (OTLP/gRPC) on this address, e.g. 127.0.0.1:4317, and record where each request spent its time in the apiserver (server.layers); point the endpoint of the apiserver's --tracing-config-file here (see the README); the spans are passed on to kproxy's own OTLP endpoint; off by default")
	f.DurationVar(&o.ServerTraceWait, "server-trace-wait", serve.DefaultServerTraceWait, "with --otlp-receiver-listen, --audit-webhook-listen or --audit-log-follow: how long a record waits for the apiserver's own account of its request (spans or audit annotations) before it is written without it")
	f.StringVar(&o.AuditWebhookListen, "audit-webhook-listen", "", "receive the apiserver's audit webhook backend on this address, e.g. 127.0.0.1:7071, and record where each slow request (over 500ms: the only ones the apiserver annotates) spent its time in the apiserver, from its apiserver.latency.k8s.io audit annotations (server.source audit); point the server of the apiserver's --audit-webhook-config-file here, with --audit-webhook-batch-max-wait below --server-trace-wait (see the README); off loopback it needs --audit-webhook-tls-*; off by default")
	f.StringVar(&o.AuditWebhookTLSCertFile, "audit-webhook-tls-cert-file", "", "the audit webhook's serving certificate (required off loopback; the apiserver's --audit-webhook-config-file must trust its CA)")
	f.StringVar(&o.AuditWebhookTLSKeyFile, "audit-webhook-tls-private-key-file", "", "the audit webhook's serving certificate's key")
	f.StringVar(&o.AuditWebhookClientCAFile, "audit-webhook-client-ca-file", "", "the apiserver must present a client certificate signed by this CA to the audit webhook (its --audit-webhook-config-file names the certificate)")
	f.StringVar(&o.AuditLogFollow, "audit-log-follow", "", "follow the apiserver's JSON audit log (its --audit-log-path, --audit-log-format=json) as tail -F does, through rotations, from its end, for the same latency annotations as --audit-webhook-listen; kproxy must be able to read the file")
	f.StringVar(&o.MetricsListen, "metrics-listen", "", "serve kproxy's own Prometheus metrics (/metrics: requests, replays run and shed, stage durations, prediction agreement, records, the replay pool) on this address, e.g. 127.0.0.1:9090; plain HTTP, counts only; off by default")
	f.StringVar(&o.Replica, "replica", "", "this kproxy's name in its records (record field replica), when several run behind one load balancer, e.g. --replica=$(POD_NAME)")
	f.IntVar(&o.ReplayWorkers, "replay-workers", 0, "how many replays run at once (0: one per CPU, GOMAXPROCS); past them and --replay-queue a request is still forwarded and recorded, its prediction unknown (replay shed)")
	f.IntVar(&o.ReplayNice, "replay-nice", 0, "on Linux, run the replays at this nice value (1 to 19; 0: kproxy's own priority), so that they take only the CPU the apiserver, etcd and forwarding leave; on saturated CPUs a held-back replay can stall kproxy's garbage collector, and forwarding with it, for tens of milliseconds (README: Replay pool and metrics)")
	f.Float64Var(&o.ReplayCPUPressure, "replay-cpu-pressure", serve.DefaultReplayCPUPressure, "while more requests wait for their answer than kproxy has CPUs and some task on the machine waited for a CPU this percent of the time or more (Linux PSI, /proc/pressure/cpu), the replay yields to forwarding and to the apiserver: one worker replays, resting between replays, and the requests it cannot replay are shed (forwarded and recorded, prediction unknown); 0 replays at full speed whatever the pressure")
	f.Var(mebibytes{bytes: &o.ReplayBodyBudget}, "replay-body-budget-mib", fmt.Sprintf("bound, in MiB, on the request bodies held for replays at once (default %d); past it a write is still forwarded and recorded, its prediction unknown (replay shed)", serve.DefaultReplayBodyBudget>>20))
	f.IntVar(&o.ReplayQueue, "replay-queue", 0, "how many replays may wait for a free replay worker (0: 16 per worker); each holds a copy of its request, body included")
	f.Var(inverted{&o.NoReplay}, "replay", "replay each request through the apiserver's stages to predict its outcome; --replay=false only forwards and records (every prediction unknown) and reads nothing of the cluster for the replay")
	f.Lookup("replay").NoOptDefVal = "true"
	f.StringVar(&o.ReplayFilter, "replay-filter", "", "replay only the requests the filter `EXPR` picks, e.g. '~n payments', '!~v get & !~v list & !~v watch' (writes only) or '~u system:serviceaccount:ci:*'; the others are forwarded, recorded and traced, their prediction unknown (\"not replayed\"), at little more than a plain proxy's cost; the flow filter language (kproxy flows --help) with a request's own terms only: ~u ~g ~v ~r ~n ~m ~p and words of the path (default: replay every request)")
	o.Telemetry.Version = version
}

// inverted is a boolean flag held negated, so that the zero value of the
// option it sets (NoReplay) is the flag's default (true).
type inverted struct{ b *bool }

func (v inverted) String() string { return strconv.FormatBool(v.b == nil || !*v.b) }

func (v inverted) Set(s string) error {
	on, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("want true or false")
	}
	*v.b = !on
	return nil
}

func (inverted) Type() string { return "bool" }

// mebibytes is a size flag given in MiB, held in bytes.
type mebibytes struct {
	bytes *int64
	// zero allows 0, the flag's "off".
	zero bool
}

func (m mebibytes) String() string {
	if m.bytes == nil || *m.bytes == 0 {
		return "0"
	}
	return strconv.FormatInt(*m.bytes>>20, 10)
}

func (m mebibytes) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	switch {
	case m.zero && err == nil && n == 0:
	case err != nil || n <= 0 || n > 1<<20:
		if m.zero {
			return fmt.Errorf("want a number of MiB, e.g. 64 (0: off)")
		}
		return fmt.Errorf("want a positive number of MiB, e.g. 64")
	}
	*m.bytes = n << 20
	return nil
}

func (mebibytes) Type() string { return "MiB" }

// days is a whole number of days, held as a duration.
type days struct{ d *time.Duration }

func (v days) String() string {
	if v.d == nil {
		return "0"
	}
	return strconv.FormatInt(int64(*v.d/(24*time.Hour)), 10)
}

func (v days) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > 100*365 {
		return fmt.Errorf("want a whole number of days, e.g. 7 (0: keep)")
	}
	*v.d = time.Duration(n) * 24 * time.Hour
	return nil
}

func (days) Type() string { return "days" }

func newLogger(level string) *slog.Logger { return newLoggerTo(os.Stderr, level) }

// newLoggerTo is newLogger writing to w.
func newLoggerTo(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		fmt.Fprintf(w, "kproxy: --log-level=%q is not a level (debug, info, warn, error); using info\n", level)
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

// exportFailed says what an OpenTelemetry export error is about, and what
// to check: the SDK's one handler hears the trace exporter's errors and
// the record log exporter's alike (found by a probe: a collector without
// a logs pipeline answered 404 to every record, logged as "trace export
// failed").
func exportFailed(err error) string {
	what, flag := "trace", "--otlp-endpoint (or OTEL_EXPORTER_OTLP_ENDPOINT)"
	if strings.Contains(err.Error(), "logs") {
		what, flag = "record (OTLP logs)", "--otlp-logs: the collector must accept OTLP logs (Jaeger does not; an OpenTelemetry Collector with a logs pipeline does)"
	}
	return what + " export failed: spans or records are dropped until the collector answers; check " + flag
}
