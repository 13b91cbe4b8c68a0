package citest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	certutil "k8s.io/client-go/util/cert"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apiserver/pkg/authentication/user"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/decode"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/stages"
	"github.com/kproxy/kproxy/internal/testfile"
)

// Replayer predicts a request's outcome (a *stages.Pipeline).
type Replayer interface {
	Run(ctx context.Context, req *stages.Request) stages.Outcome
}

// Local replays each case in process over a snapshot: no cluster, no
// network. Its verdict is kproxy's prediction.
type Local struct {
	Replay Replayer
	Now    func() time.Time
}

func (*Local) Name() string { return "local" }

// Run replays c. A user is taken as authenticated (there is no credential
// to check); a client certificate is checked against the snapshot's
// client CA; a bearer token cannot be checked offline and is unknown.
func (l *Local) Run(ctx context.Context, c *testfile.Case) (Verdict, error) {
	switch c.IdentityKind() {
	case "token":
		return Verdict{Stage: record.StageUnknown, Unknown: "the local engine cannot authenticate a bearer token offline (a snapshot holds no token secrets): give user and groups, or run with --engine cluster"}, nil
	case "default":
		return Verdict{}, fmt.Errorf("case %q (%s:%d) gives no identity, and the local engine has no kubeconfig to send it as: add user (and groups), anonymous: true, or a client certificate", c.Name, c.File, c.Line)
	}
	req, body, err := NewRequest(c, "https://kproxy-test")
	if err != nil {
		return Verdict{}, err
	}
	var given user.Info
	if c.User != "" {
		given = &user.DefaultInfo{Name: c.User, Groups: c.Groups, UID: c.UID, Extra: c.Extra}
	}
	now := l.Now
	if now == nil {
		now = time.Now
	}
	info, err := stages.ResolveRequestInfo(req)
	if err != nil {
		return Verdict{}, fmt.Errorf("case %q: %s %s: %w", c.Name, c.Request.Method, c.Request.Path, err)
	}
	out := l.Replay.Run(ctx, &stages.Request{ID: c.Name, Arrival: now(), HTTP: req, Info: info, Body: body,
		BodyTruncated: len(body) > stages.MaxBodyBytes, Given: given})
	v := predictionVerdict(out)
	v.WarningsUnknown = true
	return v, nil
}

// predictionVerdict is the verdict a prediction gives.
func predictionVerdict(out stages.Outcome) Verdict {
	p := out.Predicted
	v := Verdict{Status: p.Status, Stage: p.Stage, Reason: p.Reason, Message: p.Message, Stages: out.Stages}
	if p.Stage == record.StageUnknown {
		v.Unknown = p.Message
		return v
	}
	if v.Stage == "" {
		v.Stage = testfile.StageNone
	}
	v.Explanation = decidingExplanation(out.Stages, p.Stage)
	return v
}

// decidingExplanation is the deciding stage's explanation, or for a request no
// stage refuses, the last replayed stage's.
func decidingExplanation(results []record.StageResult, stage string) string {
	for i := len(results) - 1; i >= 0; i-- {
		r := results[i]
		if (stage != "" && r.Name == stage) || (stage == "" && r.Outcome == record.Pass) {
			return r.Explanation
		}
	}
	return ""
}

// Cluster sends each case to a real apiserver (writes in dry run) and
// replays it too. Its verdict is the apiserver's answer; the deciding
// stage is kproxy's when its prediction agrees.
type Cluster struct {
	// Host is the apiserver's URL.
	Host string
	// Client sends as the CI identity (the kubeconfig's credentials);
	// cases naming a user are sent through it with Impersonate-*
	// headers. Anonymous is the same connection without credentials
	// (cases with their own token or certificate, anonymous cases).
	Client, Anonymous *http.Client
	// TLS is the connection's TLS configuration without a client
	// certificate (cases with their own certificate add it).
	TLS *tls.Config
	// OwnHeader and OwnCert are what the CI identity presents, for the
	// replay of the same request.
	OwnHeader http.Header
	OwnCert   *tls.Certificate
	Replay    Replayer
	Now       func() time.Time
	// Timeout bounds one case (default 30s).
	Timeout time.Duration
}

func (*Cluster) Name() string { return "cluster" }

