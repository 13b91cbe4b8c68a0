package apiserver

import (
	"context"
	"fmt"

	etcdserverpb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/storage/value"

	kdecode "github.com/kproxy/kproxy/internal/decode"
)

// StoredSize is the size of the etcd transaction that would store obj
// under the registry key (the etcd3 store's OptimisticPut: the storage
// codec and version, encryption at rest as the apiserver's), of the value,
// and the encryption prefix it would carry.
func (w *Server) StoredSize(ctx context.Context, gr schema.GroupResource, obj runtime.Object, registryKey string, modRev int64, update bool) (txn, stored int, prefix string, err error) {
	s := w.storage.stores.get(gr)
	if s == nil {
		return 0, 0, "", fmt.Errorf("kproxy has no store for %s", gr)
	}
	etcdKey := "/" + trimSlashes(w.opts.EtcdPrefix) + registryKey
	obj = obj.DeepCopyObject()
	if err := (storageVersioner{}).prepare(obj); err != nil {
		return 0, 0, "", err
	}
	data, err := runtime.Encode(s.config.Codec, obj)
	if err != nil {
		return 0, 0, "", fmt.Errorf("encoding for storage: %w", err)
	}
	if t := s.transformer; t != nil {
		if data, err = t.TransformToStorage(ctx, data, value.DefaultContext(etcdKey)); err != nil {
			return 0, 0, "", fmt.Errorf("encrypting as the apiserver would: %w", err)
		}
		if kdecode.IsEncrypted(data) {
			prefix = kdecode.EncryptionPrefix(data)
		}
	}
	r := &etcdserverpb.TxnRequest{
		Compare: []*etcdserverpb.Compare{{Key: []byte(etcdKey), Target: etcdserverpb.Compare_MOD, Result: etcdserverpb.Compare_EQUAL,
			TargetUnion: &etcdserverpb.Compare_ModRevision{ModRevision: modRev}}},
		Success: []*etcdserverpb.RequestOp{{Request: &etcdserverpb.RequestOp_RequestPut{RequestPut: &etcdserverpb.PutRequest{Key: []byte(etcdKey), Value: data}}}},
	}
	if update {
		r.Failure = []*etcdserverpb.RequestOp{{Request: &etcdserverpb.RequestOp_RequestRange{RequestRange: &etcdserverpb.RangeRequest{Key: []byte(etcdKey)}}}}
	}
	return proto.Size(r), len(data), prefix, nil
}

// storageVersioner clears what the etcd3 store clears before encoding.
type storageVersioner struct{}

func (storageVersioner) prepare(obj runtime.Object) error {
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	m.SetResourceVersion("")
	m.SetSelfLink("")
	return nil
}

func trimSlashes(s string) string {
	for len(s) > 0 && s[0] == '/' {
		s = s[1:]
	}
	for len(s) > 0 && s[len(s)-1] == '/' {
		s = s[:len(s)-1]
	}
	return s
}

// EncryptionError says why encryption at rest is not applied when the
// apiserver's --encryption-provider-config could not be loaded.
func (w *Server) EncryptionError() error { return w.storage.encErr }
