package e2e

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// TestUndecryptableSecret: a Secret encrypted at rest with a key the
// apiserver's encryption configuration no longer has (a key lost in a
// rotation), put into the real etcd by the test. The apiserver cannot read
// it: a get answers the etcd3 store's "corrupt object" 500 ("data from the
// storage is not transformable"), a delete too, and only a DELETE with
// ignoreStoreReadErrorWithClusterBreakingPotential removes it (dry run
// first). kproxy decrypts with the same configuration and predicts each
// answer; the reads the apiserver's watch cache answers are predicted or
// unknown, never another answer. A kproxy started while the Secret is
// there (every list of secrets fails) predicts too: it does not wait for
// secrets.
func TestUndecryptableSecret(t *testing.T) {
	ctx := context.Background()
	const name = "lost-key"
	key, err := apiserver.EtcdKey(apiserver.NewOptions(), "secrets", testNS, name)
	if err != nil {
		t.Fatal(err)
	}
	recs, r, c := oneReplayWorker(t)
	secrets := "/api/v1/namespaces/" + testNS + "/secrets"
	waitPredicted(t, recs, r, c, request{method: "GET", path: secrets, user: "admin"})

	// The apiserver's watch cache of secrets cannot list while the key is
	// there (429, "storage is (re)initializing"), nor for a few seconds
	// after: the next test must not meet it.
	etcd := etcdClient(t)
	sealed := make([]byte, 64)
	_, _ = rand.Read(sealed)
	if _, err := etcd.Put(ctx, key, "k8s:enc:aescbc:v1:rotated-away:"+string(sealed)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = etcd.Delete(context.Background(), key)
		err := wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := adminClient().CoreV1().Secrets(testNS).List(ctx, metav1.ListOptions{})
			return err == nil, nil
		})
		if err != nil {
			t.Errorf("the apiserver lists secrets again %v after the key is gone: %v", 90*time.Second, err)
		}
	})
	// A kproxy started now, with the Secret unreadable (every list of
	// secrets fails), still predicts: it does not wait for secrets.
	{
		recs, r, c := oneReplayWorker(t)
		waitPredicted(t, recs, r, c, request{method: "GET", path: "/api/v1/namespaces/" + testNS + "/configmaps", user: "admin"})
		do(t, c, r.base, request{method: "GET", path: secrets + "/" + name, user: "admin"})
		checkPredicted(t, nextRecord(t, recs))
	}

	path := "/api/v1/namespaces/" + testNS + "/secrets/" + name
	unsafe := path + "?ignoreStoreReadErrorWithClusterBreakingPotential=true"
	for _, tc := range []struct {
		req    request
		status int
		exact  bool // else predicted as answered or unknown
		late   bool // replayed behind queued writes
	}{
		{request{method: "GET", path: path, user: "admin"}, 500, true, false},
		{request{method: "GET", path: path + "?resourceVersion=0", user: "admin"}, 0, false, false},
		{request{method: "GET", path: secrets, user: "admin"}, 0, false, false},
		{request{method: "DELETE", path: path, user: "admin"}, 500, true, false},
		{request{method: "DELETE", path: unsafe, user: "alice"}, 403, true, false},
		{request{method: "DELETE", path: unsafe + "&dryRun=All", user: "admin"}, 200, true, false},
		{request{method: "DELETE", path: unsafe, user: "admin"}, 200, true, true},
		{request{method: "GET", path: path, user: "admin"}, 404, true, false},
	} {
		if tc.late {
			queueWrites(t, r, c, 40)
		}
		got := do(t, c, r.base, tc.req)
		if tc.status != 0 && got.status != tc.status {
			t.Fatalf("%s %s: %d %s, want %d", tc.req.method, tc.req.path, got.status, got.body, tc.status)
		}
		if tc.status == 500 && !strings.Contains(string(got.body), "data from the storage is not transformable") {
			t.Fatalf("%s %s: %s, want the etcd3 store's corrupt object", tc.req.method, tc.req.path, got.body)
		}
		rec := nextRecord(t, recs)
		for rec.Request.Path != strings.Split(tc.req.path, "?")[0] || rec.Request.Method != tc.req.method {
			rec = nextRecord(t, recs)
		}
		p := rec.Predicted
		switch {
		case tc.exact:
			checkPredicted(t, rec)
			if tc.status == 500 && p.Stage != record.StageStorage {
				t.Errorf("%s %s: the corrupt object's 500 is labelled %q, want storage (the store's own error)", tc.req.method, tc.req.path, p.Stage)
			}
		case p.Stage == record.StageUnknown:
			t.Logf("%s %s (answered %d): unknown: %s", tc.req.method, tc.req.path, got.status, p.Message)
		case p.Status != rec.Actual.Status || (p.Status >= 300 && p.Message != rec.Actual.Message):
			t.Errorf("%s %s: predicted %d %q, answered %d %q", tc.req.method, tc.req.path, p.Status, p.Message, rec.Actual.Status, rec.Actual.Message)
		}
		if tc.late {
			if e := stageNamed(rec, record.StageStorage).Explanation; !strings.Contains(e, "cannot decrypt or decode it") || !strings.Contains(e, "before the request's own write") {
				t.Errorf("the unsafe delete replayed behind queued writes does not read the Secret as it was just before its delete: %s", e)
			}
		}
	}
}
