package metrics

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Server serves /metrics, in Prometheus's text format, on a listener of
// its own: plain HTTP, no authentication (what Prometheus scrapes by
// default), apart from the proxy's TLS listener and the flow API.
type Server struct {
	ln  net.Listener
	srv *http.Server
}

// Listen starts listening on addr (host:port; port 0 picks a free one)
// for scrapes of g, so that the address is known before Serve. It also
// answers a load balancer's health checks: /livez (kproxy is up) and
// /readyz (ready says why not; nil: ready).
func Listen(addr string, g prometheus.Gatherer, log *slog.Logger, ready func() error) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		// A scrape that cannot gather one collector still gets the rest.
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
	}))
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ready != nil {
			if err := ready(); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	return &Server{ln: ln, srv: srv}, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve serves scrapes until Close.
func (s *Server) Serve() error {
	if err := s.srv.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Close stops serving, letting scrapes in progress finish until ctx is
// done.
func (s *Server) Close(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	s.ln.Close() // when Serve never ran
	return err
}
