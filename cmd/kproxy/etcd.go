package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kproxy/kproxy/internal/decode"

	"github.com/kproxy/kproxy/internal/serve"
	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// etcdOptions are kproxy etcd's flags: the apiserver's own etcd flags
// (--etcd-servers, --etcd-cafile, ..., --encryption-provider-config), or
// its manifest.
type etcdOptions struct {
	apiserver *apiserver.Options
	config    *apiserverConfig
	output    *outputFlags
	namespace string
	logLevel  string
}

func newEtcdCommand() *cobra.Command {
	a := newAPIServerConfig()
	o := &etcdOptions{apiserver: a.opts, config: a}
	cmd := &cobra.Command{
		Use:   "etcd",
		Short: "Read what the apiserver stored in etcd: keys, revisions, encoding, encryption, decoded objects",
		Long: `Read etcd directly, as the apiserver stored it (kproxy only reads): the key,
its create and mod revisions, version, lease, size, the value's encoding
(protobuf for built-in types, JSON for custom resources) and encryption
prefix, and the object decoded (decrypted with --encryption-provider-config).
Give the apiserver's etcd flags, or its manifest:

  kproxy etcd get /registry/secrets/default/db --apiserver-manifest kube-apiserver.yaml
  kproxy etcd get secrets -n default db --apiserver-manifest kube-apiserver.yaml
  kproxy etcd ls /registry/configmaps/default --etcd-servers https://127.0.0.1:2379 ...`,
	}
	own := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	o.output = newOutputFlags("raw", "yaml") // raw: the stored bytes
	o.output.addFlags(own)
	own.StringVar(&o.logLevel, "log-level", "warn", "log level: debug, info, warn, error")
	a.addFlags(cmd, own, "kube-apiserver static-pod manifest to read --etcd-* and --encryption-provider-config from", false)
	get := &cobra.Command{
		Use:   "get KEY | get RESOURCE[.GROUP] [-n NAMESPACE] NAME",
		Short: "Show one key, decoded",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.get(cmd.Context(), cmd.OutOrStdout(), args)
		},
	}
	get.Flags().StringVarP(&o.namespace, "namespace", "n", "", "the object's namespace (with RESOURCE NAME)")
	ls := &cobra.Command{
		Use:   "ls PREFIX",
		Short: "List the keys under a prefix with their revisions, size, encoding and encryption (-o table, name, json, yaml, ...)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// -o is get's (default yaml); ls prints a table unless asked.
			format := "table"
			if f := cmd.Flags().Lookup("output"); f != nil && f.Changed {
				format = f.Value.String()
			}
			return o.ls(cmd.Context(), cmd.OutOrStdout(), args[0], format)
		},
	}
	cmd.AddCommand(get, ls)
	return cmd
}

func (o *etcdOptions) client() (*clientv3.Client, error) {
	log := newLogger(o.logLevel)
	// The gRPC connection logs through klog: kproxy's log, at debug.
	serve.RouteKlog(log)
	if err := o.config.load(log, false); err != nil {
		return nil, err
	}
	return apiserver.NewEtcdClient(o.apiserver)
}

// key is the etcd key of args: a key as given, or RESOURCE[.GROUP] NAME
// worked out with the apiserver's own storage factory.
func (o *etcdOptions) key(args []string) (string, error) {
	if len(args) == 1 {
		if !strings.HasPrefix(args[0], "/") {
			return "", fmt.Errorf("%q is not a key (keys start with /, e.g. /registry/secrets/default/db); or give RESOURCE NAME", args[0])
		}
		return args[0], nil
	}
	return apiserver.EtcdKey(o.apiserver, args[0], o.namespace, args[1])
}

// keyMeta is what etcd says of a key, and what its value's first bytes
// say of it (encoding, encryption), undecoded: a line of kproxy etcd ls.
type keyMeta struct {
	Key            string                 `json:"key"`
	CreateRevision int64                  `json:"createRevision"`
	ModRevision    int64                  `json:"modRevision"`
	Version        int64                  `json:"version"`
	Lease          int64                  `json:"lease,omitempty"`
	Size           int                    `json:"size"`
	Encoding       string                 `json:"encoding"`
	Encryption     *decode.EncryptionInfo `json:"encryption,omitempty"`
}

func newKeyMeta(kv *mvccpb.KeyValue) keyMeta {
	k := keyMeta{Key: string(kv.Key), CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Version: kv.Version,
		Lease: kv.Lease, Size: len(kv.Value), Encoding: "unknown"}
	if f, err := decode.Detect(kv.Value); err == nil {
		k.Encoding = string(f)
		if f == decode.Encrypted {
			if d, err := decode.Payload(kv.Value); err == nil {
				enc := d.Encryption
				k.Encryption = &enc
			}
		}
	}
	return k
}

