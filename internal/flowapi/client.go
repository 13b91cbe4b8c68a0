package flowapi

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kproxy/kproxy/internal/record"
)

// ClientOptions configure a Client.
type ClientOptions struct {
	// Token is sent as a bearer token (kproxy's --api-token-file).
	Token string
	// CAFile verifies the API's serving certificate (https only); the
	// system roots when empty.
	CAFile string
	// CertFile and KeyFile are a client certificate for an API that asks
	// for one (kproxy's --api-client-ca-file).
	CertFile, KeyFile string
	// HTTPClient replaces the client built from the options above (its
	// Timeout must be 0: streams are long-lived).
	HTTPClient *http.Client
	// Backoff spaces reconnection attempts of Stream; by default 250ms
	// doubling up to 5s, with jitter.
	Backoff *wait.Backoff
	// Sleep waits between reconnection attempts; it returns early with
	// ctx's error. Tests inject one; by default a timer.
	Sleep func(ctx context.Context, d time.Duration) error
}

// Client talks to a kproxy flow API (`kproxy serve --api-listen`).
type Client struct {
	base    *url.URL
	hc      *http.Client
	token   string
	backoff wait.Backoff
	sleep   func(context.Context, time.Duration) error
	// certAsked: a server asked for a client certificate we lack.
	certAsked atomic.Bool
}

// DefaultBackoff is the reconnection backoff of Client.Stream.
func DefaultBackoff() wait.Backoff {
	return wait.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 1 << 30, Cap: 5 * time.Second}
}

// NewClient makes a client for the API at baseURL, e.g.
// http://127.0.0.1:7070 (a bare host:port means http).
func NewClient(baseURL string, opts ClientOptions) (*Client, error) {
	if !strings.Contains(baseURL, "://") {
		baseURL = "http://" + baseURL
	}
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("flow API address %q: want http://HOST:PORT or https://HOST:PORT, the address `kproxy serve --api-listen` logs as \"flow API listening\"", baseURL)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	c := &Client{base: u, hc: opts.HTTPClient, token: opts.Token, sleep: opts.Sleep}
	if c.hc == nil {
		if c.hc, err = httpClient(u, opts, &c.certAsked); err != nil {
			return nil, err
		}
	}
	if opts.Backoff != nil {
		c.backoff = *opts.Backoff
	} else {
		c.backoff = DefaultBackoff()
	}
	if c.sleep == nil {
		c.sleep = sleep
	}
	return c, nil
}

// certAsked is set when a server asked for a client certificate this
// client does not have: over TLS 1.3 its refusal arrives after the
// handshake, as a reset or broken pipe that does not say why.
func httpClient(u *url.URL, opts ClientOptions, certAsked *atomic.Bool) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// The API is addressed directly, never through an environment proxy.
	tr.Proxy = nil
	if u.Scheme == "https" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if opts.CAFile != "" {
			b, err := os.ReadFile(opts.CAFile)
			if err != nil {
				return nil, fmt.Errorf("flow API CA file: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(b) {
				return nil, fmt.Errorf("flow API CA file %s: no PEM certificates in it", opts.CAFile)
			}
		}
		if (opts.CertFile == "") != (opts.KeyFile == "") {
			return nil, errors.New("a client certificate needs both its certificate file and its key file")
		}
		if opts.CertFile != "" {
			cert, err := tls.LoadX509KeyPair(opts.CertFile, opts.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("flow API client certificate: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		} else {
			tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				certAsked.Store(true)
				return &tls.Certificate{}, nil // none: the server decides
			}
		}
		tr.TLSClientConfig = tc
	} else if opts.CAFile != "" || opts.CertFile != "" {
		return nil, fmt.Errorf("a CA file or client certificate needs an https:// flow API address, not %s", u)
	}
	return &http.Client{Transport: tr}, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// CloseIdleConnections closes the client's idle connections (when done
// with it: an HTTP/2 server shutting down otherwise waits for them).
func (c *Client) CloseIdleConnections() { c.hc.CloseIdleConnections() }

// APIError is an error answer of the flow API.
type APIError struct {
	URL    string
	Code   int
	Status Status
}

func (e *APIError) Error() string {
	msg := e.Status.Message
	if msg == "" {
		msg = http.StatusText(e.Code)
	}
	return fmt.Sprintf("kproxy flow API %s: %d %s", e.URL, e.Code, msg)
}

// NotFound reports a flow the API does not have.
func (e *APIError) NotFound() bool { return e.Code == http.StatusNotFound }

func (c *Client) url(path string, q url.Values) string {
	u := *c.base
	u.Path += path
	u.RawQuery = q.Encode()
	return u.String()
}

// do sends a request and decodes a 200 answer into out.
func (c *Client) do(ctx context.Context, method, u string, out any) error {
	return c.call(ctx, method, u, nil, out)
}

// call is do with a JSON body (nil: none).
func (c *Client) call(ctx context.Context, method, u string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return readAPIError(u, resp)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("kproxy flow API %s: decoding the answer: %w", u, err)
	}
	return nil
}

