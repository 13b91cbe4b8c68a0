package decode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/server/options/encryptionconfig"
	"k8s.io/apiserver/pkg/storage/value"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"sigs.k8s.io/yaml"
)

// Decrypter decrypts etcd values encrypted at rest with the apiserver's own
// transformers, built from its --encryption-provider-config: aescbc,
// aesgcm and secretbox with the keys the file holds, kms v1 and v2
// through the KMS plugin's socket (which must be reachable from here).
type Decrypter struct {
	path      string
	resources []schema.GroupResource
	byGR      map[schema.GroupResource]value.Transformer
	// prefixes maps each "k8s:enc:<provider>:<version>:<key name>:" the
	// configuration can read to the resources configured with it.
	prefixes map[string][]schema.GroupResource
	// kms maps a KMS provider's name to its plugin endpoint;
	// unreachable holds those whose socket could not be dialled.
	kms         map[string]string
	unreachable map[string]error
}

// LoadDecrypter reads an EncryptionConfiguration file, as kube-apiserver
// does. The file holds the keys: kproxy reads it, never prints it. A KMS
// provider whose plugin socket cannot be dialled is left out (its values
// then fail to decrypt saying so) rather than probed in the background;
// for a reachable KMS v2 plugin, the apiserver's transformer probes it
// for as long as ctx lives. A KMS v1 provider needs the KMSv1 feature
// gate, as in the apiserver: LoadDecrypter turns it on in this process
// (the apiserver the configuration comes from must have it on).
func LoadDecrypter(ctx context.Context, path string) (*Decrypter, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--encryption-provider-config: %w", err)
	}
	var file apiserverv1.EncryptionConfiguration
	if err := yaml.Unmarshal(raw, &file); err != nil {
		return nil, fmt.Errorf("--encryption-provider-config %s: not an EncryptionConfiguration: %w", path, err)
	}
	d := &Decrypter{path: path, prefixes: map[string][]schema.GroupResource{}, kms: map[string]string{}, unreachable: map[string]error{}}
	dropped := false
	for i, r := range file.Resources {
		var keep []apiserverv1.ProviderConfiguration
		for _, p := range r.Providers {
			for _, prefix := range providerPrefixes(p) {
				for _, res := range r.Resources {
					d.prefixes[prefix] = append(d.prefixes[prefix], schema.ParseGroupResource(res))
				}
			}
			if p.KMS != nil {
				d.kms[p.KMS.Name] = p.KMS.Endpoint
				if err := reachable(p.KMS.Endpoint); err != nil {
					d.unreachable[p.KMS.Name] = err
					dropped = true
					continue
				}
				if p.KMS.APIVersion == "" || p.KMS.APIVersion == "v1" {
					if err := enableKMSv1(); err != nil {
						return nil, fmt.Errorf("--encryption-provider-config %s: KMS v1 provider %s: %w", path, p.KMS.Name, err)
					}
				}
			}
			keep = append(keep, p)
		}
		if len(keep) == 0 {
			keep = []apiserverv1.ProviderConfiguration{{Identity: &apiserverv1.IdentityConfiguration{}}}
		}
		file.Resources[i].Providers = keep
	}
	load := path
	if dropped {
		// The upstream loader reads a file: hand it the configuration
		// without the unreachable plugins, in a private file it reads once.
		if load, err = writePrivate(&file); err != nil {
			return nil, fmt.Errorf("--encryption-provider-config %s: %w", path, err)
		}
		defer os.Remove(load)
	}
	cfg, err := encryptionconfig.LoadEncryptionConfig(ctx, load, false, "kproxy")
	if err != nil {
		return nil, fmt.Errorf("--encryption-provider-config %s: %w", path, err)
	}
	d.byGR = cfg.Transformers
	for gr := range cfg.Transformers {
		d.resources = append(d.resources, gr)
	}
	sort.Slice(d.resources, func(i, j int) bool { return d.resources[i].String() < d.resources[j].String() })
	return d, nil
}

// writePrivate writes an EncryptionConfiguration to a new file only this
// user can read.
func writePrivate(cfg *apiserverv1.EncryptionConfiguration) (string, error) {
	cfg.APIVersion, cfg.Kind = apiserverv1.SchemeGroupVersion.String(), "EncryptionConfiguration"
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp("", "kproxy-encryption-config-*.yaml") // mode 0600
	if err != nil {
		return "", err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), f.Close()
}

// providerPrefixes are the value prefixes one provider reads.
func providerPrefixes(p apiserverv1.ProviderConfiguration) []string {
	var out []string
	keys := func(provider string, ks []apiserverv1.Key) {
		for _, k := range ks {
			out = append(out, encryptedPrefix+provider+":v1:"+k.Name+":")
		}
	}
	switch {
	case p.AESCBC != nil:
		keys("aescbc", p.AESCBC.Keys)
	case p.AESGCM != nil:
		keys("aesgcm", p.AESGCM.Keys)
	case p.Secretbox != nil:
		keys("secretbox", p.Secretbox.Keys)
	case p.KMS != nil:
		v := p.KMS.APIVersion
		if v == "" {
			v = "v1"
		}
		out = append(out, encryptedPrefix+"kms:"+v+":"+p.KMS.Name+":")
	}
	return out
}

