package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/printers"

	"github.com/kproxy/kproxy/internal/decode"
)

func newDecodeCommand() *cobra.Command {
	var encryptionConfig, key string
	out := newOutputFlags("table", "yaml")
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

Output (-o): yaml (default), json, jsonpath=..., go-template=... (kubectl's
printers), table (a Table as aligned columns, like kubectl get; priority
columns left out), wide (table with every column). A watch stream prints
one document per event (type and object, as kubectl get -w
--output-watch-events).

  kubectl get --raw /api/v1/namespaces/default/configmaps/x | kproxy decode -
  etcdctl get /registry/configmaps/default/x --print-value-only | kproxy decode -o json
  etcdctl get /registry/secrets/default/db --print-value-only \
      | kproxy decode --encryption-provider-config enc.yaml --key /registry/secrets/default/db -
  curl -H 'Accept: application/json;as=Table;v=v1;g=meta.k8s.io' .../api/v1/pods | kproxy decode -o table -`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.validate("wide", "name"); err != nil {
				return err
			}
			p := &decodedPrinter{out: out}
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
				return p.watch(cmd.OutOrStdout(), b, ct)
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
			return p.print(cmd.OutOrStdout(), d)
		},
	}
	out.addFlags(cmd.Flags(), "wide")
	cmd.Flags().StringVar(&encryptionConfig, "encryption-provider-config", "", "the apiserver's EncryptionConfiguration, to decrypt a value encrypted at rest")
	cmd.Flags().StringVar(&key, "key", "", "the value's etcd key (AES-GCM authenticates it)")
	return cmd
}

// decodedPrinter prints decoded objects in the -o format: kubectl's
// printers for the structured formats, kubectl's table layout for a Table.
type decodedPrinter struct {
	out     *outputFlags
	printer printers.ResourcePrinter
	printed int
}

func (p *decodedPrinter) structured() (printers.ResourcePrinter, error) {
	if p.printer == nil {
		pr, err := p.out.print.ToPrinter()
		if err != nil {
			return nil, err
		}
		p.printer = pr
	}
	return p.printer, nil
}

// print writes one decoded object.
func (p *decodedPrinter) print(w io.Writer, d *decode.Decoded) error {
	defer func() { p.printed++ }()
	if p.out.isHuman("wide") {
		t, ok := d.Table()
		if !ok {
			what := string(d.Format)
			if d.GVK.Kind != "" {
				what = d.GVK.GroupVersion().String() + " " + d.GVK.Kind
			}
			return fmt.Errorf("-o %s renders a meta.k8s.io Table (ask the apiserver with Accept: %s); this is %s: use -o yaml or json", *p.out.print.OutputFormat, decode.TableAccept, what)
		}
		return decode.RenderTable(w, t, *p.out.print.OutputFormat == "wide", p.printed == 0)
	}
	obj, err := printable(d)
	if err != nil {
		return err
	}
	pr, err := p.structured()
	if err != nil {
		return err
	}
	return pr.PrintObj(obj, w)
}

// watch writes each event of a watch stream: a watch event (type and
// object) in the structured formats, or the rows of the Tables a watch
// with as=Table sends.
func (p *decodedPrinter) watch(w io.Writer, b []byte, contentType string) error {
	return decode.WatchStream(bytes.NewReader(b), contentType, func(e decode.Event) error {
		if p.out.isHuman("wide") {
			return p.print(w, e.Object)
		}
		obj, err := printable(e.Object)
		if err != nil {
			return err
		}
		pr, err := p.structured()
		if err != nil {
			return err
		}
		return pr.PrintObj(&metav1.WatchEvent{Type: e.Type, Object: runtime.RawExtension{Object: obj}}, w)
	})
}

// printable is the decoded object as the printers take it: unstructured
// when it names its kind, raw JSON otherwise (an encrypted value kproxy
// could not decrypt is described, not an object).
func printable(d *decode.Decoded) (runtime.Object, error) {
	b, err := d.JSON()
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(b); err == nil {
		return u, nil
	}
	return &runtime.Unknown{Raw: b, ContentType: runtime.ContentTypeJSON}, nil
}