func (c *Client) send(req *http.Request) (*http.Response, error) {
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if req.Context().Err() != nil {
			return nil, req.Context().Err()
		}
		hint := connectHint(err)
		if c.certAsked.Load() {
			hint = certHint
		}
		return nil, fmt.Errorf("cannot reach the kproxy flow API at %s: %w (%s)", c.base, err, hint)
	}
	return resp, nil
}

const certHint = "the API wants a client certificate signed by kproxy's --api-client-ca-file"

// connectHint says what to check when a request could not be sent.
func connectHint(err error) string {
	var verify *tls.CertificateVerificationError
	msg := err.Error()
	switch {
	case errors.As(err, &verify):
		return "trust the CA that signed kproxy's --api-tls-cert-file: give its CA file"
	case strings.Contains(msg, "tls: certificate required") || strings.Contains(msg, "tls: bad certificate") || strings.Contains(msg, "tls: unknown certificate authority"):
		// The server's TLS alert: it refused our certificate, or we sent none.
		return certHint
	case strings.Contains(msg, "server gave HTTP response to HTTPS client"):
		return "the API is plain HTTP: use an http:// address"
	}
	return "is `kproxy serve` running with --api-listen on that address?"
}

func readAPIError(u string, resp *http.Response) error {
	e := &APIError{URL: u, Code: resp.StatusCode}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(b, &e.Status) != nil || e.Status.Message == "" {
		e.Status.Message = strings.TrimSpace(string(b))
	}
	if e.Status.Kind != "Status" {
		// Not the flow API's own answer (its messages say what to do).
		switch resp.StatusCode {
		case http.StatusUnauthorized:
			e.Status.Message += " (give the token of kproxy's --api-token-file, or a client certificate its --api-client-ca-file trusts)"
		case http.StatusNotFound:
			e.Status.Message += " (is this address kproxy's --api-listen, not its --listen?)"
		}
	}
	return e
}

