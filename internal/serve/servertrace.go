package serve

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/kproxy/kproxy/internal/auditlatency"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/servertrace"
	"github.com/kproxy/kproxy/internal/telemetry"
)

// DefaultServerTraceWait is --server-trace-wait's default.
const DefaultServerTraceWait = servertrace.DefaultWait

// maxServerTraceWait bounds --server-trace-wait: records are held in
// memory, and readers of the capture and the flow API wait, that long.
const maxServerTraceWait = time.Minute

// serverTraceOn reports whether kproxy receives the apiserver's spans.
func (o *Options) serverTraceOn() bool {
	return o.OTLPReceiverListen != "" && o.OTLPReceiverListen != "off"
}

// joinOn reports whether records wait for the apiserver's own account of
// their requests (its spans, or its audit events): only then is a joiner
// put in front of the sinks, so that without a source nothing is delayed.
func (o *Options) joinOn() bool { return o.serverTraceOn() || o.auditLatencyOn() }

func (o *Options) serverTraceWait() time.Duration {
	if o.ServerTraceWait == 0 {
		return DefaultServerTraceWait
	}
	return o.ServerTraceWait
}

// validateServerTrace checks --otlp-receiver-listen and
// --server-trace-wait.
func (o *Options) validateServerTrace() error {
	if o.ServerTraceWait < 0 || o.ServerTraceWait > maxServerTraceWait {
		return fmt.Errorf("--server-trace-wait=%v: want how long a record waits for the apiserver's own spans, e.g. %v (at most %v: records are held in memory that long)",
			o.ServerTraceWait, DefaultServerTraceWait, maxServerTraceWait)
	}
	if !o.serverTraceOn() {
		return nil
	}
	if _, _, err := net.SplitHostPort(o.OTLPReceiverListen); err != nil {
		return fmt.Errorf("--otlp-receiver-listen=%q: want host:port, e.g. 127.0.0.1:4317, or off (%v)", o.OTLPReceiverListen, err)
	}
	if ep := telemetry.EndpointHostPort(o.Telemetry, nil); sameAddress(ep, o.OTLPReceiverListen) {
		return fmt.Errorf("--otlp-receiver-listen=%s is also where kproxy exports its own traces (%s): kproxy would pass the apiserver's spans on to itself; "+
			"export kproxy's traces to a collector (--otlp-endpoint or OTEL_EXPORTER_OTLP_ENDPOINT) and point only the apiserver at the receiver", o.OTLPReceiverListen, ep)
	}
	return nil
}

// sameAddress reports two host:port addresses that reach the same
// listener on this machine.
func sameAddress(a, b string) bool {
	ha, pa, err1 := net.SplitHostPort(a)
	hb, pb, err2 := net.SplitHostPort(b)
	if err1 != nil || err2 != nil || pa != pb || pa == "0" {
		return false
	}
	local := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" || isLoopback(h) }
	return ha == hb || (local(ha) && local(hb))
}

// otlpReceiver is the listener of the apiserver's spans.
type otlpReceiver struct {
	r  *servertrace.Receiver
	ln net.Listener
}

// joinServerTrace puts the joiner in front of the sinks when a source of
// the apiserver's own account is configured (else it returns sinks as
// they are), and starts listening for the apiserver's spans. The joiner
// is closed (records still held written) after the receiver stops and
// before the capture file closes.
func (s *Server) joinServerTrace(ctx context.Context, sinks record.Sinks) (record.Sink, error) {
	o := s.opts
	if !o.joinOn() {
		return sinks, nil
	}
	jo := servertrace.JoinOptions{Wait: o.serverTraceWait(), Log: s.log}
	if !o.serverTraceOn() {
		// Audit annotations only: the apiserver writes them for requests
		// slower than auditlatency.Threshold, so faster ones never wait.
		jo.MinUpstream = auditlatency.Threshold
	}
	j := servertrace.NewJoiner(sinks, jo)
	s.Joiner = j
	s.shutdown = append(s.shutdown, func(context.Context) error {
		j.Close()
		st := j.Stats()
		s.log.Info("records joined to the apiserver's own account", "matched", st.Matched, "timedOut", st.TimedOut,
			"overflowed", st.Overflowed, "passedThrough", st.PassedThrough, "unmatchedObservations", st.Unmatched)
		return nil
	})
	if o.serverTraceOn() {
		if err := s.listenOTLP(ctx, j); err != nil {
			return nil, err
		}
	}
	return j, nil
}

// listenOTLP starts listening for the apiserver's spans (served by Run),
// passing them on to kproxy's own exporter endpoint.
func (s *Server) listenOTLP(ctx context.Context, j *servertrace.Joiner) error {
	o := s.opts
	client, err := telemetry.Client(o.Telemetry, nil)
	if err != nil {
		return fmt.Errorf("passing the apiserver's spans on to kproxy's OTLP endpoint: %w", err)
	}
	r, err := servertrace.NewReceiver(ctx, servertrace.ReceiverOptions{Join: j, Forward: client, Secrets: s.heldSecrets, Log: s.log})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.OTLPReceiverListen)
	if err != nil {
		_ = r.Stop(ctx)
		return fmt.Errorf("--otlp-receiver-listen=%s: %w (give another address, or off)", o.OTLPReceiverListen, err)
	}
	s.otlp = &otlpReceiver{r: r, ln: ln}
	s.OTLPReceiverAddr = ln.Addr().String()
	s.shutdown = append(s.shutdown, s.otlp.stop(s.log))
	forward := "nowhere: kproxy exports no traces (give --otlp-endpoint to have a collector get them too)"
	if client != nil {
		forward = telemetry.Describe(o.Telemetry, nil)
	}
	s.log.Info("receiving the apiserver's own spans (OTLP/gRPC): point its --tracing-config-file endpoint here",
		"addr", s.OTLPReceiverAddr, "passedOnTo", forward, "recordsWait", o.serverTraceWait())
	if host, _, _ := net.SplitHostPort(o.OTLPReceiverListen); !isLoopback(host) {
		s.log.Warn("the OTLP receiver listens beyond loopback, as plain gRPC without authentication (the apiserver's exporter speaks nothing else): "+
			"whoever reaches it can add spans to kproxy's records and to the traces it passes on; keep it on a network only the apiserver reaches",
			"addr", s.OTLPReceiverAddr)
	}
	return nil
}

func (a *otlpReceiver) serve(log *slog.Logger) {
	if err := a.r.Serve(a.ln); err != nil {
		log.Error("OTLP receiver stopped", "error", err)
	}
}

// stop stops serving and passes on what is queued, for at most 5s.
func (a *otlpReceiver) stop(log *slog.Logger) func(context.Context) error {
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		err := a.r.Stop(ctx)
		a.ln.Close() // when Serve never ran
		st := a.r.Stats()
		log.Info("OTLP receiver stopped", "requests", st.Requests, "spans", st.Spans, "observations", st.Observations,
			"evictedSpans", st.Evicted, "forwardedBatches", st.Forwarded, "droppedBatches", st.ForwardDropped, "failedBatches", st.ForwardFailed)
		return err
	}
}
