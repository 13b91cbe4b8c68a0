package apiserver

import (
	"errors"
	"net/http/httptest"
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
		{"a read that failed, answered as decode's refusal", func(r *Run) {
			r.addRead(StorageRead{Path: "/api/v1/namespaces/a", Err: errors.New("deleted after this request")})
			r.Decided = record.StageDecode
		}, record.StageDecode},
		{"a stage before the handler", func(r *Run) { r.markUnknownAt(record.StageFlowControl, "late") }, record.StageDecode},
		// The RBAC registry's escalation check, which the pipeline has the
		// authorization stage report.
		{"authorization", func(r *Run) { r.markUnknownAt(record.StageAuthorization, "escalation") }, record.StageAuthorization},
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

// TestCreateNamingResourceVersion: a create that is not a dry run, of the
// object itself, whose body names a resourceVersion other than 0, is
// refused by the etcd3 store (500) where the replay's dry run admitted it
// or found it existing; any other run keeps its answer.
func TestCreateNamingResourceVersion(t *testing.T) {
	exists := `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"configmaps \"a\" already exists","reason":"AlreadyExists","code":409}`
	invalid := `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"invalid","reason":"Invalid","code":422}`
	for _, tc := range []struct {
		name      string
		run       *Run
		code      int
		body      string
		wantRefus bool
	}{
		{"admitted", &Run{Verb: "create", BodyRV: "5"}, 201, "{}", true},
		{"existing", &Run{Verb: "create", BodyRV: "5"}, 409, exists, true},
		{"refused before the store", &Run{Verb: "create", BodyRV: "5"}, 422, invalid, false},
		{"a dry run", &Run{Verb: "create", BodyRV: "5", DryRun: true}, 201, "{}", false},
		{"no resourceVersion", &Run{Verb: "create"}, 201, "{}", false},
		{"resourceVersion 0", &Run{Verb: "create", BodyRV: "0"}, 201, "{}", false},
		{"not a number (the store does not parse it on create)", &Run{Verb: "create", BodyRV: "abc"}, 201, "{}", false},
		{"a subresource (a TokenRequest)", &Run{Verb: "create", BodyRV: "5", Subresource: "token"}, 201, "{}", false},
		{"an update", &Run{Verb: "update", BodyRV: "5"}, 200, "{}", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := recorder{httptest.NewRecorder(), tc.run}
			resp.Header().Set("Content-Type", "application/json")
			resp.WriteHeader(tc.code)
			_, _ = resp.WriteString(tc.body)
			st := tc.run.createNamingResourceVersion(resp)
			switch {
			case (st != nil) != tc.wantRefus:
				t.Fatalf("refused = %v, want %v", st != nil, tc.wantRefus)
			case st != nil && (st.Code != 500 || st.Message != "resourceVersion should not be set on objects to be created"):
				t.Errorf("refusal %+v, want the store's 500", st)
			}
		})
	}
}
