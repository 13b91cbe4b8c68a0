package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/record"
)

// TestStageTimes: in a record, a stage that did not run takes no time. A
// GET's three admission stages (not applicable) are points where decode
// ended, before storage's read; a create refused by validation has
// validating admission and storage not reached. Before, every handler
// stage without times of its own was given the whole handler's time: a
// GET's mutating admission "took" its storage read.
func TestStageTimes(t *testing.T) {
	recs, r, c := oneReplayWorker(t)
	name := fmt.Sprintf("stage-times-%d", time.Now().UnixNano())
	cms := "/api/v1/namespaces/" + testNS + "/configmaps"
	for _, tc := range []struct {
		req    request
		status int
		skip   []string // stages that did not run
	}{
		{request{method: "POST", path: cms, user: "admin", body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"` + name + `"}}`}, 201, nil},
		{request{method: "GET", path: cms + "/" + name, user: "admin"}, 200,
			[]string{record.StageMutatingAdmission, record.StageValidation, record.StageValidatingAdmission}},
		{request{method: "POST", path: cms, user: "admin", body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"Not_A_Name"}}`}, 422,
			[]string{record.StageValidatingAdmission, record.StageStorage}},
	} {
		t.Run(tc.req.method+" "+fmt.Sprint(tc.status), func(t *testing.T) {
			if got := do(t, c, r.base, tc.req); got.status != tc.status {
				t.Fatalf("%s %s: %d %s", tc.req.method, tc.req.path, got.status, got.body)
			}
			rec := nextRecord(t, recs)
			if rec.Predicted.Status != tc.status {
				t.Fatalf("predicted %+v, the apiserver answered %d", rec.Predicted, tc.status)
			}
			skipped := map[string]bool{}
			for _, s := range tc.skip {
				skipped[s] = true
			}
			var decodeEnd, storageAt int64 = -1, -1
			for _, s := range rec.Stages {
				if s.OffsetNs < 0 || s.DurationNs < 0 || s.OffsetNs+s.DurationNs > rec.Latency.ReplayNs {
					t.Errorf("%s: offset %d, duration %d, outside the replay's %d ns", s.Name, s.OffsetNs, s.DurationNs, rec.Latency.ReplayNs)
				}
				switch {
				case skipped[s.Name] && (s.Outcome != record.Skip || s.DurationNs != 0):
					t.Errorf("%s: %s for %d ns (%s), want skip taking no time", s.Name, s.Outcome, s.DurationNs, s.Explanation)
				case !skipped[s.Name] && s.Outcome == record.Skip:
					t.Errorf("%s skipped: %s", s.Name, s.Explanation)
				}
				switch s.Name {
				case record.StageDecode:
					decodeEnd = s.OffsetNs + s.DurationNs
				case record.StageStorage:
					storageAt = s.OffsetNs
				}
			}
			if tc.req.method != "GET" {
				return
			}
			for _, s := range rec.Stages {
				if skipped[s.Name] && (s.OffsetNs < decodeEnd || s.OffsetNs > storageAt) {
					t.Errorf("%s at %d ns: not between decode's end (%d) and storage's start (%d)", s.Name, s.OffsetNs, decodeEnd, storageAt)
				}
			}
		})
	}
}
