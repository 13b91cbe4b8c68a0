package flowapi

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/internal/filter"
	"github.com/kproxy/kproxy/internal/record"
)

// APIVersion is the apiVersion of the API's JSON documents.
const APIVersion = "kproxy.dev/v1alpha1"

// The API's paths.
const (
	PathFlows  = "/api/v1/flows"
	PathStream = "/api/v1/flows/stream"
	// PathReplayFilter is the running kproxy's replay filter: GET reads
	// it, PUT changes it (kproxy serve --replay-filter, without a
	// restart).
	PathReplayFilter = "/api/v1/replay-filter"
)

// ReplayFilter is the document of GET and PUT /api/v1/replay-filter.
type ReplayFilter struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Filter picks the requests kproxy replays, in the filter language
	// with a request's own terms only; "" replays every request.
	Filter string `json:"filter"`
}

// ReplayFilterer reads and changes the replay filter of a running kproxy.
// SetReplayFilter returns the filter now in force, normalised; an error
// whose Conflict method returns true means no filter can be set (the
// replay is off): the API answers 409; any other error is the filter's
// fault: 400.
type ReplayFilterer interface {
	ReplayFilter() string
	SetReplayFilter(expr string) (string, error)
}

// DefaultLimit is how many flows a list returns without ?limit.
const DefaultLimit = 500

// DefaultHeartbeat is how often an idle stream sends a comment, so that
// proxies and load balancers in between do not close it as idle.
const DefaultHeartbeat = 15 * time.Second

// DefaultWriteTimeout bounds one write to a stream's client: a client that
// reads nothing for this long is disconnected (it may resume with
// Last-Event-ID), rather than holding a goroutine and a socket forever.
const DefaultWriteTimeout = time.Minute

// Replayer re-runs kproxy's replay of a recorded flow now, without sending
// anything upstream, and returns the new record. An error whose NotFound
// method returns true means the flow is not (or no longer) available for
// re-running: the API answers 404 with its message.
type Replayer interface {
	Replay(ctx context.Context, id string) (*record.Record, error)
}

// HandlerOptions configure NewHandler.
type HandlerOptions struct {
	// Replay re-runs flows (POST .../replay); nil answers 501.
	Replay Replayer
	// ReplayFilter reads and changes the replay filter (GET and PUT
	// /api/v1/replay-filter); nil answers 501.
	ReplayFilter ReplayFilterer
	// Token, when set, is a bearer token every request must present
	// (compared in constant time), unless ClientCerts lets a client
	// certificate stand in for it.
	Token string
	// ClientCerts accepts a request whose TLS connection presented a
	// client certificate the server verified (tls.Config.ClientCAs). With
	// Token or ClientCerts set, unauthenticated requests get 401.
	ClientCerts bool
	// Heartbeat is the interval of a stream's keepalive comments
	// (DefaultHeartbeat when 0).
	Heartbeat time.Duration
	// WriteTimeout bounds each write to a stream (DefaultWriteTimeout
	// when 0).
	WriteTimeout time.Duration
	// Clock makes the heartbeat ticker and write deadlines (the real
	// clock when nil).
	Clock clock.WithTicker
	// Log receives operational messages.
	Log *slog.Logger
}

// FlowList is the answer to GET /api/v1/flows.
type FlowList struct {
	APIVersion string           `json:"apiVersion"`
	Kind       string           `json:"kind"`
	Items      []*record.Record `json:"items"`
	// Dropped is how many records the buffer has evicted so far (older
	// than the newest Capacity): they are no longer available here.
	Dropped uint64 `json:"dropped"`
	// Capacity is how many records the buffer keeps (the largest limit).
	Capacity int `json:"capacity"`
}

// Status is an error answer, shaped like Kubernetes' metav1.Status.
type Status struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Status     string         `json:"status"`
	Message    string         `json:"message"`
	Reason     string         `json:"reason"`
	Code       int            `json:"code"`
	Details    *StatusDetails `json:"details,omitempty"`
}

// StatusDetails name what an error is about.
type StatusDetails struct {
	// Name is the flow id, for errors about one flow.
	Name string `json:"name,omitempty"`
	// Field is the query parameter at fault; Position the 0-based offset
	// in its value where parsing failed, and Caret the value with a caret
	// under that offset.
	Field    string `json:"field,omitempty"`
	Position *int   `json:"position,omitempty"`
	Caret    string `json:"caret,omitempty"`
}

