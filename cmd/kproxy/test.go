package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel/trace/noop"
	"k8s.io/client-go/rest"

	"github.com/kproxy/kproxy/internal/citest"
	"github.com/kproxy/kproxy/internal/credential"
	"github.com/kproxy/kproxy/internal/filter"
	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
	"github.com/kproxy/kproxy/internal/source"
	"github.com/kproxy/kproxy/internal/stages/apiserver"
	"github.com/kproxy/kproxy/internal/testfile"
)

func newTestCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "test",
		Short: "Expected outcomes in CI: run test files against a snapshot or a cluster, generate them from recorded traffic",
		Long: `kproxy test checks that requests, sent by given identities, get the answers
a test file expects, and says which layer decides each and why.

  kproxy test run --engine local --snapshot snap tests/      # no cluster: kproxy's replay over a snapshot
  kproxy test run --engine cluster tests/                    # a real apiserver (writes in dry run)
  kproxy test run --engine local --overlay proposed/ tests/  # what-if: which verdicts a change flips
  kproxy test generate --from capture.jsonl > tests/recorded.yaml

The test file format and the snapshot are described in docs/testing.md.`,
	}
	cmd.AddCommand(newTestRunCommand(), newTestGenerateCommand())
	return cmd
}

type testRunOptions struct {
	serve          serve.Options
	engine         string
	snapshot       string
	overlays       []string
	setFlags       []string
	compareStorage bool
	output         *outputFlags
	junit          string
	logLevel       string
	timeout        time.Duration
	apiserver      *apiserverConfig
}