// Run sends c and replays it.
func (e *Cluster) Run(ctx context.Context, c *testfile.Case) (Verdict, error) {
	timeout := e.Timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	send, body, err := NewRequest(c, e.Host)
	if err != nil {
		return Verdict{}, err
	}
	if why := cannotSend(c, send); why != "" {
		return Verdict{Stage: record.StageUnknown, Unknown: why}, nil
	}
	asWritten := send.URL.RawQuery
	dryRun(send)
	client := e.Anonymous
	var clientCert *tls.Certificate
	switch c.IdentityKind() {
	case "user":
		impersonate(send.Header, &testfile.Identity{User: c.User, Groups: c.Groups, UID: c.UID, Extra: c.Extra})
		client = e.Client
	case "default":
		client = e.Client
	case "clientCertificate":
		cert, err := tls.LoadX509KeyPair(c.Resolve(c.ClientCertificate), c.Resolve(c.ClientKey))
		if err != nil {
			return Verdict{}, fmt.Errorf("case %q: clientCertificate and clientKey: %w", c.Name, err)
		}
		clientCert = &cert
		tc := e.TLS.Clone()
		tc.Certificates = []tls.Certificate{cert}
		client = &http.Client{Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}, CheckRedirect: NoRedirects}
		defer client.CloseIdleConnections()
	}
	// The replay sees the request as the apiserver does: the same
	// headers and the identity's credentials.
	replay := send.Clone(ctx)
	replay.Body = nil
	switch c.IdentityKind() {
	case "user", "default":
		for k, vs := range e.OwnHeader {
			replay.Header[k] = vs
		}
		if e.OwnCert != nil {
			replay.TLS = peerState(e.OwnCert)
		}
	case "clientCertificate":
		replay.TLS = peerState(clientCert)
	}
	send = send.WithContext(ctx)
	if body != nil {
		send.Body = io.NopCloser(bytes.NewReader(body))
		send.ContentLength = int64(len(body))
	}
	resp, err := client.Do(send)
	if err != nil {
		return Verdict{}, fmt.Errorf("case %q: sending %s %s to %s: %w", c.Name, send.Method, send.URL.RequestURI(), e.Host, err)
	}
	v := answerVerdict(resp)
	info, err := stages.ResolveRequestInfo(replay)
	if err != nil {
		return v, nil
	}
	// A dry run's answer is the write's, except where the apiserver
	// checks something only for real: that a Service's clusterIP is
	// free. There kproxy replays the write as written.
	allocates := v.Status < 300 && namesClusterIP(info, body) && asWritten != send.URL.RawQuery
	if allocates {
		replay.URL.RawQuery = asWritten
	}
	now := e.Now
	if now == nil {
		now = time.Now
	}
	out := e.Replay.Run(ctx, &stages.Request{ID: c.Name, Arrival: now(), HTTP: replay, Info: info, Body: body,
		BodyTruncated: len(body) > stages.MaxBodyBytes})
	p := out.Predicted
	if allocates && p.Stage != record.StageUnknown && p.Status >= 300 {
		return Verdict{Stage: record.StageUnknown, Predicted: &p, Stages: out.Stages, Unknown: fmt.Sprintf(
			"the apiserver admitted the case's dry run (%d), and a dry run does not check that a Service's clusterIP is free "+
				"(kube-apiserver's IP allocator checks only its range then); kproxy predicts the write itself: %s (--engine local replays it)",
			v.Status, predictionVerdict(out).Summary())}, nil
	}
	v.Predicted, v.Stages = &p, out.Stages
	agrees := p.Stage != record.StageUnknown && p.Status == v.Status && (v.Status < 400 || p.Reason == v.Reason)
	switch {
	case v.Status < 400:
		v.Stage = testfile.StageNone
	case agrees:
		v.Stage = p.Stage
	default:
		v.Stage = record.StageUnknown
	}
	if agrees {
		v.Explanation = decidingExplanation(out.Stages, p.Stage)
	} else {
		pv := predictionVerdict(out)
		v.Disagreement = fmt.Sprintf("kproxy predicted %s, the apiserver answered %s", pv.Summary(), v.answer())
		if p.Stage == record.StageUnknown {
			v.Disagreement = "kproxy could not predict it: " + p.Message
		}
	}
	return v, nil
}

// NoRedirects is the cluster engine's clients' CheckRedirect: a case's
// answer is the apiserver's own, a 301 too (found when a case of an
// OpenAPI document by an old hash got the redirect's target's 200).
func NoRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// connectSubresources cannot be dry-run: sending one would run it.
var connectSubresources = map[string]bool{"exec": true, "attach": true, "portforward": true, "proxy": true}

// cannotSend says why the cluster engine cannot send c faithfully.
func cannotSend(c *testfile.Case, r *http.Request) string {
	if c.User != "" && c.Impersonate != nil {
		return "the cluster engine sends a case's user by impersonation, and impersonation cannot be nested: give the case a token or client certificate of " + c.User + ", or run it with --engine local"
	}
	if info, err := stages.ResolveRequestInfo(r); err == nil && connectSubresources[info.Subresource] {
		return "the cluster engine never sends " + info.Resource + "/" + info.Subresource + ": it cannot be dry-run, and sending it would run it (--engine local replays it)"
	}
	return ""
}

