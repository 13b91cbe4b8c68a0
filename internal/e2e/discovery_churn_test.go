package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
)

// TestDiscoveryAcrossCRDChurn: discovery asked for while a group's
// CustomResourceDefinition is created and deleted. The aggregator updates
// its documents a moment after such a change, and kproxy reads them (and
// its informers' CRDs) after the request: a probe churning CRDs had /apis
// answered 304 to a client's If-None-Match predicted 200 (304 records),
// and /apis/GROUP/VERSION answered 200 predicted 404 and the reverse (76).
// Asked for around a change of its group, discovery is unknown, saying
// so; never predicted otherwise than answered.
func TestDiscoveryAcrossCRDChurn(t *testing.T) {
	// One replay worker behind a long queue: replays run after the
	// requests, as under load.
	stream := record.NewStream()
	recs, _, cancel := stream.Subscribe(16384)
	t.Cleanup(cancel)
	k := startKproxy(t, kproxyOptions{stream: stream, set: func(o *serve.Options) { o.ReplayWorkers, o.ReplayQueue = 1, 8192 }})
	r := reverseRoute(k)
	c := r.client(nil)
	group := fmt.Sprintf("churn%d.discovery.kproxy.test", time.Now().UnixNano())
	const aggregated = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
	var (
		mu   sync.Mutex
		etag string
	)
	asked := map[string]map[int]int{} // path -> status -> count
	poll := func(path string, conditional bool, stop <-chan struct{}, wg *sync.WaitGroup) {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			q := request{method: "GET", path: path, user: "admin"}
			if conditional {
				// As kubectl does: the ETag of the last document it got.
				mu.Lock()
				q.accept, q.header = aggregated, http.Header{"If-None-Match": {etag}}
				mu.Unlock()
			}
			got := do(t, c, r.base, q)
			mu.Lock()
			if conditional && got.status == http.StatusOK {
				etag = got.header.Get("Etag")
			}
			if asked[path] == nil {
				asked[path] = map[int]int{}
			}
			asked[path][got.status]++
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}
	etag = do(t, c, r.base, request{method: "GET", path: "/apis", user: "admin", accept: aggregated}).header.Get("Etag")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(3)
	go poll("/apis", true, stop, &wg)
	go poll("/apis/"+group+"/v1", false, stop, &wg)
	go poll("/apis/"+group, false, stop, &wg)
	time.Sleep(500 * time.Millisecond)
	if got := createWidgetCRD(t, group); got.status != 201 {
		close(stop)
		wg.Wait()
		t.Fatalf("create the CRD: %d %s", got.status, got.body)
	}
	time.Sleep(3 * time.Second)
	direct := directRoute()
	if got := do(t, direct.client(nil), direct.base, request{method: "DELETE", path: "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets." + group, user: "admin"}); got.status != 200 {
		t.Errorf("delete the CRD: %d %s", got.status, got.body)
	}
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("answered: %v", asked)
	for _, p := range []string{"/apis", "/apis/" + group + "/v1"} {
		if len(asked[p]) < 2 {
			t.Errorf("%s was answered %v only: the change under test did not reach it", p, asked[p])
		}
	}
	unknown, predicted := 0, 0
	for {
		select {
		case rec := <-recs:
			if !strings.HasPrefix(rec.Request.Path, "/apis") || strings.HasPrefix(rec.Request.Path, "/apis/apiextensions.k8s.io") {
				continue
			}
			p := rec.Predicted
			switch {
			case p.Stage == record.StageUnknown && strings.Contains(p.Message, "changed at"):
				unknown++
			case p.Stage == record.StageUnknown:
			case p.Status != rec.Actual.Status:
				t.Errorf("GET %s (If-None-Match %t): the apiserver answered %d; predicted %d at %q (%s)", rec.Request.Path, len(rec.Request.Headers["If-None-Match"]) > 0, rec.Actual.Status, p.Status, p.Stage, p.Message)
			default:
				predicted++
			}
		case <-time.After(5 * time.Second):
			t.Logf("%d predicted as answered, %d unknown around the CRD's changes", predicted, unknown)
			if unknown == 0 {
				t.Error("no request was said to be around the CRD's changes: the path under test was not taken")
			}
			return
		}
	}
}
