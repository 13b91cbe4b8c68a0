package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/kproxy/kproxy/internal/decode"
)

func newDecodeCommand() *cobra.Command {
	var output, encryptionConfig, key string
	cmd := &cobra.Command{
		Use:   "decode [FILE|-]",
		Short: "Decode a Kubernetes payload (JSON, YAML, protobuf, CBOR, a watch stream, a Table, an etcd value) to YAML, JSON or a table",
		Long: `Decode a Kubernetes payload: an API request or response body, a watch
stream, or a value read from etcd. The format is detected:

  JSON, YAML          built-in kinds typed, custom resources unstructured
  protobuf            the k8s\x00 envelope, on the wire and in etcd
  CBOR                the self-described tag the apiserver writes (d9d9f7)
  watch streams       JSON events, or length-prefixed protobuf
                      (application/vnd.kubernetes.protobuf;stream=watch)
  Table               meta.k8s.io/v1 Table, the answer to
                      Accept: application/json;as=Table;v=v1;g=meta.k8s.io
                      (the apiserver serves Tables in JSON and YAML only)
  Status              metav1.Status error bodies, in any of the above
  etcd values         protobuf for built-in kinds, JSON for custom
                      resources, or encrypted at rest: k8s:enc:aescbc:v1:,
                      aesgcm, secretbox, kms:v1 and kms:v2, each with the
                      key (or KMS provider) name

A value encrypted at rest is described (provider, key name; for KMS v2
the key ID, annotation keys and DEK source type, never secret bytes) and,
with the apiserver's --encryption-provider-config, decrypted by the
apiserver's own transformers. AES-GCM also needs the value's exact etcd
--key (it is authenticated data). KMS values are decrypted through the
KMS plugin, so its socket must be reachable from where kproxy runs.

Output (-o): yaml (default), json, table (a Table as aligned columns,
like kubectl get; priority columns left out), wide (table with every
column). A watch stream prints one document per event (type and object).

  kubectl get --raw /api/v1/namespaces/default/configmaps/x | kproxy decode -
  etcdctl get /registry/configmaps/default/x --print-value-only | kproxy decode -o json
  etcdctl get /registry/secrets/default/db --print-value-only \
      | kproxy decode --encryption-provider-config enc.yaml --key /registry/secrets/default/db -
  curl -H 'Accept: application/json;as=Table;v=v1;g=meta.k8s.io' .../api/v1/pods | kproxy decode -o table -`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch output {
			case "yaml", "json", "table", "wide":
			default:
				return fmt.Errorf("-o %q: use yaml, json, table or wide", output)
			}
			in := cmd.InOrStdin()
			name := "standard input"
			if len(args) == 1 && args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				in, name = f, args[0]
			}
			b, err := io.ReadAll(io.LimitReader(in, 256<<20))
			if err != nil {
				return fmt.Errorf("read %s: %w", name, err)
			}
			if ct, ok := decode.DetectWatch(b); ok {
				fmt.Fprintf(cmd.ErrOrStderr(), "# watch stream, %s\n", ct)
				return printWatch(cmd.OutOrStdout(), b, ct, output)
			}
			var dec *decode.Decrypter
			if encryptionConfig != "" {
				if dec, err = decode.LoadDecrypter(cmd.Context(), encryptionConfig); err != nil {
					return err
				}
			}
			d, enc, err := decode.DecodeStored(cmd.Context(), dec, key, b)
			switch {
			case errors.Is(err, decode.ErrNotDecrypted):
				// Shown as encrypted: the provider and key are the news.
			case err != nil:
				return fmt.Errorf("%s: %w", name, err)
			}
			note := string(d.Format)
			if enc != nil && err == nil {
				note = fmt.Sprintf("encrypted (%s %s %s), decrypted: %s", enc.Provider, enc.Version, enc.KeyName, d.Format)
			}
			if d.GVK.Kind != "" {
				note += fmt.Sprintf(", %s %s", d.GVK.GroupVersion(), d.GVK.Kind)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "# %s\n", note)
			return printDecoded(cmd.OutOrStdout(), d, output, true)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "yaml", "yaml, json, table or wide (table and wide render a meta.k8s.io Table as columns)")
	cmd.Flags().StringVar(&encryptionConfig, "encryption-provider-config", "", "the apiserver's EncryptionConfiguration, to decrypt a value encrypted at rest")
	cmd.Flags().StringVar(&key, "key", "", "the value's etcd key (AES-GCM authenticates it)")
	return cmd
}

// printDecoded writes one decoded object in the -o format; headers is for
// the table formats.
func printDecoded(w io.Writer, d *decode.Decoded, output string, headers bool) error {
	switch output {
	case "table", "wide":
		t, ok := d.Table()
		if !ok {
			what := string(d.Format)
			if d.GVK.Kind != "" {
				what = d.GVK.GroupVersion().String() + " " + d.GVK.Kind
			}
			return fmt.Errorf("-o %s renders a meta.k8s.io Table (ask the apiserver with Accept: %s); this is %s: use -o yaml or json", output, decode.TableAccept, what)
		}
		return decode.RenderTable(w, t, output == "wide", headers)
	case "json":
		out, err := d.JSON()
		if err != nil {
			return err
		}
		_, err = w.Write(append(out, '\n'))
		return err
	default:
		out, err := d.YAML()
		if err != nil {
			return err
		}
		_, err = w.Write(out)
		return err
	}
}

// printWatch writes each event of a watch stream: a YAML document or a
// JSON object holding type and object, or (table, wide) the rows of the
// Tables a watch with as=Table sends.
func printWatch(w io.Writer, b []byte, contentType, output string) error {
	first := true
	return decode.WatchStream(bytes.NewReader(b), contentType, func(e decode.Event) error {
		defer func() { first = false }()
		if output == "table" || output == "wide" {
			return printDecoded(w, e.Object, output, first)
		}
		if output == "json" {
			ev, err := e.JSON()
			if err != nil {
				return err
			}
			_, err = w.Write(append(ev, '\n'))
			return err
		}
		ev, err := e.YAML()
		if err != nil {
			return err
		}
		_, err = w.Write(append([]byte("---\n"), ev...))
		return err
	})
}
