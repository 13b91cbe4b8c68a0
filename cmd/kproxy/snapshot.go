package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel/trace/noop"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/citest"
	"github.com/kproxy/kproxy/internal/credential"
	"github.com/kproxy/kproxy/internal/serve"
	"github.com/kproxy/kproxy/internal/snapshot"
	"github.com/kproxy/kproxy/internal/stages"
	"github.com/kproxy/kproxy/internal/testfile"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

type snapshotOptions struct {
	serve     serve.Options
	dir       string
	forTests  []string
	logLevel  string
	apiserver *apiserverConfig
}

func newSnapshotCommand() *cobra.Command {
	a := newAPIServerConfig()
	o := &snapshotOptions{serve: serve.Options{APIServer: a.opts}, apiserver: a}
	cmd := &cobra.Command{
		Use:   "snapshot -o DIR [--for TESTS...]",
		Short: "Write what the replay reads from a cluster to a directory, for kproxy test run --engine local",
		Long: `Write what kproxy's replay reads from the cluster to DIR: the collections
the replay itself lists and watches (RBAC, flowcontrol, admission and
webhook configurations, admission policies and bindings, namespaces,
quotas, limit ranges, service accounts, CRDs, ...: found by building the
replay against the cluster, not from a hand-kept list), the objects the
test cases name (--for), discovery and the apiserver's version, and the
apiserver's flags (given as for kproxy serve, or --apiserver-manifest),
with the public files they name (client CAs, public keys, authorization
and admission configuration) copied in.

Secrets are never written, not their data nor their names; neither are
files holding credentials (token files, webhook kubeconfigs, private
keys: a service-account signing key is written as its public key).
snapshot.yaml lists what was left out and why.

  kproxy snapshot -o snap --apiserver-manifest /etc/kubernetes/manifests/kube-apiserver.yaml --for tests/
  kproxy test run --engine local --snapshot snap tests/`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runSnapshot(cmd, o) },
	}
	f := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	f.StringVarP(&o.dir, "output-dir", "o", "", "directory to write the snapshot to (created; an existing snapshot there is replaced)")
	f.StringSliceVar(&o.forTests, "for", nil, "test files or directories whose cases' objects to include (repeatable)")
	addKubeconfigFlags(f, &o.serve)
	f.StringVar(&o.logLevel, "log-level", "warn", "log level: debug, info, warn, error")
	a.addFlags(cmd, f, "kube-apiserver static-pod manifest to read the apiserver's flags from", true)
	return cmd
}

// addKubeconfigFlags are kubectl's --kubeconfig and --context, for the
// commands that act as a client of the cluster.
func addKubeconfigFlags(f *pflag.FlagSet, o *serve.Options) {
	f.StringVar(&o.UpstreamKubeconfig, "kubeconfig", "", "kubeconfig to read the cluster with (default: $KUBECONFIG, then ~/.kube/config)")
	f.StringVar(&o.UpstreamContext, "context", "", "context in the kubeconfig")
	f.StringVar(&o.Upstream, "server", "", "the apiserver's URL (default: the kubeconfig's server)")
}

func runSnapshot(cmd *cobra.Command, o *snapshotOptions) error {
	if o.dir == "" {
		return errors.New("-o DIR is required: the directory to write the snapshot to")
	}
	log := newLogger(o.logLevel)
	serve.RouteKlog(log)
	if err := o.apiserver.load(log, true); err != nil {
		return err
	}
	var files []*testfile.File
	if len(o.forTests) > 0 {
		var err error
		if files, err = testfile.Load(o.forTests...); err != nil {
			return err
		}
	}
	cfg, err := serve.LoadUpstreamConfig(&o.serve)
	if err != nil {
		return err
	}
	progress := func(format string, a ...any) { fmt.Fprintf(cmd.ErrOrStderr(), "snapshot: "+format+"\n", a...) }
	// Build the replay against the cluster, recording what it reads: the
	// collections its informers list and watch are what it needs.
	rec := snapshot.NewRecorder()
	recorded := rest.CopyConfig(cfg)
	recorded.Wrap(rec.Wrap)
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	if err := serve.Reachable(ctx, cfg); err != nil {
		return err
	}
	progress("building the replay against %s to learn what it reads", cfg.Host)
	if _, err := serve.NewReplay(ctx, recorded, credential.InConfig(cfg), o.serve.APIServer, noop.NewTracerProvider(), o.serve.SyncTimeout, log); err != nil {
		return err
	}
	cancel()
	named, lists, caseDocs, err := caseReads(files)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(filepath.Join(o.dir, "objects")); err != nil {
		return fmt.Errorf("-o %s: %w", o.dir, err)
	}
	args, leftOut, err := copyFlagFiles(o.dir, o.serve.APIServer.Args())
	if err != nil {
		return err
	}
	docs := caseDocs
	for _, d := range rec.Docs() {
		if !strings.HasPrefix(d.Path, "/openapi/v2") {
			docs = append(docs, d)
		}
	}
	m, err := snapshot.Take(cmd.Context(), o.dir, snapshot.Options{Config: cfg, Collect: append(rec.Collections(), lists...), Named: named,
		Docs: docs, APIServerArgs: args, LeftOut: leftOut, Progress: progress})
	if err != nil {
		return err
	}
	all, some := 0, 0
	for _, r := range m.Resources {
		switch r.Collected {
		case snapshot.CollectedAll:
			all++
		case snapshot.CollectedNamed:
			some++
		}
	}
	fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %d resources whole, %d by name, %d apiserver flags, resourceVersion %s; left out:\n", o.dir, all, some, len(m.APIServerArgs), m.ResourceVersion)
	for _, l := range m.LeftOut {
		fmt.Fprintf(cmd.OutOrStdout(), "  - %s\n", l)
	}
	return nil
}

