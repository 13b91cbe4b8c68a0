// Package pki makes the certificates kproxy needs when nobody hands it any:
// a local CA, serving certificates signed by it, and client certificates for
// the local test cluster. Keys are ECDSA P-256: fast to make, accepted by
// kube-apiserver and client-go.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority that can sign leaf certificates.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// NewCA makes a self-signed CA valid for ten years.
func NewCA(commonName string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// LoadCA reads a CA certificate and key from PEM files.
func LoadCA(certFile, keyFile string) (*CA, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load CA %s / %s: %w", certFile, keyFile, err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("parse CA %s: %w", certFile, err)
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("CA key %s cannot sign", keyFile)
	}
	return &CA{Cert: cert, Key: signer}, nil
}

// Leaf describes a certificate to issue.
type Leaf struct {
	CommonName   string
	Organization []string // Kubernetes groups for client certificates
	DNSNames     []string
	IPs          []net.IP
	Client       bool // client auth usage
	Server       bool // server auth usage
	NotBefore    time.Time
	NotAfter     time.Time // zero: one year from now
}

// Issued is a signed certificate with its key.
type Issued struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// Issue signs a leaf certificate.
func (ca *CA) Issue(l Leaf) (*Issued, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	nb, na := l.NotBefore, l.NotAfter
	if nb.IsZero() {
		nb = now.Add(-time.Hour)
	}
	if na.IsZero() {
		na = now.AddDate(1, 0, 0)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: l.CommonName, Organization: l.Organization},
		NotBefore:    nb,
		NotAfter:     na,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		DNSNames:     l.DNSNames,
		IPAddresses:  l.IPs,
	}
	if l.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	if l.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &Issued{Cert: cert, Key: key}, nil
}

// TLSCertificate returns the pair for a tls.Config, with the chain.
func (i *Issued) TLSCertificate(chain ...*x509.Certificate) tls.Certificate {
	c := tls.Certificate{Certificate: [][]byte{i.Cert.Raw}, PrivateKey: i.Key, Leaf: i.Cert}
	for _, ch := range chain {
		c.Certificate = append(c.Certificate, ch.Raw)
	}
	return c
}

// CertPEM encodes a certificate.
func CertPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// KeyPEM encodes a private key in PKCS#8.
func KeyPEM(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// PublicKeyPEM encodes a public key in PKIX form.
func PublicKeyPEM(k crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// WritePair writes cert and key PEM files into dir as name.crt and name.key
// and returns their paths.
func WritePair(dir, name string, cert *x509.Certificate, key crypto.Signer) (certFile, keyFile string, err error) {
	certFile = filepath.Join(dir, name+".crt")
	keyFile = filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, CertPEM(cert), 0o644); err != nil {
		return "", "", err
	}
	kp, err := KeyPEM(key)
	if err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyFile, kp, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return n
}

// LoadOrCreateCA loads dir/ca.crt and dir/ca.key, creating them on first
// use, so clients trust one kproxy CA across restarts.
func LoadOrCreateCA(dir, commonName string) (*CA, error) {
	certFile, keyFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	if _, err := os.Stat(certFile); err == nil {
		return LoadCA(certFile, keyFile)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create kproxy's CA directory %s: %w", dir, err)
	}
	ca, err := NewCA(commonName)
	if err != nil {
		return nil, err
	}
	if _, _, err := WritePair(dir, "ca", ca.Cert, ca.Key); err != nil {
		return nil, fmt.Errorf("write kproxy's CA to %s: %w", dir, err)
	}
	return ca, nil
}
