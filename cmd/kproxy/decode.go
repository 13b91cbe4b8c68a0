package main

import (
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
		Short: "Decode a Kubernetes payload (JSON, YAML, protobuf, CBOR, an etcd value) to YAML or JSON",
		Long: `Decode a Kubernetes payload: an API request or response body, or a value
read from etcd, in JSON, YAML, protobuf (the k8s\x00 envelope) or CBOR. The
format is detected. A value encrypted at rest (k8s:enc:...) is recognized
and its provider and key named, and decrypted with the apiserver's
--encryption-provider-config (AES-GCM also needs the value's exact etcd
--key).

  kubectl get --raw /api/v1/namespaces/default/configmaps/x -v=0 \
      | kproxy decode -
  etcdctl get /registry/configmaps/default/x --print-value-only | kproxy decode -o json
  etcdctl get /registry/secrets/default/db --print-value-only \
      | kproxy decode --encryption-provider-config enc.yaml --key /registry/secrets/default/db -`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var in io.Reader = cmd.InOrStdin()
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
			d, err := decode.Payload(b)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if d.Format == decode.Encrypted && encryptionConfig != "" {
				dec, err := decode.LoadDecrypter(cmd.Context(), encryptionConfig)
				if err != nil {
					return err
				}
				if b, err = dec.Decrypt(cmd.Context(), key, b); err != nil {
					return fmt.Errorf("%s: %w (is --key the value's exact etcd key?)", name, err)
				}
				if d, err = decode.Payload(b); err != nil {
					return fmt.Errorf("%s, decrypted: %w", name, err)
				}
			}
			var out []byte
			switch output {
			case "yaml":
				out, err = d.YAML()
			case "json":
				out, err = d.JSON()
				out = append(out, '\n')
			default:
				return fmt.Errorf("-o %q: use yaml or json", output)
			}
			if err != nil {
				return err
			}
			if d.GVK.Kind != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "# %s, %s %s\n", d.Format, d.GVK.GroupVersion(), d.GVK.Kind)
			} else {
				fmt.Fprintf(cmd.ErrOrStderr(), "# %s\n", d.Format)
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "yaml", "yaml or json")
	cmd.Flags().StringVar(&encryptionConfig, "encryption-provider-config", "", "the apiserver's EncryptionConfiguration, to decrypt a value encrypted at rest")
	cmd.Flags().StringVar(&key, "key", "", "the value's etcd key (AES-GCM authenticates it)")
	return cmd
}
