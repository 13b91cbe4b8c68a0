// Package kmstest is a KMS v2 plugin for tests: the upstream gRPC service
// (k8s.io/kms/pkg/service) over a unix socket, encrypting DEK sources with
// AES-GCM under a fixed, public test key. The e2e apiserver encrypts with
// it and the decode tests decrypt the values it wrote through it, so the
// key must never change (the golden values under testdata/decode/etcd
// depend on it). Never use it for anything but tests.
package kmstest

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"k8s.io/kms/pkg/service"
)

// KeyID is the KMS key ID the plugin reports and writes into every
// EncryptedObject.
const KeyID = "kproxy-test-kms-key-1"

// AnnotationKey is the one annotation the plugin returns with each
// encrypted DEK source.
const AnnotationKey = "version.kms.kproxy.test"

// key is the plugin's fixed AES-256 key (test only).
var key = []byte("kproxy test KMS key, public: 32B")

// Plugin is a running test KMS v2 plugin.
type Plugin struct {
	// Endpoint is the plugin's address for an EncryptionConfiguration:
	// unix:///path/to/socket.
	Endpoint string
	svc      *service.GRPCService
	done     chan error
}

// Start serves the plugin on a unix socket at path (a stale socket file is
// removed) and returns once it accepts connections.
func Start(path string) (*Plugin, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	_ = os.Remove(path)
	p := &Plugin{Endpoint: "unix://" + path, svc: service.NewGRPCService(path, 10*time.Second, &plugin{aead: aead}), done: make(chan error, 1)}
	go func() { p.done <- p.svc.ListenAndServe() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("unix", path)
		if err == nil {
			c.Close()
			return p, nil
		}
		select {
		case err := <-p.done:
			return nil, fmt.Errorf("test KMS plugin on %s: %w", path, err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.svc.Close()
			return nil, fmt.Errorf("test KMS plugin on %s did not start: %w", path, err)
		}
	}
}

// Stop closes the plugin's server.
func (p *Plugin) Stop() { p.svc.Close() }

type plugin struct{ aead cipher.AEAD }

func (p *plugin) Status(context.Context) (*service.StatusResponse, error) {
	return &service.StatusResponse{Version: "v2", Healthz: "ok", KeyID: KeyID}, nil
}

func (p *plugin) Encrypt(_ context.Context, _ string, data []byte) (*service.EncryptResponse, error) {
	nonce := make([]byte, p.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return &service.EncryptResponse{Ciphertext: p.aead.Seal(nonce, nonce, data, []byte(KeyID)), KeyID: KeyID,
		Annotations: map[string][]byte{AnnotationKey: []byte("1")}}, nil
}

func (p *plugin) Decrypt(_ context.Context, _ string, req *service.DecryptRequest) ([]byte, error) {
	if req.KeyID != KeyID {
		return nil, fmt.Errorf("test KMS plugin: unknown key ID %q (it has %q)", req.KeyID, KeyID)
	}
	n := p.aead.NonceSize()
	if len(req.Ciphertext) < n {
		return nil, errors.New("test KMS plugin: the ciphertext is shorter than a nonce")
	}
	return p.aead.Open(nil, req.Ciphertext[:n], req.Ciphertext[n:], []byte(KeyID))
}
