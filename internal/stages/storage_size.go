package stages

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kdecode "github.com/kproxy/kproxy/internal/decode"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// etcd's limits on one write, as the apiserver meets them: etcd refuses
// a proposal larger than its --max-request-bytes ("etcdserver: request is
// too large"), and the apiserver's etcd client refuses to send a gRPC
// message over 2 MiB (clientv3's default MaxCallSendMsgSize). Either way
// the apiserver answers 500 with the error's text, after retrying once
// without managedFields.
const etcdClientMaxSend = 2 * 1024 * 1024

// raftOverhead bounds what etcd adds around the transaction before it
// compares with --max-request-bytes (the InternalRaftRequest header with
// its random ID). Sizes this close to the limit are not predicted.
const raftOverhead = 32

// encryptionSlack bounds what encryption at rest adds to a value (a
// provider's prefix, nonce and tag; a KMS envelope's wrapped key): sizes
// this close to the limit are not predicted when the encryption
// configuration could not be loaded.
const encryptionSlack = 4096

// sizeCheck encodes the object the write would store as the apiserver
// does (storage codec and version, encryption at rest) and compares the
// etcd transaction with etcd's limits.
func (st storageStage) sizeCheck(ctx context.Context, req *Request, run *apiserver.Run, pass string, current *apiserver.EtcdKV) Result {
	w := st.m.writer()
	if len(run.Object) == 0 || (run.Verb != "create" && run.Verb != "update" && run.Verb != "patch") || len(run.Reads) == 0 {
		return Pass(pass)
	}
	switch sub := req.Info.Subresource; sub {
	case "", "status", "ephemeralcontainers", "resize", "approval", "finalize":
	default:
		// A scale's answer is the Scale, a TokenRequest's the token, an
		// eviction's or a binding's a Status: not the object stored,
		// whose size such a write barely moves.
		return Pass(pass + "; the stored size is not computed for a " + sub + " write (its answer is not the stored object)")
	}
	key := run.Reads[len(run.Reads)-1]
	var modRev int64
	if key.Found {
		modRev, _ = strconv.ParseInt(key.ResourceVersion, 10, 64)
	}
	d, err := kdecode.Payload(run.Object)
	if err != nil || d.Object == nil {
		return Pass(pass + "; the stored size is not computed (the replay's answer did not decode)")
	}
	txn, stored, prefix, err := w.StoredSize(ctx, gr(req), d.Object, key.Key, modRev, key.Found)
	if err != nil {
		return Pass(pass + "; the stored size is not computed: " + err.Error())
	}
	limit := st.m.opts.EtcdMaxRequestBytes
	if txn > limit-raftOverhead {
		// The handler retries without managedFields.
		obj := d.Object.DeepCopyObject()
		if m, err := meta.Accessor(obj); err == nil && len(m.GetManagedFields()) > 0 {
			m.SetManagedFields(nil)
			if txn, stored, prefix, err = w.StoredSize(ctx, gr(req), obj, key.Key, modRev, key.Found); err != nil {
				return Pass(pass + "; the stored size is not computed: " + err.Error())
			}
		}
	}
	what := fmt.Sprintf("the stored value is %d bytes as the apiserver encodes it, the etcd transaction %d bytes, etcd's --max-request-bytes %d", stored, txn, limit)
	switch {
	case prefix != "":
		what += "; the write encrypts as " + prefix
		if current != nil && current.Found && current.Encryption != prefix {
			was := current.Encryption
			if was == "" {
				was = "not encrypted"
			}
			what += " (the stored value is " + was + ": writing re-encrypts it with the configuration's first provider)"
		}
	case w.EncryptionError() != nil:
		what += "; encryption at rest not applied: " + w.EncryptionError().Error()
	case st.m.opts.EncryptionProviderConfig == "":
		what += "; not encrypted (no --encryption-provider-config)"
	}
	unsized := w.EncryptionError() != nil && txn > limit-encryptionSlack
	if run.DryRun {
		// Nothing reaches etcd in dry run: say what a real write would meet.
		verdict := "it would fit"
		switch {
		case unsized:
			verdict = "a real write would be near etcd's limit, by how much is not known without the encryption configuration"
		case txn > etcdClientMaxSend:
			verdict = "a real write would fail: over the apiserver's etcd client's 2 MiB gRPC message limit"
		case txn > limit+raftOverhead:
			verdict = "a real write would fail: etcd refuses a request that large"
		case txn > limit-raftOverhead:
			verdict = "a real write would be within a few bytes of etcd's limit"
		}
		return Pass(pass + "; nothing reaches etcd in dry run: " + strings.Replace(what, "the stored value is", "stored for real, the value would be", 1) + "; " + verdict)
	}
	switch {
	case unsized:
		return Unknown(what + ": near etcd's limit, and what encryption at rest adds is not known")
	case txn > etcdClientMaxSend:
		msg := fmt.Sprintf("rpc error: code = ResourceExhausted desc = trying to send message larger than max (%d vs. %d)", txn, etcdClientMaxSend)
		return Reject(&metav1.Status{Status: metav1.StatusFailure, Code: http.StatusInternalServerError, Message: msg},
			"storage refuses: "+what+": over the apiserver's etcd client's 2 MiB gRPC message limit (even without managedFields)")
	case txn > limit+raftOverhead:
		return Reject(&metav1.Status{Status: metav1.StatusFailure, Code: http.StatusInternalServerError, Message: "etcdserver: request is too large"},
			"storage refuses: "+what+": etcd refuses a request that large (even without managedFields)")
	case txn > limit-raftOverhead:
		return Unknown(what + ": within a few bytes of etcd's limit, too close to call")
	}
	return Pass(pass + "; " + what)
}
