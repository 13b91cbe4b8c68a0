package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// TestStorageConformance runs every case of testdata/conformance/storage
// through kproxy in front of the real apiserver and etcd, and asserts that
// the prediction is the apiserver's answer: reads with their
// resourceVersion semantics and continue tokens, preconditions,
// create-on-update, dry run, and etcd's size limits. kproxy gets the
// apiserver's etcd flags, so it reads etcd with the apiserver's etcd3
// store.
func TestStorageConformance(t *testing.T) {
	dir := "../../testdata/conformance/storage"
	applyManifest(t, "apply", "--server-side", "-f", filepath.Join(dir, "fixtures", "crds.yaml"))
	applyManifest(t, "wait", "--for=condition=Established", "--timeout=60s", "crd/gadgets.storage.kproxy.test")
	applyManifest(t, "apply", "--server-side", "-f", filepath.Join(dir, "fixtures", "objects.yaml"))
	// No namespace controller runs here: a deleted namespace stays
	// Terminating.
	applyManifest(t, "create", "namespace", "sto-terminating")
	applyManifest(t, "delete", "namespace", "sto-terminating", "--wait=false")
	// A finalizer keeps this one being deleted.
	applyManifest(t, "delete", "configmap", "-n", "sto", "held", "--wait=false")
	compactEtcd(t)
	if total := runCorpus(t, dir, "sto", checkWritePrediction); total < 40 {
		t.Errorf("the storage corpus has %d cases; it should cover at least 40", total)
	}
}

// compactEtcd compacts etcd's history up to now, as the apiserver does
// every 5 minutes, so that early resourceVersions are gone.
func compactEtcd(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	etcd := etcdClient(t)
	resp, err := etcd.Get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := etcd.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatalf("compact etcd at %d: %v", resp.Header.Revision, err)
	}
}

// TestStorageApiserverView runs a few storage cases through a kproxy that
// cannot read etcd: reads and writes are predicted from the apiserver's
// view, and what needs etcd's revisions is said unknown.
func TestStorageApiserverView(t *testing.T) {
	dir := "../../testdata/conformance/storage"
	applyManifest(t, "apply", "--server-side", "-f", filepath.Join(dir, "fixtures", "crds.yaml"))
	applyManifest(t, "wait", "--for=condition=Established", "--timeout=60s", "crd/gadgets.storage.kproxy.test")
	applyManifest(t, "apply", "--server-side", "-f", filepath.Join(dir, "fixtures", "objects.yaml"))
	t.Run("no etcd flags", func(t *testing.T) {
		runCorpusWith(t, "../../testdata/conformance/storage-apiserver-view", "sto-view", kproxyOptions{noEtcd: true}, checkWritePrediction)
	})
	// The manifest's etcd is out of kproxy's reach (loopback on another
	// node, say): kproxy finds out at start and says so, never stalls.
	t.Run("etcd out of reach", func(t *testing.T) {
		runCorpusWith(t, "../../testdata/conformance/storage-apiserver-view", "sto-unreach", kproxyOptions{etcdServers: "http://127.0.0.1:1"},
			func(t *testing.T, c corpusCase, rec *record.Record) {
				checkWritePrediction(t, c, rec)
				for _, s := range rec.Stages {
					answered := strings.Contains(s.Explanation, "the object in the apiserver's answer") // no read
					if s.Name == "storage" && s.Outcome != record.Skip && !answered && !strings.Contains(s.Explanation, "is not reachable from kproxy") {
						t.Errorf("storage does not say why it did not read etcd: %s", s.Explanation)
					}
				}
			})
	})
}