func newTestRunCommand() *cobra.Command {
	a := newAPIServerConfig()
	o := &testRunOptions{serve: serve.Options{APIServer: a.opts}, apiserver: a, output: newOutputFlags("table", "table")}
	cmd := &cobra.Command{
		Use:   "run FILE|DIR...",
		Short: "Run test files and compare each case's answer with what it expects",
		Long: `Run every case of the test files (a directory: its kind: Test YAML files)
and compare the answer with the case's expect.

Engines:
  local    replay each case in process through kproxy's stage pipeline over a
           snapshot (--snapshot, or the file's snapshot:), with the snapshot's
           apiserver flags; no cluster, no network. Warnings are not predicted;
           bearer tokens cannot be checked offline (give user and groups).
  cluster  send each case to the apiserver of --kubeconfig (writes with
           dryRun=All; a user is sent by impersonation from the kubeconfig's
           identity, which needs the impersonate verb), and replay it too: the
           report says where kproxy's prediction and the apiserver disagree.

What-if (local engine): --overlay DIR adds, replaces or removes objects in the
snapshot (kproxy.dev/overlay: absent removes) and --set-flag NAME=VALUE
changes a mirrored apiserver flag; the report lists exactly the cases whose
verdict changes, before and after, and the expectations are checked after.

The storage stage's outcomes (404, 409) depend on the state when the snapshot
was taken: they are not compared unless --compare-storage.

Output: -o table (default), wide, github (annotations; the step summary goes
to $GITHUB_STEP_SUMMARY), or as kubectl prints: json, yaml, jsonpath=...,
go-template=... (a kproxy.dev/v1alpha1 TestReport); --junit FILE writes JUnit
XML as well.

Exit status: 0 every expectation held, 1 an expectation failed, 2 bad input
or an engine failure.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return testInputError(cmd, errors.New("no tests: give test files or directories (kproxy test run tests/)"))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return runTests(cmd, o, args) },
	}
	f := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	f.StringVar(&o.engine, "engine", "local", "local (replay over a snapshot, no cluster) or cluster (send to the apiserver, writes in dry run)")
	f.StringVar(&o.snapshot, "snapshot", "", "snapshot directory for the local engine (default: the test file's snapshot:)")
	f.StringSliceVar(&o.overlays, "overlay", nil, "what-if: a directory (or file) of objects to add, replace or remove in the snapshot (repeatable)")
	f.StringArrayVar(&o.setFlags, "set-flag", nil, "what-if: change a mirrored kube-apiserver flag, NAME=VALUE (repeatable), e.g. --set-flag enable-admission-plugins=PodSecurity")
	f.BoolVar(&o.compareStorage, "compare-storage", false, "also compare the storage stage's outcomes (404, 409), which depend on the state at snapshot time")
	o.output.addFlags(f, "wide", "github")
	f.StringVar(&o.junit, "junit", "", "also write a JUnit XML report to this file")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "the longest one case may take (cluster engine)")
	f.StringVar(&o.logLevel, "log-level", "warn", "log level: debug, info, warn, error")
	addKubeconfigFlags(f, &o.serve)
	a.addFlags(cmd, f, "kube-apiserver static-pod manifest to read the apiserver's flags from (cluster engine)", true)
	// A mistyped flag is bad input too: exit status 2, as the help says.
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return testInputError(c, flagError(c, err)) })
	return cmd
}

// testInputError ends kproxy test with exit status 2, after saying why.
func testInputError(cmd *cobra.Command, err error) error {
	fmt.Fprintf(cmd.ErrOrStderr(), "kproxy test: %v\n", err)
	return exitCode(citest.ExitBadInput)
}

func runTests(cmd *cobra.Command, o *testRunOptions, args []string) error {
	if err := o.output.validate("wide", "github"); err != nil {
		return testInputError(cmd, err)
	}
	if o.junit != "" {
		// Before the suite runs, not after it.
		if st, err := os.Stat(filepath.Dir(o.junit)); err != nil || !st.IsDir() {
			return testInputError(cmd, fmt.Errorf("--junit %s: the directory %s does not exist: create it, or give another path", o.junit, filepath.Dir(o.junit)))
		}
	}
	files, err := testfile.Load(args...)
	if err != nil {
		return testInputError(cmd, err)
	}
	ctx := cmd.Context()
	var rep *citest.Report
	copts := citest.Options{Compare: citest.CompareOptions{Storage: o.compareStorage}, Progress: progressTo(cmd.ErrOrStderr())}
	switch o.engine {
	case "local":
		serve.RouteKlog(newLoggerTo(cmd.ErrOrStderr(), o.logLevel))
		if given := mirroredFlagsGiven(o.apiserver); len(given) > 0 {
			return testInputError(cmd, fmt.Errorf("%s: the local engine reads the apiserver's flags from the snapshot; change one with --set-flag NAME=VALUE", strings.Join(given, ", ")))
		}
		dir, err := snapshotDir(o.snapshot, files)
		if err != nil {
			return testInputError(cmd, err)
		}
		base := fileOverlays(files)
		if rep, err = o.runLocal(ctx, cmd, dir, append(base, o.overlays...), o.setFlags, files, copts); err != nil {
			return testInputError(cmd, err)
		}
		rep.Snapshot = dir
		if len(o.overlays) > 0 || len(o.setFlags) > 0 {
			before, err := o.baseline(ctx, dir, args, cmd.ErrOrStderr())
			if err != nil {
				return testInputError(cmd, err)
			}
			rep.Changes = citest.Diff(before, rep)
			for _, ov := range o.overlays {
				rep.WhatIf = append(rep.WhatIf, "--overlay "+ov)
			}
			for _, s := range o.setFlags {
				rep.WhatIf = append(rep.WhatIf, "--set-flag "+s)
			}
		}
	case "cluster":
		if len(o.overlays) > 0 || len(o.setFlags) > 0 {
			return testInputError(cmd, errors.New("--overlay and --set-flag are what-if questions for --engine local: the cluster engine never changes the cluster"))
		}
		e, err := o.clusterEngine(ctx, cmd)
		if err != nil {
			return testInputError(cmd, err)
		}
		if ovs := fileOverlays(files); len(ovs) > 0 {
			// Not an error: the cluster may hold them already.
			fmt.Fprintf(cmd.ErrOrStderr(), "kproxy test: the cluster engine tests the cluster as it is: the overlays the test files name are for the local engine's snapshot and are not applied (kubectl apply -f %s, if the cluster lacks them)\n", strings.Join(ovs, " -f "))
		}
		rep = citest.Run(ctx, e, files, copts)
	default:
		return testInputError(cmd, fmt.Errorf("--engine %q: want local or cluster", o.engine))
	}
	if err := o.writeReports(cmd, rep); err != nil {
		return testInputError(cmd, err)
	}
	if code := rep.ExitCode(); code != 0 {
		return exitCode(code)
	}
	return nil
}

// mirroredFlagsGiven are the kube-apiserver flags given on the command line.
func mirroredFlagsGiven(a *apiserverConfig) []string {
	var out []string
	if a.manifest != "" {
		out = append(out, "--apiserver-manifest")
	}
	for _, arg := range a.opts.Args() {
		name, _, _ := strings.Cut(arg, "=")
		out = append(out, name)
	}
	return out
}

// snapshotDir is --snapshot, or the one snapshot the files name.
func snapshotDir(flag string, files []*testfile.File) (string, error) {
	if flag != "" {
		return flag, nil
	}
	dir := ""
	for _, f := range files {
		if f.Snapshot == "" {
			continue
		}
		d := f.Snapshot
		if !filepath.IsAbs(d) {
			d = filepath.Join(filepath.Dir(f.Path), d)
		}
		if dir != "" && filepath.Clean(dir) != filepath.Clean(d) {
			return "", fmt.Errorf("%s names snapshot %s, another file %s: run them separately, or give --snapshot", f.Path, d, dir)
		}
		dir = d
	}
	if dir == "" {
		return "", errors.New("the local engine needs a snapshot: give --snapshot DIR (take one with kproxy snapshot -o DIR) or snapshot: in the test file, or use --engine cluster")
	}
	return dir, nil
}

// fileOverlays are the overlays the test files name, resolved.
func fileOverlays(files []*testfile.File) []string {
	var out []string
	seen := map[string]bool{}
	for _, f := range files {
		for _, ov := range f.Overlays {
			if !filepath.IsAbs(ov) {
				ov = filepath.Join(filepath.Dir(f.Path), ov)
			}
			if !seen[ov] {
				seen[ov] = true
				out = append(out, ov)
			}
		}
	}
	return out
}

func (o *testRunOptions) runLocal(ctx context.Context, cmd *cobra.Command, dir string, overlays, setFlags []string, files []*testfile.File, copts citest.Options) (*citest.Report, error) {
	replay, changes, stop, err := localReplay(ctx, dir, overlays, setFlags, o.serve.SyncTimeout, cmd.ErrOrStderr(), o.logLevel)
	if err != nil {
		return nil, err
	}
	defer stop()
	for _, c := range changes {
		fmt.Fprintf(cmd.ErrOrStderr(), "overlay: %s\n", c)
	}
	return citest.Run(ctx, &citest.Local{Replay: replay}, files, copts), nil
}

// baseline runs the suite without the what-if changes, in a process of
// its own: the replay's feature gates are process-wide, so before and
// after cannot share one.
//
// What the baseline logs (errors only, unless --log-level asks for more:
// a replay that could not sync, say) is passed on to logOut, so that a
// baseline that could not predict is not read as the overlay's doing.
func (o *testRunOptions) baseline(ctx context.Context, dir string, args []string, logOut io.Writer) (*citest.Report, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmdArgs := []string{"test", "run", "--engine", "local", "--snapshot", dir, "-o", "json", "--log-level", o.logLevel}
	if o.compareStorage {
		cmdArgs = append(cmdArgs, "--compare-storage")
	}
	c := exec.CommandContext(ctx, self, append(cmdArgs, args...)...)
	var out, errOut bytes.Buffer
	c.Stdout, c.Stderr = &out, &errOut
	if err := c.Run(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() == citest.ExitBadInput {
			return nil, fmt.Errorf("the baseline run (without --overlay and --set-flag) failed: %v\n%s", err, errOut.String())
		}
	}
	for _, line := range strings.Split(errOut.String(), "\n") {
		// The overlays the files name and the progress are the run's own.
		if line == "" || strings.HasPrefix(line, "overlay: ") || strings.HasPrefix(line, "kproxy test: ") {
			continue
		}
		fmt.Fprintln(logOut, "baseline (without --overlay and --set-flag): "+line)
	}
	var rep citest.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		return nil, fmt.Errorf("the baseline run's report: %w", err)
	}
	return &rep, nil
}

func (o *testRunOptions) clusterEngine(ctx context.Context, cmd *cobra.Command) (*citest.Cluster, error) {
	log := newLoggerTo(cmd.ErrOrStderr(), o.logLevel)
	serve.RouteKlog(log)
	if err := o.apiserver.load(log, true); err != nil {
		return nil, err
	}
	cfg, err := serve.LoadUpstreamConfig(&o.serve)
	if err != nil {
		return nil, err
	}
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("the kubeconfig: %w", err)
	}
	anon := rest.AnonymousClientConfig(cfg)
	anonClient, err := rest.HTTPClientFor(anon)
	if err != nil {
		return nil, fmt.Errorf("the kubeconfig: %w", err)
	}
	tlsCfg, err := rest.TLSConfigFor(anon)
	if err != nil {
		return nil, fmt.Errorf("the kubeconfig's TLS settings: %w", err)
	}
	if tlsCfg == nil {
		return nil, fmt.Errorf("the apiserver %s is not served over TLS; kproxy test --engine cluster needs https", cfg.Host)
	}
	header, cert, err := credential.FromConfig(cfg)
	if err != nil {
		return nil, err
	}
	if err := serve.Reachable(ctx, cfg); err != nil {
		return nil, err
	}
	replay, err := serve.NewReplay(ctx, cfg, credential.InConfig(cfg), o.serve.APIServer, noop.NewTracerProvider(), o.serve.SyncTimeout, log)
	if err != nil {
		return nil, err
	}
	// A case's answer is the apiserver's, a redirect's too (an OpenAPI
	// document by an old hash answers 301): never followed.
	client.CheckRedirect, anonClient.CheckRedirect = citest.NoRedirects, citest.NoRedirects
	return &citest.Cluster{Host: cfg.Host, Client: client, Anonymous: anonClient, TLS: tlsCfg,
		OwnHeader: header, OwnCert: cert, Replay: replay, Timeout: o.timeout}, nil
}

func (o *testRunOptions) writeReports(cmd *cobra.Command, rep *citest.Report) error {
	out := cmd.OutOrStdout()
	var err error
	switch *o.output.print.OutputFormat {
	case "table":
		err = citest.WriteTable(out, rep, false)
	case "wide":
		err = citest.WriteTable(out, rep, true)
	case "json":
		err = citest.WriteJSON(out, rep)
	case "github":
		summary := io.Discard
		if p := os.Getenv("GITHUB_STEP_SUMMARY"); p != "" {
			f, ferr := os.OpenFile(p, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
			if ferr != nil {
				return fmt.Errorf("$GITHUB_STEP_SUMMARY %s: %w", p, ferr)
			}
			defer f.Close()
			summary = f
		}
		err = citest.WriteGitHub(out, summary, rep)
	default:
		doc := *rep
		doc.Results = slices.Clone(rep.Results)
		doc.Summarize()
		err = o.output.printDocument(out, citest.ReportKind, &doc)
	}
	if err != nil {
		return err
	}
	if o.junit != "" {
		f, err := os.Create(o.junit)
		if err != nil {
			return fmt.Errorf("--junit %s: %w", o.junit, err)
		}
		defer f.Close()
		if err := citest.WriteJUnit(f, rep, "kproxy test"); err != nil {
			return fmt.Errorf("--junit %s: %w", o.junit, err)
		}
	}
	return nil
}

// progressTo reports progress on long runs: a line every 25 cases.
func progressTo(w io.Writer) func(done, total int, r citest.Result) {
	return func(done, total int, _ citest.Result) {
		if total >= 50 && (done%25 == 0 || done == total) {
			fmt.Fprintf(w, "kproxy test: %d/%d cases\n", done, total)
		}
	}
}

type testGenerateOptions struct {
	from     string
	filter   string
	name     string
	snapshot string
	out      string
}

func newTestGenerateCommand() *cobra.Command {
	o := &testGenerateOptions{}
	cmd := &cobra.Command{
		Use:   "generate --from CAPTURE.jsonl [--filter EXPR]",
		Short: "Turn recorded traffic into a test file whose expectations are the answers seen",
		Long: `Turn a capture (kproxy serve --capture) into a test file: one case per
record, sent by the identity that sent it, expecting the answer the
apiserver gave and the stage kproxy found deciding it ("record in staging,
assert in CI"). Writes need their bodies: record with kproxy serve
--capture-bodies (Secret values and tokens are redacted there; a case that
cannot be sent faithfully without them says so in its note). Records that
cannot become a case (a refused credential, a write without its body) are
listed on stderr with why.

  kproxy test generate --from capture.jsonl --filter '!~c 401' -o tests/recorded.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runGenerate(cmd, o) },
	}
	f := cmd.Flags()
	f.StringVar(&o.from, "from", "", "capture file (JSON Lines) to read, - for stdin")
	f.StringVar(&o.filter, "filter", "", "keep only the records matching this filter expression (as in kproxy flows)")
	f.StringVar(&o.name, "name", "recorded", "the suite's metadata.name")
	f.StringVar(&o.snapshot, "snapshot", "", "the snapshot: field to write (for --engine local)")
	f.StringVarP(&o.out, "output-file", "o", "", "write the test file here (default stdout)")
	return cmd
}

