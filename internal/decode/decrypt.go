package decode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/server/options/encryptionconfig"
	"k8s.io/apiserver/pkg/storage/value"
)

// Decrypter decrypts etcd values encrypted at rest with the apiserver's own
// transformers, built from its --encryption-provider-config (aescbc,
// aesgcm, secretbox; KMS needs its plugin's socket).
type Decrypter struct {
	resources []schema.GroupResource
	byGR      map[schema.GroupResource]value.Transformer
}

// LoadDecrypter reads an EncryptionConfiguration file, as kube-apiserver
// does. The file holds the keys: kproxy reads it, never prints it.
func LoadDecrypter(ctx context.Context, path string) (*Decrypter, error) {
	cfg, err := encryptionconfig.LoadEncryptionConfig(ctx, path, false, "kproxy")
	if err != nil {
		return nil, fmt.Errorf("--encryption-provider-config %s: %w", path, err)
	}
	d := &Decrypter{byGR: cfg.Transformers}
	for gr := range cfg.Transformers {
		d.resources = append(d.resources, gr)
	}
	sort.Slice(d.resources, func(i, j int) bool { return d.resources[i].String() < d.resources[j].String() })
	return d, nil
}

// Decrypt turns an encrypted etcd value into the stored payload. key is the
// value's etcd key: AES-GCM authenticates it, so it must be exact. Each
// configured resource's transformer is tried in turn; the one whose
// provider and key name match the value's prefix decrypts it.
func (d *Decrypter) Decrypt(ctx context.Context, key string, v []byte) ([]byte, error) {
	if !bytes.HasPrefix(v, []byte(encryptedPrefix)) {
		return v, nil
	}
	var errs []error
	for _, gr := range d.resources {
		out, _, err := d.byGR[gr].TransformFromStorage(ctx, v, value.DefaultContext(key))
		if err == nil && !bytes.HasPrefix(out, []byte(encryptedPrefix)) {
			return out, nil
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", gr, err))
		}
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("no provider of the encryption configuration matches %q", prefixOf(v))
	}
	return nil, fmt.Errorf("cannot decrypt %s (%s): %w", key, prefixOf(v), errors.Join(errs...))
}

// prefixOf is the value's "k8s:enc:<provider>:<version>:<key>:" prefix.
func prefixOf(v []byte) string {
	n := 0
	for i, c := range v {
		if c == ':' {
			n++
			if n == 5 {
				return string(v[:i+1])
			}
		}
		if i > 256 {
			break
		}
	}
	return "k8s:enc:..."
}