// TestStorageWithoutEncryptionConfig hands kproxy an encryption
// configuration it cannot load: writes are still predicted, the storage
// stage says sizes leave encryption out, and a read of a value encrypted
// at rest, which kproxy cannot decrypt, is unknown rather than an error,
// unless the apiserver's answer holds the object.
func TestStorageWithoutEncryptionConfig(t *testing.T) {
	dir := "../../testdata/conformance/storage"
	applyManifest(t, "apply", "--server-side", "-f", filepath.Join(dir, "fixtures", "crds.yaml"))
	applyManifest(t, "apply", "--server-side", "-f", filepath.Join(dir, "fixtures", "objects.yaml"))
	stream := record.NewStream()
	recs, _, cancel := stream.Subscribe(16)
	defer cancel()
	k := startKproxy(t, kproxyOptions{stream: stream, extraArgs: []string{"--encryption-provider-config=" + filepath.Join(t.TempDir(), "missing.yaml")}})
	r := reverseRoute(k)
	do(t, r.client(nil), r.base, request{method: "POST", path: "/api/v1/namespaces/sto/configmaps?dryRun=All", user: "admin",
		body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"new"}}`, header: http.Header{"Audit-Id": {"noenc-write"}}})
	rec := waitRecord(t, recs, "noenc-write")
	if p := rec.Predicted; p.Status != 201 || p.Stage != "" {
		t.Errorf("write predicted %+v, want 201", p)
	}
	if s := stageNamed(rec, record.StageStorage); !strings.Contains(s.Explanation, "encryption at rest not applied: --encryption-provider-config") {
		t.Errorf("storage does not say the encryption configuration is missing: %s", s.Explanation)
	}
	// kubectl get asks for a Table: the replay reads the Secret from etcd,
	// which it cannot decrypt.
	table := http.Header{"Accept": {"application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}, "Audit-Id": {"noenc-read"}}
	ex := do(t, r.client(nil), r.base, request{method: "GET", path: "/api/v1/namespaces/sto/secrets/db", user: "admin", header: table})
	if ex.status != 200 {
		t.Fatalf("GET secret: %d", ex.status)
	}
	if p := waitRecord(t, recs, "noenc-read").Predicted; p.Stage != record.StageUnknown || !strings.Contains(p.Message, "storage") {
		t.Errorf("read of an encrypted Secret without its keys predicted %+v, want unknown", p)
	}
	// A plain get's answer holds the Secret the apiserver decrypted: the
	// replay takes it from there and needs no key.
	ex = do(t, r.client(nil), r.base, request{method: "GET", path: "/api/v1/namespaces/sto/secrets/db", user: "admin", header: http.Header{"Audit-Id": {"noenc-answered"}}})
	if ex.status != 200 {
		t.Fatalf("GET secret: %d", ex.status)
	}
	rec = waitRecord(t, recs, "noenc-answered")
	if p := rec.Predicted; p.Status != 200 || p.Stage != "" {
		t.Errorf("get of a Secret answered 200 predicted %+v, want 200 from the answer", p)
	}
	if s := stageNamed(rec, record.StageStorage); !strings.Contains(s.Explanation, "the object in the apiserver's answer") {
		t.Errorf("storage does not say it took the Secret from the answer: %s", s.Explanation)
	}
}

// TestStorageShedsEtcdReads runs kproxy with --replay-etcd-qps=1: the
// replay must not become the incident, so past the rate its etcd reads
// are shed and those predictions say unknown, why; the others stay exact.
func TestStorageShedsEtcdReads(t *testing.T) {
	stream := record.NewStream()
	recs, _, cancel := stream.Subscribe(64)
	defer cancel()
	k := startKproxy(t, kproxyOptions{stream: stream, extraArgs: []string{"--replay-etcd-qps=1"}})
	r := reverseRoute(k)
	shed := 0
	for i := range 20 {
		id := fmt.Sprintf("shed-%02d", i)
		ex := do(t, r.client(nil), r.base, request{method: "GET", path: "/api/v1/namespaces/" + testNS + "/configmaps/missing", user: "admin", header: http.Header{"Audit-Id": {id}}})
		if ex.status != 404 {
			t.Fatalf("GET: %d", ex.status)
		}
		rec := waitRecord(t, recs, id)
		p, a := rec.Predicted, rec.Actual
		switch {
		case p.Stage == record.StageUnknown:
			shed++
			if !strings.Contains(p.Message, "--replay-etcd-qps=1") {
				t.Errorf("%s: unknown, but not because of shedding: %s", id, p.Message)
			}
		case p.Status != a.Status || !record.SameMessage(p.Message, a.Message):
			t.Errorf("%s: predicted %+v, actual %+v", id, p, a)
		}
	}
	if shed == 0 || shed == 20 {
		t.Errorf("%d of 20 reads shed at 1 read/s (burst 2): want some, not all", shed)
	}
}

// etcdClient is a client of the shared cluster's etcd, closed with the test.
func etcdClient(t *testing.T) *clientv3.Client {
	t.Helper()
	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{cluster.EtcdURL}, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Close() })
	return etcd
}

// compactAsApiserver compacts etcd at its current revision as the
// apiserver's compactor does (its etcd3.Compact): the revision written
// to compact_rev_key, then the compaction.
func compactAsApiserver(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	etcd := etcdClient(t)
	resp, err := etcd.Get(ctx, "compact_rev_key")
	if err != nil {
		t.Fatal(err)
	}
	var version int64
	if len(resp.Kvs) > 0 {
		version = resp.Kvs[0].Version
	}
	rev := resp.Header.Revision
	if _, err := etcd.Txn(ctx).If(clientv3.Compare(clientv3.Version("compact_rev_key"), "=", version)).
		Then(clientv3.OpPut("compact_rev_key", strconv.FormatInt(rev, 10))).Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := etcd.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
}

// TestListAtCompactedRevision: a list at a revision etcd has compacted is
// answered from the apiserver's watch cache while it holds a snapshot of
// it, and 410 Expired once its compactor has read the compaction's
// revision (every 15 s) from compact_rev_key, which the apiserver writes
// before each compaction. Compacted here as the apiserver does it: at
// once, kproxy cannot know which (unknown, or the right answer); 22 s
// later it predicts 410, from the compaction it saw written. Before, it
// said unknown for good (found by a probe: 410 from 15 s on).
func TestListAtCompactedRevision(t *testing.T) {
	ctx := context.Background()
	r, recs := recordedKproxy(t)
	c := r.client(nil)
	ns := lateNamespace(t, "compacted")
	cm, err := adminClient().CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "old"}}, createOpts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := adminClient().CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "newer"}}, createOpts); err != nil {
		t.Fatal(err)
	}
	compactAsApiserver(t)
	list := request{method: "GET", user: "admin", path: "/api/v1/namespaces/" + ns + "/configmaps?resourceVersion=" + cm.ResourceVersion + "&resourceVersionMatch=Exact"}
	got := do(t, c, r.base, list)
	if rec := nextRecord(t, recs); rec.Predicted.Stage != record.StageUnknown && rec.Predicted.Status != got.status {
		t.Errorf("just after the compaction: predicted %d at %s (%s), the apiserver answered %d", rec.Predicted.Status, rec.Predicted.Stage, rec.Predicted.Message, got.status)
	}
	time.Sleep(22 * time.Second) // the watch cache's compactor reads compact_rev_key every 15 s
	got = do(t, c, r.base, list)
	rec := nextRecord(t, recs)
	if got.status != http.StatusGone {
		t.Fatalf("22 s after the compaction: the apiserver answered %d, want 410: %s", got.status, got.body)
	}
	if st := stageNamed(rec, record.StageStorage).Explanation; rec.Predicted.Status != http.StatusGone || !strings.Contains(st, "compact_rev_key") {
		t.Errorf("22 s after the compaction: predicted %d at %s (%s), want 410 from the compaction kproxy saw; storage: %s", rec.Predicted.Status, rec.Predicted.Stage, rec.Predicted.Message, st)
	}
	// A patch that changes nothing keeps the object's resourceVersion,
	// which the replay took for the request's own write and read the
	// object just before it: compacted away, 'too old', unknown (found by
	// a probe). The compaction kproxy saw before the request is past the
	// object's revision: written before the request, met as it is.
	for _, patch := range []string{`{}`, `{"metadata":{"name":"old"}}`} {
		got := do(t, c, r.base, request{method: "PATCH", path: "/api/v1/namespaces/" + ns + "/configmaps/old", user: "admin", contentType: "application/merge-patch+json", body: patch})
		rec := nextRecord(t, recs)
		if got.status != http.StatusOK {
			t.Fatalf("a patch changing nothing: %d %s", got.status, got.body)
		}
		if p := rec.Predicted; p.Stage == record.StageUnknown || p.Status != http.StatusOK {
			t.Errorf("a patch %s changing an object older than the compaction: predicted %d at %s (%s), want 200", patch, p.Status, p.Stage, p.Message)
		}
	}
}