// entry is what kproxy etcd get shows of one key.
type entry struct {
	keyMeta
	StorageVersion string          `json:"storageVersion,omitempty"` // the stored object's apiVersion and kind
	Decrypted      bool            `json:"decrypted,omitempty"`
	Object         json.RawMessage `json:"object,omitempty"`
	Error          string          `json:"error,omitempty"`
}

func (o *etcdOptions) get(ctx context.Context, out io.Writer, args []string) error {
	if err := o.output.validate(); err != nil {
		return err
	}
	c, err := o.client()
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	key, err := o.key(args)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("etcd get %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return fmt.Errorf("etcd has no key %s (at revision %d)", key, resp.Header.Revision)
	}
	kv := resp.Kvs[0]
	if o.output.isHuman() {
		_, err := out.Write(kv.Value)
		return err
	}
	e := entry{keyMeta: newKeyMeta(kv)}
	o.describe(ctx, &e, kv.Value)
	return o.output.printDocument(out, "EtcdEntry", e)
}

// describe fills in the value's encoding, encryption and object,
// decrypting with --encryption-provider-config when given.
func (o *etcdOptions) describe(ctx context.Context, e *entry, v []byte) {
	var dec *decode.Decrypter
	if o.apiserver.EncryptionProviderConfig != "" {
		var err error
		if dec, err = decode.LoadDecrypter(ctx, o.apiserver.EncryptionProviderConfig); err != nil {
			e.Error = err.Error()
			return
		}
	}
	d, enc, err := decode.DecodeStored(ctx, dec, e.Key, v)
	e.Encryption = enc
	switch {
	case d == nil:
		e.Encoding, e.Error = "unknown", err.Error()
		return
	case err != nil:
		e.Encoding, e.Error = string(d.Format), err.Error()
		return
	}
	e.Encoding = string(d.Format)
	e.Decrypted = enc != nil
	if d.GVK.Kind != "" {
		e.StorageVersion = d.GVK.GroupVersion().String() + " " + d.GVK.Kind
	}
	j, err := d.JSON()
	if err != nil {
		e.Error = err.Error()
		return
	}
	e.Object = j
}

func (o *etcdOptions) ls(ctx context.Context, out io.Writer, prefix string, format string) error {
	switch format {
	case "table", "wide", "name":
	case "raw":
		return errors.New("-o raw is for etcd get (one key's stored bytes); etcd ls prints " + etcdLsFormats)
	default:
		if err := o.output.validate(); err != nil {
			return fmt.Errorf("-o %q: etcd ls prints %s", format, etcdLsFormats)
		}
	}
	c, err := o.client()
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithLimit(etcdListLimit))
	if err != nil {
		return fmt.Errorf("etcd get --prefix %s: %w", prefix, err)
	}
	keys := []keyMeta{}
	for _, kv := range resp.Kvs {
		keys = append(keys, newKeyMeta(kv))
	}
	switch format {
	case "table", "wide":
	case "name":
		for _, k := range keys {
			fmt.Fprintln(out, k.Key)
		}
		return nil
	default:
		return o.output.printDocument(out, "EtcdKeyList", map[string]any{"prefix": prefix, "revision": resp.Header.GetRevision(), "more": resp.More, "items": keys})
	}
	if len(keys) == 0 {
		fmt.Fprintf(out, "No keys under %s (at revision %d).\n", prefix, resp.Header.GetRevision())
		return nil
	}
	var rows [][]any
	for _, k := range keys {
		enc := "-"
		if k.Encryption != nil {
			enc = k.Encryption.Provider + "/" + k.Encryption.KeyName
		}
		rows = append(rows, []any{k.Key, k.CreateRevision, k.ModRevision, k.Version, k.Lease, k.Size, k.Encoding, enc})
	}
	if err := printTable(out, []string{"Key", "Create", "Mod", "Version", "Lease", "Size", "Encoding", "Encryption"}, rows); err != nil {
		return err
	}
	if resp.More {
		fmt.Fprintf(out, "... more keys under %s (first %d shown)\n", prefix, len(resp.Kvs))
	}
	return nil
}

// etcdLsFormats are etcd ls's -o formats.
const etcdLsFormats = "table, name, json, yaml, jsonpath or go-template"

// etcdListLimit bounds the keys etcd ls reads.
const etcdListLimit = 10000
