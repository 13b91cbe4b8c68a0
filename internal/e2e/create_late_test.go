package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
)

// TestCreateReplayedLate: creates sent eight at a time through a kproxy
// with one replay worker, so that most replays run after their create is
// in etcd. Such a replay finds the object the request created and knows
// it was absent just before (a create needs an absent key) without a
// second read; every create is predicted 201, as the apiserver answered.
func TestCreateReplayedLate(t *testing.T) {
	stream := record.NewStream()
	recs, _, cancel := stream.Subscribe(256)
	defer cancel()
	k := startKproxy(t, kproxyOptions{stream: stream, set: func(o *serve.Options) {
		o.ReplayWorkers, o.ReplayQueue = 1, 128
		o.APIServer.ReplayAPIServerQPS = 1e6
	}})
	r := reverseRoute(k)
	c := r.client(nil)
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
			got := do(t, c, r.base, request{method: "POST", path: "/api/v1/namespaces/" + testNS + "/configmaps", user: "admin",
				body: fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"%s-%d"},"data":{"k":"v"}}`, run, i)})
			if got.status != 201 {
				t.Errorf("create %d: status %d: %s", i, got.status, got.body)
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
		}
	}
	if known == 0 {
		t.Errorf("no replay of the %d creates ran after its create was stored: the path under test was not taken", n)
	}
	t.Logf("%d of %d creates replayed after their write, the object known absent before it", known, n)
}
