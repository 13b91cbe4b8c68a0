package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	certutil "k8s.io/client-go/util/cert"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/kproxy/kproxy/internal/credential"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
	"github.com/kproxy/kproxy/internal/stages"
)

type explainOptions struct {
	serve      serve.Options
	token      string
	clientCert string
	clientKey  string
	as         string
	asGroups   []string
	asUID      string
	file       string
	output     *outputFlags
	contentTy  string
	logLevel   string
	apiserver  *apiserverConfig
}

func newExplainCommand() *cobra.Command {
	a := newAPIServerConfig()
	o := &explainOptions{serve: serve.Options{APIServer: a.opts}, apiserver: a}
	cmd := &cobra.Command{
		Use:   "explain METHOD PATH",
		Short: "Replay one request through the apiserver's stages, without sending it, and say what would happen and why",
		Long: `Replay one request through the apiserver's stages (authentication,
impersonation, flowcontrol, authorization, ...) against the cluster's real
state, without sending it, and print each stage's verdict and explanation.
Think of it as "kubectl auth can-i" for the whole request path, with the
reason.

Exit status: 0 when the request is predicted to succeed, 3 when it is
predicted to be refused, 4 when kproxy cannot predict it (the output says
why), 1 for bad input or when the replay cannot run.

The identity comes from --token, or --client-certificate (and --client-key), or,
when neither is given, from kproxy's own kubeconfig credentials;
--as/--as-group/--as-uid add Impersonate-* headers as kubectl --as does.
The apiserver's configuration comes from the mirrored flags or
--apiserver-manifest, as for kproxy serve.

  kproxy explain GET /api/v1/namespaces/default/pods --token "$TOKEN" --apiserver-manifest kube-apiserver.yaml
  kproxy explain DELETE /api/v1/namespaces/prod/pods/web-0 --as alice --as-group devs -o yaml
  kproxy explain POST /api/v1/namespaces/default/configmaps -f cm.json --client-certificate dave.crt`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 {
				return fmt.Errorf("want METHOD PATH, e.g. `kproxy explain GET /api/v1/namespaces/default/pods`; got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return runExplain(cmd, o, strings.ToUpper(args[0]), args[1])
		},
	}
	f := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	f.StringVar(&o.serve.UpstreamKubeconfig, "upstream-kubeconfig", "", "kubeconfig kproxy reads the cluster's state with (default: $KUBECONFIG, then ~/.kube/config)")
	f.StringVar(&o.serve.UpstreamContext, "upstream-context", "", "context in --upstream-kubeconfig")
	f.StringVar(&o.serve.Upstream, "upstream", "", "the apiserver's URL (default: the kubeconfig's server)")
	f.StringVar(&o.token, "token", "", "bearer token to authenticate the request with")
	f.StringVar(&o.clientCert, "client-certificate", "", "client certificate (PEM) to authenticate the request with, as kubectl --client-certificate")
	f.StringVar(&o.clientKey, "client-key", "", "the client certificate's key, checked to match it, as kubectl --client-key")
	// The name it had before kubectl's was adopted.
	f.StringVar(&o.clientCert, "client-cert", "", "")
	_ = f.MarkDeprecated("client-cert", "use --client-certificate, as kubectl")
	f.StringVar(&o.as, "as", "", "impersonate this user (Impersonate-User), as kubectl --as")
	f.StringSliceVar(&o.asGroups, "as-group", nil, "impersonate this group (repeatable), as kubectl --as-group")
	f.StringVar(&o.asUID, "as-uid", "", "impersonate this UID, as kubectl --as-uid")
	f.StringVarP(&o.file, "filename", "f", "", "request body from this file (- for stdin)")
	f.StringVar(&o.contentTy, "content-type", "", "the body's Content-Type (default: from the file: application/json or application/yaml)")
	o.output = newOutputFlags("table", "table")
	o.output.addFlags(f)
	f.StringVar(&o.logLevel, "log-level", "warn", "log level: debug, info, warn, error")
	a.addFlags(cmd, f, "kube-apiserver static-pod manifest to read the apiserver's flags from", true)
	return cmd
}

func runExplain(cmd *cobra.Command, o *explainOptions, method, path string) error {
	if err := o.output.validate(); err != nil {
		return err
	}
	log := newLogger(o.logLevel)
	serve.RouteKlog(log)
	if err := o.apiserver.load(log, true); err != nil {
		return err
	}
	// The path is printed as a capture records it: a credential in the
	// query (access_token) redacted, in errors too.
	shown := path
	if p, q, ok := strings.Cut(path, "?"); ok {
		shown = p + "?" + record.RedactQuery(q)
	}
	u, err := url.ParseRequestURI(path)
	if err != nil || !strings.HasPrefix(path, "/") {
		return fmt.Errorf("PATH %q: want a request path such as /api/v1/namespaces/default/pods", shown)
	}
	cfg, err := serve.LoadUpstreamConfig(&o.serve)
	if err != nil {
		return err
	}
	var ownHeader http.Header
	var ownCert *tls.Certificate
	if o.token == "" && o.clientCert == "" {
		// No identity given: the request is the one kubectl would send
		// with kproxy's kubeconfig, whatever kind of credential it holds.
		if ownHeader, ownCert, err = credential.FromConfig(cfg); err != nil {
			return err
		}
	}
	req, err := o.request(method, u, ownHeader, ownCert, cmd.InOrStdin())
	if err != nil {
		return err
	}
	info, err := stages.ResolveRequestInfo(req)
	if err != nil {
		return fmt.Errorf("resolve %s %s: %w", method, shown, err)
	}
	if err := serve.Reachable(cmd.Context(), cfg); err != nil {
		return err
	}
	pipeline, err := serve.NewReplay(cmd.Context(), cfg, credential.InConfig(cfg), o.serve.APIServer, noop.NewTracerProvider(), o.serve.SyncTimeout, log)
	if err != nil {
		return err
	}
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(io.LimitReader(req.Body, stages.MaxBodyBytes+1))
	}
	sreq := &stages.Request{ID: "explain", Arrival: time.Now(), HTTP: req, Info: info,
		Body: body, BodyTruncated: len(body) > stages.MaxBodyBytes}
	out := pipeline.Run(cmd.Context(), sreq)
	if err := printExplanation(cmd.OutOrStdout(), o.output, method, shown, out); err != nil {
		return err
	}
	return explainExit(out.Predicted)
}

