package apiserver

import (
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kproxy/kproxy/internal/record"
)

// TestLabelling: the contract's rules, one case each.
func TestLabelling(t *testing.T) {
	gr := schema.GroupResource{Resource: "configmaps"}
	status := func(err error) *metav1.Status { s := err.(apierrors.APIStatus).Status(); return &s }
	webhookErr := apierrors.NewForbidden(gr, "x", errors.New(`admission webhook "deny.example.com" denied the request`))
	cases := []struct {
		name string
		run  *Run
		st   *metav1.Status
		want string
	}{
		{"a mutating plugin's own refusal", &Run{phase: PhaseMutating, pluginErr: webhookErr, pluginErrPhase: PhaseMutating}, status(webhookErr), record.StageMutatingAdmission},
		{"a validating plugin's own refusal", &Run{phase: PhaseValidating, pluginErr: webhookErr, pluginErrPhase: PhaseValidating}, status(webhookErr), record.StageValidatingAdmission},
		{"no route: not found before any read", &Run{phase: PhaseDecode}, status(apierrors.NewNotFound(gr, "x")), record.StageDecode},
		{"not found in storage", &Run{phase: PhaseStorage, Reads: []StorageRead{{Key: "/configmaps/default/x"}}}, status(apierrors.NewNotFound(gr, "x")), record.StageStorage},
		{"already exists", &Run{phase: PhaseStorage, Reads: []StorageRead{{}}}, status(apierrors.NewAlreadyExists(gr, "x")), record.StageStorage},
		{"a precondition conflict", &Run{phase: PhaseValidation, Reads: []StorageRead{{}}}, status(apierrors.NewConflict(gr, "x", errors.New("the object has been modified"))), record.StageStorage},
		{"RBAC escalation, in the registry", &Run{phase: PhaseStorage, Reads: []StorageRead{{}}},
			status(apierrors.NewForbidden(gr, "r", errors.New(`user "alice" is attempting to grant RBAC permissions not currently held`))), record.StageAuthorization},
		{"an aggregation rule without cluster-admin", &Run{phase: PhaseValidation},
			status(apierrors.NewForbidden(gr, "r", errors.New("must have cluster-admin privileges to use the aggregationRule"))), record.StageAuthorization},
		{"a JSON patch test that fails on the stored object", &Run{phase: PhaseDecode, Verb: "patch", Reads: []StorageRead{{}}},
			status(apierrors.NewInvalid(schema.GroupKind{Kind: "ConfigMap"}, "x", nil)), record.StageStorage},
		{"a strategic-merge patch that fails on the stored object", &Run{phase: PhaseDecode, Verb: "patch", Reads: []StorageRead{{}}},
			&metav1.Status{Status: metav1.StatusFailure, Code: 500, Message: "map: map[image:noname] does not contain declared merge key: name"}, record.StageStorage},
		{"a server-side apply whose patch has a field not in the schema", &Run{phase: PhaseDecode, Verb: "patch", apply: true, Reads: []StorageRead{{}}},
			&metav1.Status{Status: metav1.StatusFailure, Code: 500, Message: "failed to create typed patch object (/applied; /v1, Kind=ConfigMap): .dta: field not declared in schema"}, record.StageDecode},
		{"a body too large, before admission", &Run{phase: PhaseDecode}, status(apierrors.NewRequestEntityTooLargeError("limit is 3145728")), record.StageDecode},
		{"a value too large for etcd", &Run{phase: PhaseStorage}, status(apierrors.NewRequestEntityTooLargeError("etcd")), record.StageStorage},
		{"an update whose resourceVersion is not a number, parsed by the store", &Run{phase: PhaseValidation, Verb: "update", Reads: []StorageRead{{}}},
			&metav1.Status{Status: metav1.StatusFailure, Code: 500, Message: `strconv.ParseUint: parsing "abc": invalid syntax`}, record.StageStorage},
		{"a delete of an object the store cannot decrypt, read before admission", &Run{phase: PhaseDecode, Verb: "delete", Reads: []StorageRead{{Found: true}}},
			status(apierrors.NewInternalError(errors.New("StorageError: corrupt object, Code: 7, Key: /secrets/ns/s, ResourceVersion: 0, AdditionalErrorMsg: data from the storage is not transformable revision=0: no key"))), record.StageStorage},
		{"a delete whose read failed, read before admission", &Run{phase: PhaseDecode, Verb: "delete", Reads: []StorageRead{{Err: errors.New("the apiserver answered 404 (no such object), and the replay found the object")}}},
			status(apierrors.NewInternalError(errors.New("the apiserver answered 404 (no such object), and the replay found the object"))), record.StageStorage},
		{"the strategy's validation", &Run{phase: PhaseValidation}, status(apierrors.NewInvalid(schema.GroupKind{Kind: "ConfigMap"}, "x", nil)), record.StageValidation},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.run.attribute(tc.st); got != tc.want {
				t.Errorf("attribute(%s %q) in phase %s = %s, want %s", tc.st.Reason, tc.st.Message, PhaseStage[tc.run.phase], got, tc.want)
			}
		})
	}
}
