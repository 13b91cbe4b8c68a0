package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// TestConcurrentUpdatesConflict: two updates of one object sent at once
// through kproxy, both naming the resourceVersion they read, as two
// controllers (or one's retries) do: the apiserver takes one and refuses
// the other (409, the object has been modified). A write's replay reads
// the object as the request arrives, which can be before the other
// write lands: it then admits the refused one. Before, kproxy predicted
// 200 for such a 409 (the probe's client-go traffic, 43 records); it says
// unknown now, naming the write that landed in flight. No record may
// predict another status than the apiserver's answer.
func TestConcurrentUpdatesConflict(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	ns := lateNamespace(t, "conflict")
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "ctr"}}, createOpts); err != nil {
		t.Fatal(err)
	}
	r, recs := recordedKproxy(t)
	c := r.client(nil)
	const rounds = 20
	conflicts, inFlight := 0, 0
	for round := 0; round < rounds; round++ {
		cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "ctr", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for w := 0; w < 2; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"ctr","resourceVersion":%q},"data":{"writer":"%d-%d"}}`, cm.ResourceVersion, round, w)
				do(t, c, r.base, request{method: "PUT", path: "/api/v1/namespaces/" + ns + "/configmaps/ctr", user: "admin", body: body})
			}()
		}
		wg.Wait()
		for range 2 {
			rec := nextRecord(t, recs)
			if rec.Actual.Status == 409 {
				conflicts++
			}
			switch {
			case rec.Predicted.Stage == record.StageUnknown:
				inFlight++
				// The store refused it: storage says why, not decode.
				if strings.Contains(rec.Predicted.Message, "in flight") && !strings.HasPrefix(rec.Predicted.Message, "cannot predict: storage: ") {
					t.Errorf("round %d: unknown %q, want it said by storage (cannot predict: storage: ...)", round, rec.Predicted.Message)
				}
			case rec.Predicted.Status != rec.Actual.Status:
				t.Errorf("round %d: predicted %+v, the apiserver answered %d %s", round, rec.Predicted, rec.Actual.Status, rec.Actual.Message)
			}
		}
	}
	if conflicts == 0 {
		t.Errorf("no update of the %d rounds was refused as a conflict: the path under test was not taken", rounds)
	}
	t.Logf("%d rounds of two updates: %d refused as conflicts, %d said unknown (a write landed in flight)", rounds, conflicts, inFlight)
}

// TestConcurrentDeletes: two deletes of one object sent at once: the
// apiserver deletes it for one and answers the other 404. The loser's
// replay may still find the object; its unknown is storage's (the read
// that cannot say what the request met), not decode's, with every stage
// after it "see decode" (probe AF: a delete reads before admission, in
// what the replay still counted as decode's phase). No record may predict
// another status than the answer.
func TestConcurrentDeletes(t *testing.T) {
	ctx := context.Background()
	cs := adminClient()
	ns := lateNamespace(t, "deletes")
	r, recs := recordedKproxy(t)
	c := r.client(nil)
	const rounds = 20
	notFound, unknown := 0, 0
	for round := 0; round < rounds; round++ {
		name := fmt.Sprintf("gone-%d", round)
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, createOpts); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				do(t, c, r.base, request{method: "DELETE", path: "/api/v1/namespaces/" + ns + "/configmaps/" + name, user: "admin"})
			})
		}
		wg.Wait()
		for range 2 {
			rec := nextRecord(t, recs)
			if rec.Actual.Status == 404 {
				notFound++
			}
			switch {
			case rec.Predicted.Stage == record.StageUnknown:
				unknown++
				if !strings.HasPrefix(rec.Predicted.Message, "cannot predict: storage: ") {
					t.Errorf("round %d: answered %d, unknown %q, want it said by storage (cannot predict: storage: ...)", round, rec.Actual.Status, rec.Predicted.Message)
				}
				// Admission was not reached because of the unknown read,
				// not because storage refused (probe AG).
				for _, st := range rec.Stages {
					if strings.Contains(st.Explanation, "refuses first") {
						t.Errorf("round %d: %s says %q, want \"not replayed (see storage)\"", round, st.Name, st.Explanation)
					}
				}
			case rec.Predicted.Status != rec.Actual.Status:
				t.Errorf("round %d: predicted %+v, the apiserver answered %d %s", round, rec.Predicted, rec.Actual.Status, rec.Actual.Message)
			}
		}
	}
	if notFound == 0 {
		t.Errorf("no delete of the %d rounds was answered 404: the path under test was not taken", rounds)
	}
	t.Logf("%d rounds of two deletes: %d answered 404, %d said unknown", rounds, notFound, unknown)
}