// MissedEvent is the data of a stream's "missed" event.
type MissedEvent struct {
	// Missed is how many records the stream skipped because they were
	// evicted before it could send them (a best estimate after an evicted
	// Last-Event-ID).
	Missed uint64 `json:"missed"`
}

type handler struct {
	buf  *Buffer
	opts HandlerOptions
	log  *slog.Logger
}

// NewHandler serves the flow API over buf:
//
//	GET  /api/v1/flows[?filter=EXPR&limit=N]   the newest matches, oldest first
//	GET  /api/v1/flows/{id}                    one flow
//	GET  /api/v1/flows/stream[?filter=EXPR&backlog=N&lastEventID=ID]
//	                                           Server-Sent Events
//	POST /api/v1/flows/{id}/replay             re-run a flow's replay now
//	GET  /api/v1/replay-filter                 the replay filter in force
//	PUT  /api/v1/replay-filter                 change it ({"filter": EXPR})
func NewHandler(buf *Buffer, opts HandlerOptions) http.Handler {
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = DefaultHeartbeat
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = DefaultWriteTimeout
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	h := &handler{buf: buf, opts: opts, log: opts.Log}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PathFlows, h.list)
	mux.HandleFunc("GET "+PathStream, h.stream)
	mux.HandleFunc("GET "+PathFlows+"/{id}", h.get)
	mux.HandleFunc("POST "+PathFlows+"/{id}/replay", h.replay)
	mux.HandleFunc("GET "+PathReplayFilter, h.replayFilter)
	mux.HandleFunc("PUT "+PathReplayFilter, h.replayFilter)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeStatus(w, http.StatusNotFound, "NotFound", fmt.Sprintf("no such endpoint: %s %s; the flow API serves GET %s, GET %s/{id}, GET %s, POST %s/{id}/replay, and GET and PUT %s",
			r.Method, r.URL.Path, PathFlows, PathFlows, PathStream, PathFlows, PathReplayFilter), nil)
	})
	if opts.Token == "" && !opts.ClientCerts {
		return loopbackHostOnly(mux)
	}
	return h.authenticate(mux)
}

// loopbackHostOnly refuses a plain-HTTP request whose Host is not a
// loopback address or localhost. With no client authentication, the API
// listens on loopback, where any local process may use it by design; a
// web page may too, through DNS rebinding: its own name, resolved to
// 127.0.0.1, in the Host header, and the browser lets it read what it
// gets (a probe read every flow, re-ran admin's, and changed the replay
// filter so). A browser cannot choose the Host, so a name that is not
// loopback's is refused. Over TLS the certificate's name is checked by
// the browser instead.
func loopbackHostOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil && !loopbackHost(r.Host) {
			writeStatus(w, http.StatusForbidden, "Forbidden", fmt.Sprintf("Host %q is not a loopback address: the kproxy flow API without client authentication answers requests for 127.0.0.1, [::1] or localhost only "+
				"(a web page could reach it under another name); use one of those in the URL, or protect the API with --api-token-file or --api-client-ca-file", r.Host), nil)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// loopbackHost reports a Host header naming localhost or a loopback IP.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, port, err := net.SplitHostPort(hostport); err == nil {
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return false // a port that is not one ("localhost:1.attacker.example")
		}
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// authenticate lets through requests with the bearer token or a verified
// client certificate.
func (h *handler) authenticate(next http.Handler) http.Handler {
	want := []byte(h.opts.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.opts.ClientCerts && r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
			next.ServeHTTP(w, r)
			return
		}
		if len(want) > 0 {
			scheme, got, _ := strings.Cut(r.Header.Get("Authorization"), " ")
			if strings.EqualFold(scheme, "Bearer") && subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), want) == 1 {
				next.ServeHTTP(w, r)
				return
			}
		}
		var how []string
		if len(want) > 0 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kproxy flow API"`)
			how = append(how, "an Authorization: Bearer header with the token in kproxy's --api-token-file")
		}
		if h.opts.ClientCerts {
			how = append(how, "a client certificate signed by kproxy's --api-client-ca-file")
		}
		writeStatus(w, http.StatusUnauthorized, "Unauthorized", "the kproxy flow API needs "+strings.Join(how, " or "), nil)
	})
}

