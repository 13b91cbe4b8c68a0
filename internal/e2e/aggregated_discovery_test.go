package e2e

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kproxy/kproxy/internal/record"
)

// TestLocalAPIServiceDiscovery: an APIService with no Service, for a group
// nothing serves. The aggregator lists the group's versions itself (200),
// and hands the version's discovery to kube-apiserver, whose chain serves
// it nowhere (404 page not found). Before, kproxy said both were not
// modelled (probe 4).
func TestLocalAPIServiceDiscovery(t *testing.T) {
	ctx := context.Background()
	rc := adminClient().CoreV1().RESTClient()
	const name = "v1.local.kproxy.test"
	body := `{"apiVersion":"apiregistration.k8s.io/v1","kind":"APIService","metadata":{"name":"` + name + `"},` +
		`"spec":{"group":"local.kproxy.test","version":"v1","groupPriorityMinimum":1000,"versionPriority":15}}`
	created := time.Now()
	if err := rc.Post().AbsPath("/apis/apiregistration.k8s.io/v1/apiservices").SetHeader("Content-Type", "application/json").Body([]byte(body)).Do(ctx).Error(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = rc.Delete().AbsPath("/apis/apiregistration.k8s.io/v1/apiservices/" + name).Do(context.Background()).Error()
	})
	// The aggregator registers the group's handler once it has seen the
	// APIService.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var code int
		rc.Get().AbsPath("/apis/local.kproxy.test").Do(ctx).StatusCode(&code)
		return code == 200, nil
	}); err != nil {
		t.Fatalf("the aggregator never served /apis/local.kproxy.test: %v", err)
	}
	// Around the APIService's change (10 s) its group's discovery is
	// unknown (TestDiscoveryAcrossCRDChurn); past it, predicted.
	time.Sleep(time.Until(created.Add(11 * time.Second)))
	r, recs := recordedKproxy(t) // its informers list the APIService as they sync
	for _, tc := range []struct {
		path  string
		want  int
		stage string
	}{
		{"/apis/local.kproxy.test", 200, ""},
		{"/apis/local.kproxy.test/v1", 404, record.StageDecode},
	} {
		ex := do(t, r.client(nil), r.base, request{method: "GET", path: tc.path, user: "admin"})
		rec := nextRecord(t, recs)
		if ex.status != tc.want {
			t.Fatalf("%s: the apiserver answered %d, want %d: update the test (%s)", tc.path, ex.status, tc.want, ex.body)
		}
		if p := rec.Predicted; p.Status != tc.want || p.Stage != tc.stage || p.Message != rec.Actual.Message {
			t.Errorf("%s: predicted %+v, the apiserver answered %d %q", tc.path, p, rec.Actual.Status, rec.Actual.Message)
		}
	}
}
