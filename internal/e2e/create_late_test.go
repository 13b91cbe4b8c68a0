package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
)

// TestCreateReplayedLate: creates sent eight at a time through a kproxy
// with one replay worker, so that most replays run after their create is
// in etcd. Such a replay finds the object the request created and knows
// it was absent just before (a create needs an absent key) without a
// second read; every create is predicted 201, as the apiserver answered.
// Some are large: the apiserver answers them gzip (the client asks), and
// kproxy keeps only the answer's first 256 KiB; the resourceVersion that
// tells the request's own write is read from that all the same (before,
// such a create was predicted 409 AlreadyExists).
func TestCreateReplayedLate(t *testing.T) {
	recs, r, c := oneReplayWorker(t)
	const n = 48
	run := fmt.Sprintf("late-%d", time.Now().UnixNano())
	t.Cleanup(func() {
		for i := range n {
			_ = adminClient().CoreV1().ConfigMaps(testNS).Delete(context.Background(), fmt.Sprintf("%s-%d", run, i), metav1.DeleteOptions{})
		}
	})
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			data := "v"
			switch i % 12 {
			case 5:
				data = strings.Repeat("abcdefgh", 64<<10) // 512 KB, gzip to a few KB
			case 11:
				data = randomText(t, 900_000) // gzip to more than kproxy keeps
			}
			// As kubectl asks: the apiserver compresses answers over 128 KiB.
			got := do(t, c, r.base, request{method: "POST", path: "/api/v1/namespaces/" + testNS + "/configmaps", user: "admin",
				header: http.Header{"Accept-Encoding": {"gzip"}},
				body:   fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"%s-%d"},"data":{"k":%q}}`, run, i, data)})
			if got.status != 201 {
				t.Errorf("create %d: status %d: %.300s", i, got.status, got.body)
			}
			if len(data) > 1 && got.header.Get("Content-Encoding") != "gzip" {
				t.Errorf("create %d of %d bytes: answered without gzip (%q): the path under test was not taken", i, len(data), got.header.Get("Content-Encoding"))
			}
		})
	}
	wg.Wait()
	known := 0
	for range n {
		rec := nextRecord(t, recs)
		st := stageNamed(rec, record.StageStorage)
		if rec.Predicted.Status != 201 {
			t.Errorf("record %s: predicted %+v, the apiserver answered %d; storage: %s", rec.ID, rec.Predicted, rec.Actual.Status, st.Explanation)
		}
		if strings.Contains(st.Explanation, "not found as of resourceVersion") && strings.Contains(st.Explanation, "the request created it") {
			known++
			// etcd's one answer (the object created) says the key was
			// absent before: no second read.
			if !strings.Contains(st.Explanation, "before the request's own create (createRevision") {
				t.Errorf("record %s: etcd's answer not told: %s", rec.ID, st.Explanation)
			}
		}
	}
	if known == 0 {
		t.Errorf("no replay of the %d creates ran after its create was stored: the path under test was not taken", n)
	}
	t.Logf("%d of %d creates replayed after their write, the object known absent before it", known, n)
}

// TestWriteReplayedLate: updates of eight objects, sent at once through a
// kproxy with one replay worker, so that most replays run after later
// writes have changed their object. Such a replay reads the object as the
// request met it (just before the resourceVersion the apiserver answered
// with, or at it when the request was a no-op naming it) and predicts
// what the apiserver answered; a write's replay that ran in time is
// unchanged. Each object sees a merge patch, a no-op update (the object as
// the patch left it, resourceVersion and all, which the apiserver answers
// without writing), two more patches and a delete.
func TestWriteReplayedLate(t *testing.T) {
	recs, r, c := oneReplayWorker(t)
	const objects = 8
	run := fmt.Sprintf("late-write-%d", time.Now().UnixNano())
	for i := range objects {
		if _, err := adminClient().CoreV1().ConfigMaps(testNS).Create(context.Background(), &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", run, i)}, Data: map[string]string{"k": "0"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		noOps int // no-op updates the apiserver answered with the body's resourceVersion
	)
	patch := func(path, v string) exchange {
		return do(t, c, r.base, request{method: "PATCH", path: path, user: "admin", contentType: "application/merge-patch+json",
			body: fmt.Sprintf(`{"data":{"k":%q}}`, v)})
	}
	for i := range objects {
		wg.Go(func() {
			path := fmt.Sprintf("/api/v1/namespaces/%s/configmaps/%s-%d", testNS, run, i)
			got := patch(path, "1")
			if got.status != 200 {
				t.Errorf("patch: %d %s", got.status, got.body)
				return
			}
			put := do(t, c, r.base, request{method: "PUT", path: path, user: "admin", body: string(got.body)})
			if put.status != 200 {
				t.Errorf("no-op update: %d %s", put.status, put.body)
				return
			}
			if resourceVersionIn(t, put.body) == resourceVersionIn(t, got.body) {
				mu.Lock()
				noOps++
				mu.Unlock()
			}
			for _, v := range []string{"2", "3"} {
				if got := patch(path, v); got.status != 200 {
					t.Errorf("patch: %d %s", got.status, got.body)
				}
			}
			if got := do(t, c, r.base, request{method: "DELETE", path: path, user: "admin"}); got.status != 200 {
				t.Errorf("delete: %d %s", got.status, got.body)
			}
		})
	}
	wg.Wait()
	if noOps != objects {
		t.Errorf("the apiserver wrote %d of the %d updates that changed nothing (it keeps the resourceVersion of a no-op)", objects-noOps, objects)
	}
	late, lateNoOp := 0, 0
	for range objects * 5 {
		rec := nextRecord(t, recs)
		st := stageNamed(rec, record.StageStorage)
		if rec.Predicted.Status != rec.Actual.Status || rec.Predicted.Stage == record.StageUnknown {
			t.Errorf("record %s (%s %s): predicted %+v, the apiserver answered %d; storage: %s", rec.ID, rec.Request.Method, rec.Request.Path, rec.Predicted, rec.Actual.Status, st.Explanation)
		}
		if strings.Contains(st.Explanation, "before the replay read it") {
			late++
			// Read at its revision from etcd, by the apiserver's etcd3
			// store, with what etcd holds for the key then.
			if !strings.Contains(st.Explanation, "read from etcd by the apiserver's etcd3 store") || !strings.Contains(st.Explanation, "modRevision") {
				t.Errorf("record %s: a late replay's read, not from etcd: %s", rec.ID, st.Explanation)
			}
			if strings.Contains(st.Explanation, "which the request left unchanged") {
				lateNoOp++
			}
		}
	}
	if late == 0 || lateNoOp == 0 {
		t.Errorf("%d replays ran after a later write, %d of them of a no-op: the paths under test were not both taken", late, lateNoOp)
	}
	t.Logf("%d of %d writes replayed after a later write to their object (%d no-op updates among them)", late, objects*4, lateNoOp)
}

// resourceVersionIn is the resourceVersion of the object body.
func resourceVersionIn(t *testing.T, body []byte) string {
	t.Helper()
	var o metav1.PartialObjectMetadata
	if err := json.Unmarshal(body, &o); err != nil {
		t.Fatalf("not an object: %v: %s", err, body)
	}
	return o.ResourceVersion
}

// TestRefusedWriteReplayedLate: a create the apiserver refused because the
// object existed (409), the object then deleted, eight at once through a
// kproxy with one replay worker. A refusal names no revision, so its
// replay reads the latest; one that finds the object gone was late, and
// says unknown (it would have predicted 201). No record is confidently
// wrong. Each delete (answered with a Status, no resourceVersion) is
// replayed on the object as etcd's history of the key says it was just
// before it.
func TestRefusedWriteReplayedLate(t *testing.T) {
	recs, r, c := oneReplayWorker(t)
	const objects = 8
	run := fmt.Sprintf("late-refused-%d", time.Now().UnixNano())
	body := func(i int) string {
		return fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"%s-%d"},"data":{"k":"v"}}`, run, i)
	}
	for i := range objects {
		if got := do(t, c, r.base, request{method: "POST", path: "/api/v1/namespaces/" + testNS + "/configmaps", user: "admin", body: body(i)}); got.status != 201 {
			t.Fatalf("create: %d %s", got.status, got.body)
		}
	}
	for range objects {
		nextRecord(t, recs)
	}
	var wg sync.WaitGroup
	for i := range objects {
		wg.Go(func() {
			if got := do(t, c, r.base, request{method: "POST", path: "/api/v1/namespaces/" + testNS + "/configmaps", user: "admin", body: body(i)}); got.status != 409 {
				t.Errorf("create again: %d %s", got.status, got.body)
			}
			if got := do(t, c, r.base, request{method: "DELETE", path: fmt.Sprintf("/api/v1/namespaces/%s/configmaps/%s-%d", testNS, run, i), user: "admin"}); got.status != 200 {
				t.Errorf("delete: %d %s", got.status, got.body)
			}
		})
	}
	wg.Wait()
	late := 0
	for range objects * 2 {
		rec := nextRecord(t, recs)
		switch {
		case rec.Predicted.Stage == record.StageUnknown && strings.Contains(rec.Predicted.Message, "deleted between the apiserver's read and the replay's"):
			late++
			if rec.Actual.Status != 409 {
				t.Errorf("record %s: %s answered %d said %q", rec.ID, rec.Request.Method, rec.Actual.Status, rec.Predicted.Message)
			}
		case rec.Predicted.Stage == record.StageUnknown:
			t.Errorf("record %s (%s, answered %d): unknown: %s", rec.ID, rec.Request.Method, rec.Actual.Status, rec.Predicted.Message)
		case rec.Predicted.Status != rec.Actual.Status:
			t.Errorf("record %s (%s): predicted %d, the apiserver answered %d: %s", rec.ID, rec.Request.Method, rec.Predicted.Status, rec.Actual.Status, stageNamed(rec, record.StageStorage).Explanation)
		case rec.Request.Method == "DELETE":
			// A configmap's delete is answered with a Status that names no
			// resourceVersion: the replay finds the delete in etcd's
			// history of the key and reads the object just before it.
			if st := stageNamed(rec, record.StageStorage).Explanation; !strings.Contains(st, "as of resourceVersion") || !strings.Contains(st, "read from etcd") {
				t.Errorf("record %s (DELETE): storage %s", rec.ID, st)
			}
		}
	}
	t.Logf("%d of %d refused creates replayed after their object was deleted (said unknown)", late, objects)
}