func (h *handler) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	match, ok := parseFilter(w, q.Get("filter"))
	if !ok {
		return
	}
	limit := DefaultLimit
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			writeStatus(w, http.StatusBadRequest, "BadRequest", fmt.Sprintf("limit=%q: want a positive number of flows (at most %d, the buffer's size)", s, h.buf.Capacity()), &StatusDetails{Field: "limit"})
			return
		}
		limit = n
	}
	limit = min(limit, h.buf.Capacity())
	recs, last := h.buf.snapshot()
	writeJSON(w, http.StatusOK, FlowList{
		APIVersion: APIVersion, Kind: "FlowList",
		Items:    newest(recs, match, limit),
		Dropped:  last - uint64(len(recs)),
		Capacity: h.buf.Capacity(),
	})
}

func (h *handler) get(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	rec, ok := h.buf.Get(id)
	if !ok {
		writeStatus(w, http.StatusNotFound, "NotFound", h.notFound(id), &StatusDetails{Name: id})
		return
	}
	writeJSON(w, http.StatusOK, rec)
}

func (h *handler) notFound(id string) string {
	return fmt.Sprintf("flow %q is not in kproxy's buffer: it keeps the newest %d flows (--api-buffer), so it was evicted, or it never existed", id, h.buf.Capacity())
}

func (h *handler) replay(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if h.opts.Replay == nil {
		writeStatus(w, http.StatusNotImplemented, "NotImplemented",
			"this flow API cannot re-run flows: the server serving it has no replay attached (kproxy serve attaches its proxy)", &StatusDetails{Name: id})
		return
	}
	rec, err := h.opts.Replay.Replay(r.Context(), id)
	var nf interface{ NotFound() bool }
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, rec)
	case errors.As(err, &nf) && nf.NotFound():
		writeStatus(w, http.StatusNotFound, "NotFound", err.Error(), &StatusDetails{Name: id})
	case r.Context().Err() != nil:
		// The client went away; nobody reads an answer.
	default:
		h.log.Warn("flow re-run failed", "id", id, "error", err)
		writeStatus(w, http.StatusInternalServerError, "InternalError", fmt.Sprintf("re-running flow %q failed: %v", id, err), &StatusDetails{Name: id})
	}
}

// replayFilter reads (GET) or changes (PUT) the replay filter. A filter
// refused keeps the one in force.
func (h *handler) replayFilter(w http.ResponseWriter, r *http.Request) {
	rf := h.opts.ReplayFilter
	if rf == nil {
		writeStatus(w, http.StatusNotImplemented, "NotImplemented",
			"this flow API cannot read or change a replay filter: the server serving it has no replay attached (kproxy serve attaches its proxy)", nil)
		return
	}
	if r.Method == http.MethodGet {
		writeJSON(w, http.StatusOK, ReplayFilter{APIVersion: APIVersion, Kind: "ReplayFilter", Filter: rf.ReplayFilter()})
		return
	}
	var in ReplayFilter
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", fmt.Sprintf(`the body must be a ReplayFilter: {"filter": "EXPR"} ("" replays every request): %v`, err), nil)
		return
	}
	now, err := rf.SetReplayFilter(in.Filter)
	var conflict interface{ Conflict() bool }
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, ReplayFilter{APIVersion: APIVersion, Kind: "ReplayFilter", Filter: now})
	case errors.As(err, &conflict) && conflict.Conflict():
		writeStatus(w, http.StatusConflict, "Conflict", err.Error(), nil)
	default:
		writeFilterError(w, "replay filter", in.Filter, err)
	}
}

// writeFilterError answers 400 for a filter expr that err refuses: a
// syntax error with its position and caret.
func writeFilterError(w http.ResponseWriter, what, expr string, err error) {
	d := &StatusDetails{Field: "filter"}
	msg := fmt.Sprintf("invalid %s %q: %v", what, expr, err)
	var se *filter.SyntaxError
	if errors.As(err, &se) {
		// "filter: <what and how to fix> at position <column>", naming
		// what the filter is for
		msg = "invalid " + strings.Replace(se.Error(), "filter", what, 1)
		pos := se.Pos
		d.Position, d.Caret = &pos, se.Caret()
	}
	writeStatus(w, http.StatusBadRequest, "BadRequest", msg, d)
}