// List returns the newest limit flows matching filter (a filter
// expression; "" for all), oldest first; limit 0 is the server's default.
func (c *Client) List(ctx context.Context, filter string, limit int) ([]*record.Record, error) {
	q := url.Values{}
	if filter != "" {
		q.Set("filter", filter)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var l FlowList
	if err := c.do(ctx, http.MethodGet, c.url(PathFlows, q), &l); err != nil {
		return nil, err
	}
	return l.Items, nil
}

// Get returns one flow; an evicted or unknown id is an *APIError with
// NotFound true.
func (c *Client) Get(ctx context.Context, id string) (*record.Record, error) {
	var r record.Record
	if err := c.do(ctx, http.MethodGet, c.url(PathFlows+"/"+url.PathEscape(id), nil), &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Replay re-runs a flow's replay now and returns the new record.
func (c *Client) Replay(ctx context.Context, id string) (*record.Record, error) {
	var r record.Record
	if err := c.do(ctx, http.MethodPost, c.url(PathFlows+"/"+url.PathEscape(id)+"/replay", nil), &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// ReplayFilter returns the running kproxy's replay filter ("": every
// request is replayed).
func (c *Client) ReplayFilter(ctx context.Context) (string, error) {
	var rf ReplayFilter
	if err := c.do(ctx, http.MethodGet, c.url(PathReplayFilter, nil), &rf); err != nil {
		return "", err
	}
	return rf.Filter, nil
}

// SetReplayFilter changes the running kproxy's replay filter ("" replays
// every request) and returns the filter now in force, normalised.
func (c *Client) SetReplayFilter(ctx context.Context, expr string) (string, error) {
	var rf ReplayFilter
	in := ReplayFilter{APIVersion: APIVersion, Kind: "ReplayFilter", Filter: expr}
	if err := c.call(ctx, http.MethodPut, c.url(PathReplayFilter, nil), in, &rf); err != nil {
		return "", err
	}
	return rf.Filter, nil
}

// StreamOptions say what Stream asks for.
type StreamOptions struct {
	// Filter is a filter expression; "" for all flows.
	Filter string
	// Backlog is how many buffered flows to receive first: 0 for none,
	// negative for all the server has.
	Backlog int
	// LastEventID resumes after that flow instead of sending a backlog.
	LastEventID string
}

// StreamEvent is one thing Stream reports: a flow (Record), a count of
// flows lost (Missed), or a change of connection (Status).
type StreamEvent struct {
	Record *record.Record
	Missed int
	Status string
}

// Stream follows the flow stream, calling fn (from one goroutine) for
// each event, until ctx ends; it then returns ctx's error. A lost
// connection is re-established with backoff, resuming after the last flow
// received, so nothing is seen twice and what was lost is counted as
// missed. Errors that reconnecting cannot fix (a bad filter, refused
// credentials) are returned.
func (c *Client) Stream(ctx context.Context, opts StreamOptions, fn func(StreamEvent)) error {
	last := opts.LastEventID
	bo := c.backoff
	for {
		received := false
		err := c.streamOnce(ctx, opts, last, func(ev StreamEvent, id string) {
			if id != "" {
				last = id
			}
			if ev.Status == "" {
				received = true
			}
			fn(ev)
		})
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var apiErr *APIError
		if errors.As(err, &apiErr) && apiErr.Code < 500 && apiErr.Code != http.StatusTooManyRequests {
			return err
		}
		if received {
			// The connection delivered: start the backoff over. (One that
			// is accepted and dropped at once keeps backing off.)
			bo = c.backoff
		}
		d := bo.Step()
		why := "the server ended the stream"
		if err != nil {
			why = err.Error()
		}
		fn(StreamEvent{Status: fmt.Sprintf("connection lost: %s; reconnecting in %s", why, roundDuration(d))})
		if err := c.sleep(ctx, d); err != nil {
			return err
		}
	}
}

// roundDuration keeps a jittered delay readable.
func roundDuration(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(10 * time.Millisecond)
}

// streamOnce reads one connection's events, passing each flow's id.
func (c *Client) streamOnce(ctx context.Context, opts StreamOptions, last string, fn func(StreamEvent, string)) error {
	q := url.Values{}
	if opts.Filter != "" {
		q.Set("filter", opts.Filter)
	}
	if last == "" && opts.Backlog >= 0 {
		q.Set("backlog", strconv.Itoa(opts.Backlog))
	}
	u := c.url(PathStream, q)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "text/event-stream")
	if last != "" {
		req.Header.Set("Last-Event-ID", last)
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return readAPIError(u, resp)
	}
	fn(StreamEvent{Status: "connected to " + u}, "")
	return readSSE(resp.Body, func(id, event string, data []byte) error {
		switch event {
		case "flow":
			var r record.Record
			if err := json.Unmarshal(data, &r); err != nil {
				return fmt.Errorf("kproxy flow API %s: a flow event that is not a record: %w", u, err)
			}
			fn(StreamEvent{Record: &r}, id)
		case "missed":
			var m MissedEvent
			if err := json.Unmarshal(data, &m); err != nil {
				return fmt.Errorf("kproxy flow API %s: a missed event without a count: %w", u, err)
			}
			fn(StreamEvent{Missed: int(min(m.Missed, uint64(1<<31-1)))}, "")
		}
		return nil
	})
}

// maxEventBytes bounds one SSE line: a record is a few KiB, but
// explanations can be long.
const maxEventBytes = 16 << 20

// readSSE parses a text/event-stream, calling fn per dispatched event
// (https://html.spec.whatwg.org/multipage/server-sent-events.html).
// It returns nil at a clean end of stream.
func readSSE(r io.Reader, fn func(id, event string, data []byte) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxEventBytes)
	var id, event string
	var data bytes.Buffer
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if data.Len() > 0 {
				if event == "" {
					event = "message"
				}
				if err := fn(id, event, bytes.TrimSuffix(data.Bytes(), []byte("\n"))); err != nil {
					return err
				}
			}
			event = ""
			data.Reset()
			continue
		}
		if strings.HasPrefix(line, ":") {
			continue // a comment: keepalive
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "id":
			id = value
		case "event":
			event = value
		case "data":
			data.WriteString(value)
			data.WriteByte('\n')
		}
	}
	return sc.Err()
}
