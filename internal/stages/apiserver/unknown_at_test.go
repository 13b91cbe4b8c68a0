package apiserver

import (
	"errors"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/record"
)

// TestUnknownAt: a run's unknown is reported by the stage whose layer it
// is about, so a record's "cannot predict" names it: a webhook's phase, as
// the handler was in it or as the plugin says; storage for a read that
// failed; the stage a refusal came from; decode for the run as a whole or
// for a stage before the handler. The first reason wins, with its stage.
func TestUnknownAt(t *testing.T) {
	now := func() time.Time { return time.Unix(0, 0) }
	for _, tc := range []struct {
		name string
		mark func(r *Run)
		want string
	}{
		{"the run as a whole", func(r *Run) { r.markUnknown("the body was not read whole") }, record.StageDecode},
		{"a webhook's phase, named", func(r *Run) { r.markUnknownAt(record.StageValidatingAdmission, "side effects") }, record.StageValidatingAdmission},
		{"the phase the handler is in", func(r *Run) {
			r.enter(PhaseMutating)
			r.markUnknownHere("a webhook kproxy cannot dial")
		}, record.StageMutatingAdmission},
		{"a read that failed", func(r *Run) {
			r.addRead(StorageRead{Path: "/api/v1/namespaces/a/pods/p", Err: errors.New("etcd unreachable")})
		}, record.StageStorage},
		{"a stage before the handler", func(r *Run) { r.markUnknownAt(record.StageAuthorization, "escalation") }, record.StageDecode},
		{"the first reason wins, with its stage", func(r *Run) {
			r.markUnknownAt(record.StageStorage, "first")
			r.markUnknownAt(record.StageValidation, "second")
		}, record.StageStorage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Run{now: now}
			tc.mark(r)
			if r.Unknown == "" {
				t.Fatal("the run is not unknown")
			}
			if got := r.UnknownAt(); got != tc.want {
				t.Errorf("UnknownAt() = %q, want %q (unknown: %s)", got, tc.want, r.Unknown)
			}
		})
	}
}