// caseReads are what the cases' requests read: the object a request
// names (for a create, the body's name) and its namespace, the
// collections they list or watch, and the other documents they get
// (health checks, discovery with their Accept).
func caseReads(files []*testfile.File) (named []snapshot.ObjectRef, lists []schema.GroupVersionResource, docs []snapshot.DocRef, err error) {
	for _, f := range files {
		for i := range f.Cases {
			c := &f.Cases[i]
			req, body, err := citest.NewRequest(c, "https://kproxy-snapshot")
			if err != nil {
				return nil, nil, nil, err
			}
			info, err := stages.ResolveRequestInfo(req)
			if err != nil {
				continue
			}
			if !info.IsResourceRequest {
				if req.Method == http.MethodGet || req.Method == http.MethodHead {
					docs = append(docs, snapshot.DocRef{Path: req.URL.RequestURI(), Accept: req.Header.Get("Accept")})
					if p, ok := stages.HealthReadPath(req.URL); ok {
						docs = append(docs, snapshot.DocRef{Path: p})
					}
				}
				continue
			}
			gvr := schema.GroupVersionResource{Group: info.APIGroup, Version: info.APIVersion, Resource: info.Resource}
			if info.Verb == "list" || info.Verb == "watch" || info.Verb == "deletecollection" {
				lists = append(lists, gvr)
			}
			name := info.Name
			if name == "" && info.Verb == "create" && body != nil {
				var meta struct {
					Metadata struct {
						Name string `json:"name"`
					} `json:"metadata"`
				}
				if yaml.Unmarshal(body, &meta) == nil {
					name = meta.Metadata.Name
				}
			}
			if name != "" {
				named = append(named, snapshot.ObjectRef{GVR: gvr, Namespace: info.Namespace, Name: name})
			}
			if info.Namespace != "" {
				named = append(named, snapshot.ObjectRef{GVR: schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}, Name: info.Namespace})
			}
		}
	}
	return named, lists, docs, nil
}

// Flags whose files are public and copied into a snapshot; flags whose
// files may hold credentials, kept by reference (the path, never the
// contents: the local engine reads them where they are) or dropped.
var (
	publicFileFlags = []string{"client-ca-file", "requestheader-client-ca-file", "service-account-key-file",
		"authorization-config", "authentication-config", "admission-control-config-file", "oidc-ca-file",
		"authorization-policy-file"}
	referencedFileFlags = map[string]string{
		"authorization-webhook-config-file":        "a kubeconfig, which may hold credentials",
		"authentication-token-webhook-config-file": "a kubeconfig, which may hold credentials",
	}
	droppedFileFlags = map[string]string{
		"token-auth-file":                  "it holds bearer tokens (the local engine does not check tokens)",
		"service-account-signing-key-file": "a private key (tokens are checked with the public keys of --service-account-key-file)",
	}
)

// copyFlagFiles copies the public files the flags name into dir/files
// and points the flags there (relative to the snapshot); files that may
// hold credentials are never copied: referenced by path, or dropped,
// each with a note.
func copyFlagFiles(dir string, args []string) ([]string, []string, error) {
	var out, leftOut []string
	for _, a := range args {
		name, value, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if why, ok := droppedFileFlags[name]; ok {
			leftOut = append(leftOut, fmt.Sprintf("--%s: left out: %s", name, why))
			continue
		}
		if why, ok := referencedFileFlags[name]; ok {
			abs, err := filepath.Abs(value)
			if err != nil {
				return nil, nil, err
			}
			leftOut = append(leftOut, fmt.Sprintf("--%s: %s, so kept by path (%s), not copied; the local engine reads it there, or give another with --set-flag %s=PATH", name, why, abs, name))
			out = append(out, "--"+name+"="+abs)
			continue
		}
		if strings.HasPrefix(name, "etcd-") || name == "encryption-provider-config" {
			continue // the local engine never reads etcd
		}
		public := false
		for _, p := range publicFileFlags {
			public = public || p == name
		}
		if !public || value == "" {
			out = append(out, a)
			continue
		}
		b, err := os.ReadFile(value)
		if err != nil {
			return nil, nil, fmt.Errorf("--%s=%s: %w (kproxy snapshot copies the file; run it where the file is, or leave the flag out)", name, value, err)
		}
		if name == "service-account-key-file" {
			if b, err = publicKeys(b); err != nil {
				return nil, nil, fmt.Errorf("--%s=%s: %w", name, value, err)
			}
		}
		rel := filepath.Join("files", name+"-"+filepath.Base(value))
		if err := os.MkdirAll(filepath.Join(dir, "files"), 0o755); err != nil {
			return nil, nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, rel), b, 0o644); err != nil {
			return nil, nil, err
		}
		if name == "admission-control-config-file" {
			leftOut = append(leftOut, "--admission-control-config-file: copied as is; files it names (webhook kubeconfigs) are not")
		}
		out = append(out, "--"+name+"="+rel)
	}
	return out, leftOut, nil
}