// enableKMSv1 turns on the deprecated KMSv1 feature gate the upstream
// configuration loader requires for kms v1 providers.
func enableKMSv1() error {
	if utilfeature.DefaultFeatureGate.Enabled(features.KMSv1) {
		return nil
	}
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{string(features.KMSv1): true}); err != nil {
		return fmt.Errorf("cannot turn on the KMSv1 feature gate kms v1 needs: %w", err)
	}
	return nil
}

// Decrypt turns an encrypted etcd value into the stored payload; a value
// that is not encrypted is returned as is. key is the value's etcd key:
// AES-GCM authenticates it, so it must be exact. The configuration's
// transformers for the value's provider and key name decrypt it; KMS
// values go through the provider's plugin, which must be reachable.
func (d *Decrypter) Decrypt(ctx context.Context, key string, v []byte) ([]byte, error) {
	if !bytes.HasPrefix(v, []byte(encryptedPrefix)) {
		return v, nil
	}
	info, err := parseEncryption(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", orUnknownKey(key), err)
	}
	prefix := EncryptionPrefix(v)
	grs := d.prefixes[prefix]
	if len(grs) == 0 {
		return nil, fmt.Errorf("%s is encrypted with %s (%s), which the encryption configuration %s does not have (it has %s): "+
			"give the configuration the apiserver wrote this value with", orUnknownKey(key), info.describe(), prefix, d.path, d.known())
	}
	if info.Provider == "kms" {
		if err := d.unreachable[info.KeyName]; err != nil {
			return nil, fmt.Errorf("KMS plugin %s at %s is not reachable from here: kproxy decrypts KMS values through the plugin "+
				"(run it where the plugin's socket is, e.g. on the control-plane node): %w", info.KeyName, d.kms[info.KeyName], err)
		}
	}
	var errs []error
	for _, gr := range grs {
		t, ok := d.byGR[gr]
		if !ok {
			continue
		}
		out, _, err := t.TransformFromStorage(ctx, v, value.DefaultContext(key))
		if err == nil && !bytes.HasPrefix(out, []byte(encryptedPrefix)) {
			return out, nil
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("as %s: %w", gr, err))
		}
	}
	hint := "the key's secret differs from the one the apiserver encrypted with, or the value is corrupt"
	switch {
	case info.Provider == "aesgcm" && key == "":
		hint = "AES-GCM authenticates the value's etcd key: give it exactly (--key)"
	case info.Provider == "aesgcm":
		hint = "AES-GCM authenticates the etcd key: is " + key + " the value's exact key? Else " + hint
	case info.Provider == "kms":
		hint = "the plugin could not decrypt the DEK, or the data does not match it"
	}
	return nil, fmt.Errorf("cannot decrypt %s with %s: %w (%s)", orUnknownKey(key), info.describe(), errors.Join(errs...), hint)
}

// known lists the provider/key pairs the configuration can decrypt.
func (d *Decrypter) known() string {
	var ps []string
	for p := range d.prefixes {
		ps = append(ps, strings.TrimSuffix(strings.TrimPrefix(p, encryptedPrefix), ":"))
	}
	if len(ps) == 0 {
		return "only identity"
	}
	sort.Strings(ps)
	return strings.Join(ps, ", ")
}

func orUnknownKey(key string) string {
	if key == "" {
		return "the value"
	}
	return key
}

// reachable dials a KMS plugin endpoint (unix:///path/to/socket).
func reachable(endpoint string) error {
	path, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok {
		return fmt.Errorf("endpoint %q is not unix://", endpoint)
	}
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// ErrNotDecrypted is DecodeStored's answer for a value encrypted at rest
// when it has no Decrypter: the Decoded says how the value is encrypted.
var ErrNotDecrypted = errors.New("encrypted at rest: give --encryption-provider-config (the apiserver's) to decrypt")

// DecodeStored decodes a value as etcd stores it: detected, decrypted
// with dec when it is encrypted at rest, and decoded. enc is how it was
// encrypted (nil when it was not). With a nil dec an encrypted value comes
// back undecoded with ErrNotDecrypted. key is the value's etcd key
// (AES-GCM authenticates it).
func DecodeStored(ctx context.Context, dec *Decrypter, key string, v []byte) (d *Decoded, enc *EncryptionInfo, err error) {
	if d, err = Payload(v); err != nil {
		return nil, nil, err
	}
	if d.Format != Encrypted {
		return d, nil, nil
	}
	info := d.Encryption
	if dec == nil {
		return d, &info, ErrNotDecrypted
	}
	plain, err := dec.Decrypt(ctx, key, v)
	if err != nil {
		return d, &info, err
	}
	clear, err := Payload(plain)
	if err != nil {
		return d, &info, fmt.Errorf("decrypted, but: %w", err)
	}
	return clear, &info, nil
}