// oneReplayWorker starts a kproxy whose replays wait behind each other
// (one worker, a long queue, no read shed): requests sent at once are
// mostly replayed after later requests were answered. It returns its
// records, its route and a client.
func oneReplayWorker(t *testing.T) (<-chan *record.Record, route, *http.Client) {
	t.Helper()
	stream := record.NewStream()
	recs, _, cancel := stream.Subscribe(256)
	t.Cleanup(cancel)
	k := startKproxy(t, kproxyOptions{stream: stream, set: func(o *serve.Options) {
		o.ReplayWorkers, o.ReplayQueue = 1, 128
		o.APIServer.ReplayAPIServerQPS = 1e6
	}})
	r := reverseRoute(k)
	return recs, r, r.client(nil)
}

// TestGetReplayedLate: gets of objects deleted (or created) right after
// them, replayed behind a queue: a replay that finds the object there
// after a 404 says it ran late, never the other answer. Before, it
// predicted 404 for a 200 (the garbage collector's gets in
// TestControllerSession). A get answered 200 is replayed from its
// answer, the object or its metadata alone (as the garbage collector
// asks for it, in JSON or protobuf), so the delete after it changes
// nothing: before, a metadata get replayed after the delete said unknown.
func TestGetReplayedLate(t *testing.T) {
	recs, r, c := oneReplayWorker(t)
	const objects = 12
	run := fmt.Sprintf("late-get-%d", time.Now().UnixNano())
	path := func(i int) string { return fmt.Sprintf("/api/v1/namespaces/%s/configmaps/%s-%d", testNS, run, i) }
	create := func(i int) {
		body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"%s-%d"}}`, run, i)
		if got := do(t, c, r.base, request{method: "POST", path: "/api/v1/namespaces/" + testNS + "/configmaps", user: "admin", body: body}); got.status != 201 {
			t.Errorf("create: %d %s", got.status, got.body)
		}
	}
	for i := range objects / 2 {
		create(i)
	}
	for range objects / 2 {
		nextRecord(t, recs)
	}
	var wg sync.WaitGroup
	for i := range objects {
		wg.Go(func() {
			// Of the objects there, one get in three asks for the whole
			// object, the others for its metadata, in JSON or protobuf.
			accept := [...]string{"", "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
				"application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"}[i%3]
			got := do(t, c, r.base, request{method: "GET", path: path(i), user: "admin", accept: accept})
			switch {
			case i < objects/2 && got.status == 200:
				if got := do(t, c, r.base, request{method: "DELETE", path: path(i), user: "admin"}); got.status != 200 {
					t.Errorf("delete: %d %s", got.status, got.body)
				}
			case i >= objects/2 && got.status == 404:
				create(i)
			default:
				t.Errorf("get %s: %d", path(i), got.status)
			}
		})
	}
	wg.Wait()
	late := 0
	for range objects * 2 {
		rec := nextRecord(t, recs)
		switch {
		case rec.Predicted.Stage == record.StageUnknown && strings.Contains(rec.Predicted.Message, "after this request, before the replay read it"):
			late++
			if rec.Request.Method != "GET" || rec.Actual.Status != 404 {
				t.Errorf("record %s (%s %s): %s", rec.ID, rec.Request.Method, rec.Request.Path, rec.Predicted.Message)
			}
		case rec.Predicted.Stage == record.StageUnknown:
			t.Errorf("record %s (%s %s, answered %d): unknown: %s", rec.ID, rec.Request.Method, rec.Request.Path, rec.Actual.Status, rec.Predicted.Message)
		case rec.Predicted.Status != rec.Actual.Status:
			t.Errorf("record %s (%s %s): predicted %d, the apiserver answered %d", rec.ID, rec.Request.Method, rec.Request.Path, rec.Predicted.Status, rec.Actual.Status)
		}
	}
	t.Logf("%d of %d gets replayed after the object was created (said unknown)", late, objects/2)
}

// randomText is n bytes of base64 text from random bytes: it compresses
// little.
func randomText(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n*3/4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b)
}

// TestDryRunReplayedLate: a dry-run JSON patch whose test op holds when
// it is sent (200), followed at once by a real write that changes the
// field it tests or deletes the object, replayed behind a queue: a dry
// run writes nothing and
// answers with the resourceVersion it met, and the replay reads the
// object at it. Before, it read the newest, where the test op fails (or
// the object is gone), and predicted 422 (or 404) for the 200 (found by a
// probe: 2 of 10 tries under load).
func TestDryRunReplayedLate(t *testing.T) {
	recs, r, c := oneReplayWorker(t)
	const objects = 8
	run := fmt.Sprintf("late-dry-%d", time.Now().UnixNano())
	for i := range objects {
		if _, err := adminClient().CoreV1().ConfigMaps(testNS).Create(context.Background(), &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", run, i)}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for i := range objects {
		wg.Go(func() {
			path := fmt.Sprintf("/api/v1/namespaces/%s/configmaps/%s-%d", testNS, run, i)
			if got := do(t, c, r.base, request{method: "PATCH", path: path + "?dryRun=All", user: "admin", contentType: "application/json-patch+json",
				body: `[{"op":"test","path":"/data/k","value":"v"},{"op":"replace","path":"/data/k","value":"dry"}]`}); got.status != 200 {
				t.Errorf("dry-run patch: %d %s", got.status, got.body)
			}
			then := request{method: "PATCH", path: path, user: "admin", contentType: "application/merge-patch+json", body: `{"data":{"k":"w"}}`}
			if i%2 == 1 {
				then = request{method: "DELETE", path: path, user: "admin"}
			}
			if got := do(t, c, r.base, then); got.status != 200 {
				t.Errorf("%s: %d %s", then.method, got.status, got.body)
			}
		})
	}
	wg.Wait()
	late := predictedAll(t, recs, objects*2, "", func(rec *record.Record, storage string) bool {
		return strings.Contains(rec.Request.Query, "dryRun") && (strings.Contains(storage, "before the replay read it") || strings.Contains(storage, "deleted (by"))
	})
	if late == 0 {
		t.Errorf("no dry run was replayed after the write that followed it: the path under test was not taken")
	}
	t.Logf("%d of %d dry runs replayed after the write that followed them", late, objects)
}

// predictedAll reads the next n records, each of which must be predicted
// as the apiserver answered (or be unknown saying honest, when given),
// and counts those late says were replayed after the write that followed
// them (given the storage stage's words).
func predictedAll(t *testing.T, recs <-chan *record.Record, n int, honest string, late func(rec *record.Record, storage string) bool) int {
	t.Helper()
	count := 0
	for range n {
		rec := nextRecord(t, recs)
		st := stageNamed(rec, record.StageStorage)
		if honest != "" && rec.Predicted.Stage == record.StageUnknown && strings.Contains(rec.Predicted.Message, honest) {
			continue
		}
		if rec.Predicted.Status != rec.Actual.Status || rec.Predicted.Stage == record.StageUnknown {
			t.Errorf("record %s (%s %s?%s): predicted %+v, the apiserver answered %d; storage: %s", rec.ID, rec.Request.Method, rec.Request.Path, rec.Request.Query, rec.Predicted, rec.Actual.Status, st.Explanation)
		}
		if late != nil && late(rec, st.Explanation) {
			count++
		}
	}
	return count
}

// TestDryRunCreateReplayedLate: a dry run answered 201 (a server-side
// apply that would create its object, or a create) followed at once by a
// real write creating the object, each through one replay worker so that
// most dry runs are replayed after it. A dry run's answer names no
// revision: the replay read the newest, found the object, and predicted
// 409 (a conflict with the other manager's field, or AlreadyExists) for
// the 201 (probe AN: 87 records). It reads the object as absent, as the
// apiserver found it.
func TestDryRunCreateReplayedLate(t *testing.T) {
	recs, r, c := oneReplayWorker(t)
	const objects = 12
	run := fmt.Sprintf("late-dry-create-%d", time.Now().UnixNano())
	cms := "/api/v1/namespaces/" + testNS + "/configmaps"
	apply := func(name, manager, query string) request {
		return request{method: "PATCH", path: cms + "/" + name + "?fieldManager=" + manager + query, user: "admin", contentType: "application/apply-patch+yaml",
			body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"` + name + `"},"data":{"k":"` + manager + `"}}`}
	}
	create := func(name, query string) request {
		return request{method: "POST", path: cms + query, user: "admin", body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"` + name + `"}}`}
	}
	var wg sync.WaitGroup
	for i := range objects {
		wg.Go(func() {
			name := fmt.Sprintf("%s-%d", run, i)
			dry, then := apply(name, "racer", "&dryRun=All"), apply(name, "owner", "")
			if i%2 == 1 {
				dry, then = create(name, "?dryRun=All"), create(name, "")
			}
			for _, q := range []request{dry, then} {
				if got := do(t, c, r.base, q); got.status != 201 {
					t.Errorf("%s %s: %d %s", q.method, q.path, got.status, got.body)
				}
			}
		})
	}
	wg.Wait()
	late := predictedAll(t, recs, objects*2, "", func(_ *record.Record, storage string) bool {
		return strings.Contains(storage, "another write created it")
	})
	if late == 0 {
		t.Errorf("no dry run was replayed after the create that followed it: the path under test was not taken")
	}
	t.Logf("%d of %d dry runs replayed after the create that followed them", late, objects)
}

// TestDryRunDeleteReplayedLate: a dry-run delete (answered 200 with a
// Status, which names no revision) followed at once by the real delete,
// through one replay worker: the replay, reading after the real delete,
// found nothing and predicted 404 (probe AN). It reads the object as it
// last existed.
func TestDryRunDeleteReplayedLate(t *testing.T) {
	recs, r, c := oneReplayWorker(t)
	const objects = 6
	run := fmt.Sprintf("late-dry-delete-%d", time.Now().UnixNano())
	for i := range objects {
		if _, err := adminClient().CoreV1().ConfigMaps(testNS).Create(context.Background(), &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", run, i)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for i := range objects {
		wg.Go(func() {
			path := fmt.Sprintf("/api/v1/namespaces/%s/configmaps/%s-%d", testNS, run, i)
			for _, q := range []request{{method: "DELETE", path: path + "?dryRun=All", user: "admin"}, {method: "DELETE", path: path, user: "admin"}} {
				if got := do(t, c, r.base, q); got.status != 200 {
					t.Errorf("%s %s: %d %s", q.method, q.path, got.status, got.body)
				}
			}
		})
	}
	wg.Wait()
	predictedAll(t, recs, objects*2, "", nil)
}

// TestDeleteReplayedAfterRecreate: deletes with a uid precondition, each
// followed at once by a create of the same name, through one replay
// worker. The apiserver answers such a delete with a Status naming the
// deleted uid; the replay, reading after the create, found the new
// object and predicted 409 (its uid fails the precondition) for the 200
// (probe AN, 13 of 240 tries). The apiserver's Status names the uid it
// deleted: the replay reads that object just before the delete ahead of
// the name's re-creation, from etcd's history.
func TestDeleteReplayedAfterRecreate(t *testing.T) {
	recs, r, c := oneReplayWorker(t)
	const objects = 6
	run := fmt.Sprintf("recreated-%d", time.Now().UnixNano())
	cms := "/api/v1/namespaces/" + testNS + "/configmaps"
	uids := make([]string, objects)
	for i := range objects {
		cm, err := adminClient().CoreV1().ConfigMaps(testNS).Create(context.Background(), &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", run, i)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		uids[i] = string(cm.UID)
	}
	var wg sync.WaitGroup
	for i := range objects {
		wg.Go(func() {
			name := fmt.Sprintf("%s-%d", run, i)
			for _, q := range []request{
				{method: "DELETE", path: cms + "/" + name, user: "admin", body: `{"preconditions":{"uid":"` + uids[i] + `"}}`},
				{method: "POST", path: cms, user: "admin", body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"` + name + `"}}`},
			} {
				if got := do(t, c, r.base, q); got.status/100 != 2 {
					t.Errorf("%s %s: %d %s", q.method, q.path, got.status, got.body)
				}
			}
		})
	}
	wg.Wait()
	// A replay that read between the delete and the create found nothing,
	// and by the time it reads etcd's history the key exists again: an
	// honest unknown, naming it (1 of 6 in a run).
	recreated := predictedAll(t, recs, objects*2, "created after the request's delete", func(_ *record.Record, storage string) bool {
		return strings.Contains(storage, "the name was created again")
	})
	if recreated == 0 {
		t.Errorf("no delete was replayed after the create that followed it: the path under test was not taken")
	}
	t.Logf("%d of %d deletes replayed after the create that followed them", recreated, objects)
}