// namesClusterIP reports a Service create, update or patch whose body
// names a clusterIP: kube-apiserver's IP allocator checks that it is free
// for a real write, and only that it is in range for a dry run (its node
// port allocator checks both either way).
func namesClusterIP(info *apirequest.RequestInfo, body []byte) bool {
	if info == nil || info.APIGroup != "" || info.Resource != "services" || info.Subresource != "" || body == nil {
		return false
	}
	switch info.Verb {
	case "create", "update", "patch":
	default:
		return false
	}
	var svc struct {
		Spec struct {
			ClusterIP  string   `json:"clusterIP"`
			ClusterIPs []string `json:"clusterIPs"`
		} `json:"spec"`
	}
	if yaml.Unmarshal(body, &svc) != nil {
		return false
	}
	named := func(ip string) bool { return ip != "" && ip != "None" }
	return named(svc.Spec.ClusterIP) || slices.ContainsFunc(svc.Spec.ClusterIPs, named)
}

// answerVerdict reads the apiserver's answer: status, the Status object
// of a refusal, warnings. A success's body is not needed (and a watch's
// never ends), so it is not read.
func answerVerdict(resp *http.Response) Verdict {
	defer resp.Body.Close()
	v := Verdict{Status: resp.StatusCode}
	if ws, _ := utilnet.ParseWarningHeaders(resp.Header.Values("Warning")); len(ws) > 0 {
		for _, w := range ws {
			v.Warnings = append(v.Warnings, w.Text)
		}
	}
	if resp.StatusCode < 400 {
		return v
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	// In the encoding the case asked for: typed clients (kubectl create)
	// ask for protobuf, and the apiserver refuses in it (a probe: every
	// such refusal read as reason "", a disagreement).
	if st, ok := decode.Status(resp.Header.Get("Content-Type"), b); ok {
		v.Reason, v.Message = string(st.Reason), st.Message
	} else {
		v.Message = strings.TrimSpace(string(b))
	}
	return v
}

// NewRequest builds c's request against base (no credentials but the
// case's own token; its body is returned, not attached).
func NewRequest(c *testfile.Case, base string) (*http.Request, []byte, error) {
	body, ct, err := c.BodyBytes()
	if err != nil {
		return nil, nil, err
	}
	u, err := url.Parse(strings.TrimSuffix(base, "/") + c.Request.Path)
	if err != nil {
		return nil, nil, fmt.Errorf("case %q: request.path: %w", c.Name, err)
	}
	req, err := http.NewRequest(c.Request.Method, u.String(), nil)
	if err != nil {
		return nil, nil, fmt.Errorf("case %q: %w", c.Name, err)
	}
	keys := make([]string, 0, len(c.Request.Headers))
	for k := range c.Request.Headers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		req.Header.Add(k, c.Request.Headers[k])
	}
	if ct != "" && body != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", ct)
	}
	if c.IdentityKind() == "token" {
		tok, err := c.TokenValue()
		if err != nil {
			return nil, nil, err
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if c.IdentityKind() == "clientCertificate" {
		pemBytes, err := os.ReadFile(c.Resolve(c.ClientCertificate))
		if err != nil {
			return nil, nil, fmt.Errorf("case %q: clientCertificate: %w", c.Name, err)
		}
		certs, err := certutil.ParseCertsPEM(pemBytes)
		if err != nil {
			return nil, nil, fmt.Errorf("case %q: clientCertificate %s: %w", c.Name, c.ClientCertificate, err)
		}
		req.TLS = &tls.ConnectionState{HandshakeComplete: true, PeerCertificates: certs}
	}
	if c.Impersonate != nil {
		impersonate(req.Header, c.Impersonate)
	}
	return req, body, nil
}

// impersonate adds the Impersonate-* headers for id.
func impersonate(h http.Header, id *testfile.Identity) {
	h.Set("Impersonate-User", id.User)
	for _, g := range id.Groups {
		h.Add("Impersonate-Group", g)
	}
	if id.UID != "" {
		h.Set("Impersonate-Uid", id.UID)
	}
	for k, vs := range id.Extra {
		for _, v := range vs {
			h.Add("Impersonate-Extra-"+url.PathEscape(k), v)
		}
	}
}

// dryRun makes a write a dry run (the cluster engine never writes).
func dryRun(r *http.Request) {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
	default:
		return
	}
	q := r.URL.Query()
	if q.Get("dryRun") != "" {
		return
	}
	sep := "&"
	if r.URL.RawQuery == "" {
		sep = ""
	}
	r.URL.RawQuery += sep + "dryRun=All"
}

func peerState(cert *tls.Certificate) *tls.ConnectionState {
	var certs []*x509.Certificate
	for _, der := range cert.Certificate {
		if c, err := x509.ParseCertificate(der); err == nil {
			certs = append(certs, c)
		}
	}
	return &tls.ConnectionState{HandshakeComplete: true, PeerCertificates: certs}
}
