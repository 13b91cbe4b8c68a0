package localcluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Jaeger is a running Jaeger all-in-one (cmd/jaeger v1.76.0, in-memory
// storage) on free loopback ports.
type Jaeger struct {
	OTLPGRPC string // host:port
	OTLPHTTP string // http://host:port
	QueryURL string // http://host:port, the query API (/api/traces/{id})

	c *Cluster // reuses the process handling
}

// jaegerConfig is all-in-one.yaml trimmed to what the tests use, with every
// port chosen here so parallel runs do not collide.
const jaegerConfig = `service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: 127.0.0.1:%[1]d
    grpc:
      endpoint: 127.0.0.1:%[2]d
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 100000
  healthcheckv2:
    use_v2: true
    http:
      endpoint: 127.0.0.1:%[3]d
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:%[4]d
      http:
        endpoint: 127.0.0.1:%[5]d
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
`

// StartJaeger starts Jaeger and waits until its query API answers. dir
// holds its config and log; empty means a temp dir.
func StartJaeger(ctx context.Context, binDir, dir string, log io.Writer) (*Jaeger, error) {
	return startJaeger(ctx, binDir, dir, log, "")
}

// StartJaegerForwardingLogs starts Jaeger as the OpenTelemetry Collector
// it is built on, also taking OTLP logs on its OTLP endpoints and
// forwarding them, batched, to the OTLP/HTTP logs endpoint logsTo (a log
// store's): one collector fans in traces and logs, as a platform's does.
func StartJaegerForwardingLogs(ctx context.Context, binDir, dir string, log io.Writer, logsTo string) (*Jaeger, error) {
	return startJaeger(ctx, binDir, dir, log, logsTo)
}

func startJaeger(ctx context.Context, binDir, dir string, log io.Writer, logsTo string) (*Jaeger, error) {
	var err error
	if binDir == "" {
		if binDir, err = FindBinDir(); err != nil {
			return nil, err
		}
	}
	bin, err := Binary(binDir, "jaeger")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, log: log}
	if c.log == nil {
		c.log = io.Discard
	}
	if dir == "" {
		if c.Dir, err = os.MkdirTemp("", "kproxy-jaeger-"); err != nil {
			return nil, err
		}
		c.tmp = true
	}
	ports, err := FreePorts(5)
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(c.Dir, "jaeger.yaml")
	config := fmt.Sprintf(jaegerConfig, ports[0], ports[1], ports[2], ports[3], ports[4])
	if logsTo != "" {
		config = strings.Replace(config, "  pipelines:\n", "  pipelines:\n    logs:\n      receivers: [otlp]\n      processors: [batch]\n      exporters: [otlphttp/logs]\n", 1)
		config += fmt.Sprintf("  otlphttp/logs:\n    logs_endpoint: %s\n    compression: none\n", logsTo)
	}
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		return nil, err
	}
	j := &Jaeger{
		QueryURL: fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
		OTLPGRPC: fmt.Sprintf("127.0.0.1:%d", ports[3]),
		OTLPHTTP: fmt.Sprintf("http://127.0.0.1:%d", ports[4]),
		c:        c,
	}
	fmt.Fprintf(c.log, "starting jaeger (query %s, OTLP %s)\n", j.QueryURL, j.OTLPHTTP)
	if err := c.run("jaeger", bin, "--config", cfg); err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, fmt.Sprintf("http://127.0.0.1:%d/status", ports[2]), nil, time.Minute, c.procs[0]); err != nil {
		c.Stop()
		return nil, fmt.Errorf("jaeger did not become healthy: %w (log: %s)", err, c.procs[0].logf)
	}
	return j, nil
}

// PID is Jaeger's process id.
func (j *Jaeger) PID() int { return j.c.procs[0].cmd.Process.Pid }

// Stop ends Jaeger.
func (j *Jaeger) Stop() { j.c.Stop() }
