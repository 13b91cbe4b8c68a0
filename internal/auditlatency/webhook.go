package auditlatency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"

	"github.com/kproxy/kproxy/internal/servertrace"
)

// Defaults of WebhookOptions.
const (
	// DefaultMaxBodyBytes bounds one batch. The apiserver sends at most
	// 400 events a batch (--audit-webhook-batch-max-size); at level
	// Metadata that is well under 1 MiB, and with
	// --audit-webhook-truncate-enabled at most 10 MiB.
	DefaultMaxBodyBytes = 64 << 20
	// DefaultQueue is how many observations wait for the joiner.
	DefaultQueue = 4096
)

// WebhookOptions tune a Webhook; the zero value is usable.
type WebhookOptions struct {
	MaxBodyBytes int64 // 0: DefaultMaxBodyBytes
	Queue        int   // 0: DefaultQueue
	Log          *slog.Logger
}

// Webhook receives the apiserver's audit webhook backend: each POST is a
// batch, an audit.k8s.io/v1 EventList in JSON (what the backend sends;
// protobuf and YAML are read too), and is answered 200 as soon as it is
// decoded. Each ResponseComplete event with latency annotations becomes
// an observation, handed to offer by Run through a bounded queue: the
// apiserver's audit backend never waits for the joiner, and when the
// queue is full the observation is dropped and counted.
//
// Any URL path is accepted: the kubeconfig the apiserver reads
// (--audit-webhook-config-file) names the server, e.g.
// https://kproxy.example:7071/audit.
type Webhook struct {
	offer func(servertrace.Observation)
	dec   *decoder
	max   int64
	queue chan servertrace.Observation
	stats Stats
	log   *slog.Logger
	// warned is set once a dropped observation has been logged.
	warned atomic.Bool
}

// NewWebhook makes the handler; Run hands its observations to offer.
func NewWebhook(offer func(servertrace.Observation), o WebhookOptions) *Webhook {
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.Queue <= 0 {
		o.Queue = DefaultQueue
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return &Webhook{offer: offer, dec: newDecoder(), max: o.MaxBodyBytes,
		queue: make(chan servertrace.Observation, o.Queue), log: o.Log}
}

// Run offers the queued observations until ctx ends.
func (w *Webhook) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case o := <-w.queue:
			w.offer(o)
		}
	}
}

// Counts returns what the webhook has received so far.
func (w *Webhook) Counts() Counts { return w.stats.Counts() }

// ServeHTTP implements http.Handler.
func (w *Webhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		rw.Header().Set("Allow", http.MethodPost)
		http.Error(rw, "kproxy's audit webhook takes POSTs of audit.k8s.io/v1 EventList from the apiserver's audit webhook backend (--audit-webhook-config-file)", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, w.max))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		w.stats.skipped.Add(1)
		msg := fmt.Sprintf("audit batch over kproxy's limit of %d MiB: lower --audit-webhook-batch-max-size, or set --audit-webhook-truncate-enabled, "+
			"or audit at level Metadata (latency annotations need no request or response bodies)", w.max>>20)
		w.log.Warn("audit webhook: batch refused", "why", msg, "from", r.RemoteAddr)
		http.Error(rw, msg, http.StatusRequestEntityTooLarge)
		return
	case err != nil:
		w.stats.skipped.Add(1)
		http.Error(rw, "reading the audit batch: "+err.Error(), http.StatusBadRequest)
		return
	}
	events, err := w.dec.events(body)
	if err != nil {
		w.stats.skipped.Add(1)
		msg := fmt.Sprintf("not an audit.k8s.io/v1 EventList (%v): point only the apiserver's audit webhook backend here, with --audit-webhook-version=audit.k8s.io/v1", err)
		w.log.Warn("audit webhook: batch refused", "why", msg, "from", r.RemoteAddr, "contentType", r.Header.Get("Content-Type"))
		http.Error(rw, msg, http.StatusBadRequest)
		return
	}
	w.stats.events.Add(int64(len(events)))
	for i := range events {
		o, ok := observe(&events[i])
		if !ok {
			continue
		}
		select {
		case w.queue <- o:
			w.stats.observations.Add(1)
		default:
			w.stats.dropped.Add(1)
			if !w.warned.Swap(true) {
				w.log.Warn("audit webhook: the joiner is not keeping up; dropping audit latency observations (counted)", "queue", cap(w.queue))
			}
		}
	}
	rw.WriteHeader(http.StatusOK)
}