// publicKeys keeps only the public half of the keys in a PEM file (a
// service-account key file may hold the private key).
func publicKeys(b []byte) ([]byte, error) {
	var out []byte
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		var pub any
		switch blk.Type {
		case "PUBLIC KEY":
			out = append(out, pem.EncodeToMemory(blk)...)
			continue
		case "RSA PRIVATE KEY":
			k, err := x509.ParsePKCS1PrivateKey(blk.Bytes)
			if err != nil {
				return nil, err
			}
			pub = k.Public()
		case "EC PRIVATE KEY":
			k, err := x509.ParseECPrivateKey(blk.Bytes)
			if err != nil {
				return nil, err
			}
			pub = k.Public()
		case "PRIVATE KEY":
			k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
			if err != nil {
				return nil, err
			}
			p, ok := k.(interface{ Public() any })
			if !ok {
				return nil, fmt.Errorf("a %T key has no public half", k)
			}
			pub = p.Public()
		case "CERTIFICATE":
			c, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				return nil, err
			}
			pub = c.PublicKey
		default:
			continue
		}
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			return nil, err
		}
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})...)
	}
	if len(out) == 0 {
		return nil, errors.New("no key in it")
	}
	return out, nil
}

// localReplay serves a snapshot (with overlays) on loopback and builds
// the replay over it, with the snapshot's apiserver flags and setFlags
// (NAME=VALUE) on top. It returns the pipeline and what the overlays
// changed; stop ends both.
func localReplay(ctx context.Context, dir string, overlays, setFlags []string, syncTimeout time.Duration, logOut io.Writer, logLevel string) (citest.Replayer, []string, func(), error) {
	snap, err := snapshot.Load(dir)
	if err != nil {
		return nil, nil, nil, err
	}
	var changes []string
	for _, ov := range overlays {
		c, err := snap.Apply(ov, apiserver.DefaultObject)
		if err != nil {
			return nil, nil, nil, err
		}
		changes = append(changes, c...)
	}
	args := make([]string, 0, len(snap.Manifest.APIServerArgs)+len(setFlags))
	for _, a := range snap.Manifest.APIServerArgs {
		name, value, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		for _, p := range publicFileFlags {
			if p == name && value != "" && !filepath.IsAbs(value) {
				a = "--" + name + "=" + filepath.Join(dir, value)
			}
		}
		args = append(args, a)
	}
	for _, s := range setFlags {
		name, value, ok := strings.Cut(strings.TrimPrefix(s, "--"), "=")
		if !ok || name == "" {
			return nil, nil, nil, fmt.Errorf("--set-flag %q: want NAME=VALUE, e.g. --set-flag authorization-mode=RBAC", s)
		}
		args = append(args, "--"+name+"="+value)
	}
	opts, ignored, err := apiserverOptionsFromArgs(args)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("the snapshot's apiserver flags (%s, with --set-flag on top): %w", filepath.Join(dir, snapshot.ManifestFile), err)
	}
	for _, s := range setFlags {
		name, _, _ := strings.Cut(strings.TrimPrefix(s, "--"), "=")
		for _, ig := range ignored {
			if ig == "--"+name {
				return nil, nil, nil, fmt.Errorf("--set-flag %s: not a kube-apiserver flag kproxy mirrors (see kproxy serve --help for the list)", name)
			}
		}
	}
	ln, err := listenLoopback()
	if err != nil {
		return nil, nil, nil, err
	}
	srv := &http.Server{Handler: snapshot.NewServer(snap), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	rctx, cancel := context.WithCancel(ctx)
	stop := func() { cancel(); _ = srv.Close() }
	// The replay's warnings about the cluster it reads (no etcd access)
	// say nothing about a snapshot: only errors, unless asked for more.
	if logLevel == "warn" {
		logLevel = "error"
	}
	log := newLoggerTo(logOut, logLevel)
	cfg := &rest.Config{Host: "http://" + ln.Addr().String(), QPS: -1}
	pipeline, err := serve.NewReplay(rctx, cfg, true, opts, noop.NewTracerProvider(), syncTimeout, log)
	if err != nil {
		stop()
		return nil, nil, nil, err
	}
	return pipeline, changes, stop, nil
}