// stream serves Server-Sent Events: the backlog, then live records, each
// as one "flow" event with the record id as event id; "missed" events
// count what a slow client lost. Write never waits for this: the
// subscription is a cursor over the buffer.
func (h *handler) stream(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	match, ok := parseFilter(w, q.Get("filter"))
	if !ok {
		return
	}
	backlog := -1
	if s := q.Get("backlog"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			writeStatus(w, http.StatusBadRequest, "BadRequest", fmt.Sprintf("backlog=%q: want how many buffered flows to send first (0 for none)", s), &StatusDetails{Field: "backlog"})
			return
		}
		backlog = n
	}
	// EventSource sends Last-Event-ID on reconnecting; curl users can
	// give it as a query parameter.
	lastID := r.Header.Get("Last-Event-ID")
	if lastID == "" {
		lastID = q.Get("lastEventID")
	}
	sub, first := h.buf.Subscribe(Resume{AfterID: lastID, Backlog: backlog}, match)

	rc := http.NewResponseController(w)
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	s := &sseWriter{w: w, rc: rc, clock: h.opts.Clock, timeout: h.opts.WriteTimeout}
	// A comment first, so the client knows at once it is connected.
	if !s.comment("kproxy flow stream") {
		return
	}
	for _, rec := range first {
		if !s.flow(rec) {
			return
		}
	}
	ticker := h.opts.Clock.NewTicker(h.opts.Heartbeat)
	defer ticker.Stop()
	done := r.Context().Done()
	for {
		ev, ok, wait := sub.TryNext()
		if ok {
			if (ev.Record != nil && !s.flow(ev.Record)) || (ev.Record == nil && !s.missed(ev.Missed)) {
				return
			}
			continue
		}
		select {
		case <-wait:
		case <-ticker.C():
			if !s.comment("keepalive") {
				return
			}
		case <-done:
			return
		}
	}
}

// sseWriter writes and flushes one event at a time, each within a write
// deadline; false means the client is gone.
type sseWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	clock   clock.PassiveClock
	timeout time.Duration
	buf     []byte
}

func (s *sseWriter) send() bool {
	// A deadline per event: a client that stops reading is dropped after
	// timeout instead of pinning this goroutine. Servers that cannot set
	// one (ErrNotSupported) just block, as any handler would.
	_ = s.rc.SetWriteDeadline(s.clock.Now().Add(s.timeout))
	if _, err := s.w.Write(s.buf); err != nil {
		return false
	}
	return s.rc.Flush() == nil
}

func (s *sseWriter) flow(rec *record.Record) bool {
	data, err := json.Marshal(rec)
	if err != nil {
		return true // cannot happen for a record; skip rather than end the stream
	}
	s.buf = append(s.buf[:0], "id: "...)
	s.buf = append(s.buf, oneLine(rec.ID)...)
	s.buf = append(s.buf, "\nevent: flow\ndata: "...)
	s.buf = append(s.buf, data...)
	s.buf = append(s.buf, "\n\n"...)
	return s.send()
}

func (s *sseWriter) missed(n uint64) bool {
	data, _ := json.Marshal(MissedEvent{Missed: n})
	s.buf = append(append(append(s.buf[:0], "event: missed\ndata: "...), data...), "\n\n"...)
	return s.send()
}

func (s *sseWriter) comment(text string) bool {
	s.buf = append(append(append(s.buf[:0], ": "...), text...), "\n\n"...)
	return s.send()
}

// oneLine keeps an SSE field on one line whatever the id holds.
func oneLine(s string) string {
	return strings.NewReplacer("\r", "", "\n", "").Replace(s)
}

// parseFilter parses a filter expression, answering 400 with the parse
// error (and where it is) when it is not valid.
func parseFilter(w http.ResponseWriter, expr string) (func(*record.Record) bool, bool) {
	if strings.TrimSpace(expr) == "" {
		return nil, true
	}
	f, err := filter.Parse(expr)
	if err != nil {
		writeFilterError(w, "filter", expr, err)
		return nil, false
	}
	return f.Match, true
}

func writeStatus(w http.ResponseWriter, code int, reason, msg string, d *StatusDetails) {
	writeJSON(w, code, Status{APIVersion: APIVersion, Kind: "Status", Status: "Failure",
		Message: msg, Reason: reason, Code: code, Details: d})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encoding the answer: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}
