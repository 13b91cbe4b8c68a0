package e2e

import (
	"context"
	"io"
	"net/http"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// TestTimeoutAnswer: a request whose ?timeout= runs out in kube-apiserver
// gets the timeout filter's 504, a Status written without its type and
// sniffed as text/plain. The record reads it as the Status it is (reason
// Timeout and its sentence, not the raw JSON as the message), and the
// prediction stays unknown: the deadline is a matter of the instant.
func TestTimeoutAnswer(t *testing.T) {
	stream := record.NewStream()
	recs, _, cancel := stream.Subscribe(16)
	defer cancel()
	k := startKproxy(t, kproxyOptions{stream: stream})
	c := reverseRoute(k).client(nil)
	// A millisecond is less than the apiserver takes to list 300
	// ConfigMaps of 4 KiB (what the shared cluster happened to hold
	// was not always enough: a clean-clone run on 2026-12-07 answered
	// all 20 tries in time); the tries are for a quick machine. The 504
	// comes only when the deadline passes before the apiserver begins
	// its answer, a matter of scheduling: 1 try in 3 to 1 in 20 here,
	// none of 20 in a clean-clone run on 2026-12-08; hence 200 tries
	// (a few ms each, the first 504 ends the test).
	ns := lateNamespace(t, "timeout-answer")
	populate(t, cluster, ns, 300, 4<<10)
	t.Cleanup(func() {
		// No namespace controller runs here: the namespace's deletion
		// would leave them for later tests' lists.
		_ = adminClient().CoreV1().ConfigMaps(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{})
	})
	answered := map[int]int{} // tries answered before the deadline, by status
	for try := 1; try <= 200; try++ {
		req, err := http.NewRequest("GET", "https://"+k.addr+"/api/v1/namespaces/"+ns+"/configmaps?timeout=1ms", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tokenOf("admin"))
		resp, err := c.Do(req)
		if err != nil {
			// The deadline ran out while the answer was being written:
			// the apiserver hung up, and kproxy aborted the request alike
			// (as a client sent straight to it sees it).
			if rec := nextRecord(t, recs); !rec.Actual.NoAnswer() {
				t.Errorf("try %d: %v, recorded actual %+v, want no answer", try, err, rec.Actual)
			}
			t.Logf("try %d: the apiserver hung up (%v)", try, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		rec := nextRecord(t, recs)
		if resp.StatusCode != http.StatusGatewayTimeout {
			answered[resp.StatusCode]++
			continue
		}
		t.Logf("try %d (%v answered in time before it): the apiserver's answer: %s %s", try, answered, resp.Header.Get("Content-Type"), body)
		a := rec.Actual
		if a.Status != 504 || a.Reason != "Timeout" || a.Message != "Timeout: request did not complete within the allotted timeout" {
			t.Errorf("recorded actual %d %q %q, want 504 Timeout and the Status's message", a.Status, a.Reason, a.Message)
		}
		if rec.Predicted.Stage != record.StageUnknown {
			t.Errorf("predicted %+v for a request the apiserver timed out, want unknown", rec.Predicted)
		}
		return
	}
	t.Fatalf("the apiserver answered every ?timeout=1ms list in time (%v): the test's path was not taken", answered)
}