func runGenerate(cmd *cobra.Command, o *testGenerateOptions) error {
	if o.from == "" {
		return testInputError(cmd, errors.New("--from CAPTURE.jsonl is required (a capture written by kproxy serve --capture)"))
	}
	var expr *filter.Expr
	if o.filter != "" {
		var err error
		if expr, err = filter.Parse(o.filter); err != nil {
			return testInputError(cmd, fmt.Errorf("--filter: %w", err))
		}
	}
	var src source.Source
	if o.from == "-" {
		src = source.Reader("stdin", cmd.InOrStdin())
	} else {
		src = source.File(o.from, false)
	}
	recs, skipped, err := readAll(cmd.Context(), src)
	if err != nil {
		return testInputError(cmd, err)
	}
	var kept []*record.Record
	for _, r := range recs {
		if expr == nil || expr.Match(r) {
			kept = append(kept, r)
		}
	}
	f, notes := citest.Generate(kept, o.name)
	f.Snapshot = o.snapshot
	for _, n := range notes {
		fmt.Fprintf(cmd.ErrOrStderr(), "kproxy test generate: %s\n", n)
	}
	if skipped > 0 {
		fmt.Fprintf(cmd.ErrOrStderr(), "kproxy test generate: %d lines of %s were not records (skipped)\n", skipped, o.from)
	}
	if len(f.Cases) == 0 {
		return testInputError(cmd, fmt.Errorf("no case could be generated from %d records of %s", len(kept), o.from))
	}
	b, err := testfile.Marshal(f)
	if err != nil {
		return testInputError(cmd, err)
	}
	header := fmt.Sprintf("# Generated by kproxy test generate --from %s: the answers the apiserver gave.\n", o.from)
	b = append([]byte(header), b...)
	if o.out == "" {
		_, err = cmd.OutOrStdout().Write(b)
		return err
	}
	if err := os.WriteFile(o.out, b, 0o644); err != nil {
		return testInputError(cmd, fmt.Errorf("-o %s: %w", o.out, err))
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "kproxy test generate: wrote %d cases to %s\n", len(f.Cases), o.out)
	return nil
}

// readAll reads a source that does not follow to its end.
func readAll(ctx context.Context, src source.Source) ([]*record.Record, int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan source.Event, 16)
	errc := make(chan error, 1)
	go func() { errc <- src.Run(ctx, events) }()
	var recs []*record.Record
	skipped := 0
	for {
		select {
		case ev := <-events:
			recs = append(recs, ev.Records...)
			skipped += ev.Skipped
			if ev.Done {
				return recs, skipped, nil
			}
		case err := <-errc:
			if err != nil {
				return nil, 0, err
			}
			// Run returned without Done: drain what it sent.
			for {
				select {
				case ev := <-events:
					recs = append(recs, ev.Records...)
					skipped += ev.Skipped
				default:
					return recs, skipped, nil
				}
			}
		}
	}
}

func listenLoopback() (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("serving the snapshot on loopback: %w", err)
	}
	return ln, nil
}

// apiserverOptionsFromArgs parses and completes a kube-apiserver command
// line, as the apiserver would.
func apiserverOptionsFromArgs(args []string) (*apiserver.Options, []string, error) {
	opts, ignored, err := apiserver.OptionsFromArgs(args)
	if err != nil {
		return nil, nil, err
	}
	return opts, ignored, opts.Complete()
}