// Exit statuses of kproxy explain, for scripts.
const (
	explainAllowed = 0 // the request is predicted to succeed
	explainRefused = 3 // predicted to be refused (4xx or 5xx): the output says by which stage and why
	explainUnknown = 4 // kproxy cannot predict it: the output says why
)

func explainExit(p record.Prediction) error {
	switch {
	case p.Stage == record.StageUnknown:
		return exitCode(explainUnknown)
	case p.Status >= 400:
		return exitCode(explainRefused)
	}
	return nil
}

// request builds the request to replay with the chosen identity.
func (o *explainOptions) request(method string, u *url.URL, kubeHeader http.Header, kubeCert *tls.Certificate, stdin io.Reader) (*http.Request, error) {
	var body io.Reader
	ct := o.contentTy
	if o.file != "" {
		var b []byte
		var err error
		if o.file == "-" {
			b, err = io.ReadAll(stdin)
		} else {
			b, err = os.ReadFile(o.file)
		}
		if err != nil {
			return nil, fmt.Errorf("-f %s: %w", o.file, err)
		}
		if ct == "" {
			ct = "application/json"
			if strings.HasSuffix(o.file, ".yaml") || strings.HasSuffix(o.file, ".yml") {
				ct = "application/yaml"
			}
		}
		body = strings.NewReader(string(b))
	}
	req, err := http.NewRequest(method, "https://kproxy-explain"+u.RequestURI(), body)
	if err != nil {
		return nil, err
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	for k, v := range kubeHeader {
		req.Header[k] = v
	}
	if kubeCert != nil {
		certs := make([]*x509.Certificate, 0, len(kubeCert.Certificate))
		for _, der := range kubeCert.Certificate {
			c, err := x509.ParseCertificate(der)
			if err != nil {
				return nil, fmt.Errorf("the kubeconfig's client certificate: %w", err)
			}
			certs = append(certs, c)
		}
		req.TLS = &tls.ConnectionState{HandshakeComplete: true, PeerCertificates: certs}
	}
	if o.clientCert != "" {
		certPEM, err := os.ReadFile(o.clientCert)
		if err != nil {
			return nil, fmt.Errorf("--client-certificate: %w", err)
		}
		if o.clientKey != "" {
			keyPEM, err := os.ReadFile(o.clientKey)
			if err != nil {
				return nil, fmt.Errorf("--client-key: %w", err)
			}
			if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
				return nil, fmt.Errorf("--client-certificate and --client-key do not match: %w", err)
			}
		}
		certs, err := certutil.ParseCertsPEM(certPEM)
		if err != nil {
			return nil, fmt.Errorf("--client-certificate %s: %w", o.clientCert, err)
		}
		req.TLS = &tls.ConnectionState{HandshakeComplete: true, PeerCertificates: certs}
	}
	if o.token != "" {
		req.Header.Set("Authorization", "Bearer "+o.token)
	}
	if o.as != "" {
		req.Header.Set("Impersonate-User", o.as)
	}
	for _, g := range o.asGroups {
		req.Header.Add("Impersonate-Group", g)
	}
	if o.asUID != "" {
		req.Header.Set("Impersonate-Uid", o.asUID)
	}
	return req, nil
}

// explanation is explain's -o json|yaml document.
type explanation struct {
	Method    string               `json:"method"`
	Path      string               `json:"path"`
	Predicted record.Prediction    `json:"predicted"`
	Stages    []record.StageResult `json:"stages"`
}

func printExplanation(w io.Writer, output *outputFlags, method, path string, out stages.Outcome) error {
	if !output.isHuman() {
		return output.printDocument(w, "Explanation", explanation{Method: method, Path: path, Predicted: out.Predicted, Stages: out.Stages})
	}
	var rows [][]any
	var details []string
	for _, s := range out.Stages {
		first, rest, _ := strings.Cut(s.Explanation, "\n")
		rows = append(rows, []any{s.Name, s.Outcome, time.Duration(s.DurationNs).Round(time.Microsecond).String(), first})
		if rest != "" {
			details = append(details, s.Name+":\n"+indent(rest, "  "))
		}
	}
	if err := printTable(w, []string{"Stage", "Outcome", "Time", "Explanation"}, rows); err != nil {
		return err
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "PREDICTION:", predictedString(out.Predicted))
	if out.Predicted.Message != "" {
		fmt.Fprintln(w, "  "+out.Predicted.Message)
	}
	if out.Predicted.FlowSchema != "" {
		fmt.Fprintf(w, "  APF: FlowSchema %s, PriorityLevel %s\n", out.Predicted.FlowSchema, out.Predicted.PriorityLevel)
	}
	for _, d := range details {
		fmt.Fprintln(w)
		fmt.Fprint(w, d)
		if !strings.HasSuffix(d, "\n") {
			fmt.Fprintln(w)
		}
	}
	return nil
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n") + "\n"
}
