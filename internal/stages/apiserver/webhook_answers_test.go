package apiserver

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	auditinternal "k8s.io/apiserver/pkg/apis/audit"

	"github.com/kproxy/kproxy/internal/record"
)

// TestWebhookAnswers: a verdict that hangs on an admission webhook the
// apiserver's answer contradicts is unknown, in either direction; one it
// does not contradict stands.
func TestWebhookAnswers(t *testing.T) {
	denied := &metav1.Status{Code: 403, Message: `admission webhook "flip.example.com" denied the request: no`}
	failed := &metav1.Status{Code: 500, Message: `Internal error occurred: failed calling webhook "slow.example.com": context deadline exceeded`}
	deniedOtherwise := &metav1.Status{Code: 403, Message: `admission webhook "flip.example.com" denied the request: no, again`}
	otherDenied := &metav1.Status{Code: 403, Message: `admission webhook "other.example.com" denied the request: no`}
	otherInvalid := &metav1.Status{Code: 422, Message: `admission webhook "other.example.com" denied the request: invalid`}
	exists := &metav1.Status{Code: 409, Message: `configmaps "x" already exists`}
	quota := &metav1.Status{Code: 403, Message: `configmaps "x" is forbidden: exceeded quota: q`}
	for _, tc := range []struct {
		name     string
		replay   *metav1.Status // nil: the replay admitted the write
		answered int
		refusal  *metav1.Status
		want     string // contains; "" keeps the verdict
		decided  string // the stage of the replay's refusal: validating-admission if ""
		why      string // what want's reason says: "a webhook's answer is its own" if ""
	}{
		{"denied in the replay, admitted by the apiserver", denied, 201, nil, `admission webhook "flip.example.com" refused kproxy's call (403`, "", ""},
		// A match condition on request.dryRun sends kproxy's call only.
		{"denied in the replay, admitted by the apiserver, which may not have called it", denied, 201, nil, "or its rules or match conditions, which may test request.dryRun, did not send that call to it", "", ""},
		{"denied in the replay, refused otherwise by the apiserver", denied, 409, exists, "the apiserver refused the write otherwise (409", "", ""},
		{"a failed call in the replay, admitted by the apiserver", failed, 201, nil, `admission webhook "slow.example.com" refused kproxy's call (500`, "", ""},
		{"denied by both", denied, 403, denied, "", "", ""},
		{"denied by both, with other messages", denied, 403, deniedOtherwise, "", "", ""},
		{"denied in the replay, shed by the apiserver", denied, 429, &metav1.Status{Code: 429, Message: "Too many requests"}, "", "", ""},
		{"refused by another plugin in the replay, admitted by the apiserver", quota, 201, nil, "", "", ""},
		// Two webhooks refuse: the apiserver reports the first to answer.
		{"denied in the replay, denied by another validating webhook in the apiserver", denied, 403, otherDenied, `admission webhook "flip.example.com" refused kproxy's call (403: admission webhook "flip.example.com" denied the request: no), and admission webhook "other.example.com" the apiserver's (403`, "", "reports the refusal that comes back first"},
		{"denied in the replay, another webhook's other status in the apiserver", denied, 422, otherInvalid, `and admission webhook "other.example.com" the apiserver's (422`, "", "reports the refusal that comes back first"},
		{"denied in the replay, another webhook's failed call in the apiserver", denied, 500, failed, `and admission webhook "slow.example.com" the apiserver's (500`, "", "reports the refusal that comes back first"},
		{"a failed call in the replay, another webhook's denial in the apiserver", failed, 403, denied, `admission webhook "slow.example.com" refused kproxy's call (500`, "", "reports the refusal that comes back first"},
		{"denied by a mutating webhook in the replay, by another in the apiserver", denied, 403, otherDenied, `and admission webhook "other.example.com" the apiserver's (403`, "mutating-admission", ""},
		{"admitted in the replay, denied by the apiserver's call", nil, 403, denied, `the apiserver's call to admission webhook "flip.example.com" refused the write (403`, "", ""},
		{"admitted in the replay, which may not have called it", nil, 403, denied, "or its rules or match conditions, which may test request.dryRun, did not send kproxy's call to it", "", ""},
		{"admitted in the replay, the apiserver's call failed", nil, 500, failed, `admission webhook "slow.example.com"`, "", ""},
		{"admitted in the replay, refused by another plugin", nil, 403, quota, "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.decided == "" {
				tc.decided = record.StageValidatingAdmission
			}
			if tc.why == "" {
				tc.why = "a webhook's answer is its own"
			}
			r := &Run{Verb: "create", Resource: "configmaps", Status: tc.replay, Decided: tc.decided, actual: func(context.Context) (Answer, bool) {
				return Answer{Status: tc.answered, Refusal: tc.refusal}, true
			}}
			if tc.replay != nil {
				r.Code = int(tc.replay.Code)
			}
			var got string
			if tc.replay != nil {
				got = r.webhookRefusedOnlyHere(context.Background())
			} else {
				got = r.webhookRefusedOnlyThere(Answer{Status: tc.answered, Refusal: tc.refusal})
			}
			checkOwnAnswer(t, got, tc.want, tc.why)
		})
	}
}

// TestConversionAnswers: a write the replay fails by a custom resource's
// conversion webhook is unknown where the apiserver answered otherwise,
// and stands where the apiserver's call failed alike.
func TestConversionAnswers(t *testing.T) {
	refused := &metav1.Status{Code: 500, Message: "conversion webhook for probe.test/v2, Kind=Gadget failed: conversion refused by probe"}
	down := &metav1.Status{Code: 500, Message: `conversion webhook for probe.test/v2, Kind=Gadget failed: Post "https://127.0.0.1:18443/convert?timeout=30s": connection refused`}
	undecryptable := &metav1.Status{Code: 500, Message: "Internal error occurred: StorageError: corrupt object, Code: 7, Key: /secrets/ns/s, ResourceVersion: 0, AdditionalErrorMsg: data from the storage is not transformable revision=0: no matching prefix found"}
	invalid := &metav1.Status{Code: 422, Message: `gadgets.probe.test "g" is invalid: spec.size: Invalid value: 60`}
	for _, tc := range []struct {
		name     string
		replay   *metav1.Status
		read     bool
		answered int
		refusal  *metav1.Status
		want     string // contains; "" keeps the verdict
	}{
		{"failed in the replay, patched by the apiserver", refused, false, 200, nil, "the conversion webhook failed kproxy's call (500: conversion webhook for probe.test/v2, Kind=Gadget failed: conversion refused by probe), and the apiserver answered 200"},
		{"failed in the replay, refused otherwise by the apiserver", refused, false, 422, invalid, "and the apiserver answered 422: " + invalid.Message},
		{"failed otherwise by both", refused, false, 500, down, "and the apiserver answered 500"},
		{"failed alike by both", refused, false, 500, refused, ""},
		{"not a conversion failure", invalid, false, 200, nil, ""},
		{"undecryptable in the replay, deleted by the apiserver", undecryptable, false, 200, nil, "kproxy's store could not decrypt or decode the object (500: Internal error occurred: StorageError: corrupt object"},
		{"undecryptable in both", undecryptable, false, 500, undecryptable, ""},
		{"a read (its failed read says unknown already)", refused, true, 200, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Run{Verb: "patch", Resource: "gadgets", Read: tc.read, Status: tc.replay, Code: int(tc.replay.Code), actual: func(context.Context) (Answer, bool) {
				return Answer{Status: tc.answered, Refusal: tc.refusal}, true
			}}
			got := r.conversionFailedOnlyHere(context.Background())
			why := "a conversion webhook's answer is its own"
			if strings.Contains(tc.replay.Message, corruptObject) {
				why = corruptOwnAnswer
			}
			checkOwnAnswer(t, got, tc.want, why)
		})
	}
}

// checkOwnAnswer checks why a verdict is unknown: got says want and why,
// or, with want "", nothing (the verdict stands).
func checkOwnAnswer(t *testing.T, got, want, why string) {
	t.Helper()
	switch {
	case want == "" && got != "":
		t.Errorf("unknown %q, want the verdict kept", got)
	case want != "" && !strings.Contains(got, want):
		t.Errorf("got %q, want it to say %q", got, want)
	case want != "" && !strings.Contains(got, why):
		t.Errorf("%q does not say why", got)
	}
}

// TestMutatingWebhookAnswers: a verdict after mutating admission, where
// the replay called a mutating webhook and the apiserver's answer
// contradicts it, is unknown, in either direction, naming the webhooks;
// one the answer does not contradict, or with no webhook called, stands.
func TestMutatingWebhookAnswers(t *testing.T) {
	invalid := &metav1.Status{Code: 422, Message: `ConfigMap "x" is invalid: metadata.labels: Invalid value: "-bad-": a valid label must be ...`}
	invalidOtherwise := &metav1.Status{Code: 422, Message: `ConfigMap "x" is invalid: metadata.labels: Invalid value: "-worse-": a valid label must be ...`}
	patched := []PluginCall{{Name: "MutatingAdmissionWebhook", Webhooks: []CalledWebhook{{Name: "label.example.com", Configuration: "c", Mutated: true}}}}
	unchanged := []PluginCall{{Name: "MutatingAdmissionWebhook", Webhooks: []CalledWebhook{{Name: "noop.example.com", Configuration: "c"}}}}
	failing := []PluginCall{{Name: "MutatingAdmissionWebhook", Webhooks: []CalledWebhook{{Name: "test.example.com", Configuration: "c"}}}}
	patchFailed := &metav1.Status{Code: 500, Reason: metav1.StatusReasonInternalError, Message: "Internal error occurred: testing value /metadata/name failed: test failed"}
	twice := []PluginCall{{Name: "MutatingAdmissionWebhook", Webhooks: []CalledWebhook{
		{Name: "noop.example.com"}, {Name: "label.example.com", Mutated: true}, {Name: "noop.example.com", Mutated: true}}}}
	for _, tc := range []struct {
		name     string
		plugins  []PluginCall
		replay   *metav1.Status // nil: the replay admitted the write
		decided  string
		answered int
		refusal  *metav1.Status
		want     string // contains; "" keeps the verdict
	}{
		{"refused at validation after a patch, admitted by the apiserver", patched, invalid, record.StageValidation, 201, nil,
			`the apiserver admitted the write (201), and the replay refuses it at validation (422: ConfigMap "x" is invalid: metadata.labels: Invalid value: "-bad-": a valid label must be ...) after mutating webhook "label.example.com" (patched it) in kproxy's call`},
		{"refused otherwise by the apiserver", patched, invalid, record.StageValidation, 422, invalidOtherwise, "the apiserver refused the write (422"},
		{"refused alike by both", patched, invalid, record.StageValidation, 422, invalid, ""},
		{"shed by the apiserver", patched, invalid, record.StageValidation, 429, &metav1.Status{Code: 429, Message: "Too many requests"}, ""},
		{"no webhook called", nil, invalid, record.StageValidation, 201, nil, ""},
		{"refused at mutating admission by a webhook's denial", patched, &metav1.Status{Code: 403, Message: `admission webhook "label.example.com" denied the request: no`}, record.StageMutatingAdmission, 201, nil, ""},
		{"the webhook's patch to kproxy's call could not be applied (a JSON-patch test)", failing, patchFailed, record.StageMutatingAdmission, 201, nil,
			`the apiserver admitted the write (201), and the replay refuses it at mutating-admission (500: Internal error occurred: testing value /metadata/name failed: test failed) after mutating webhook "test.example.com" (its patch could not be applied) in kproxy's call`},
		{"the webhook's patch failed alike in both", failing, patchFailed, record.StageMutatingAdmission, 500, patchFailed, ""},
		{"the patch of a webhook called again failed", []PluginCall{{Name: "MutatingAdmissionWebhook", Webhooks: []CalledWebhook{
			{Name: "test.example.com", Mutated: true}, {Name: "label.example.com", Mutated: true}, {Name: "test.example.com"}}}}, patchFailed, record.StageMutatingAdmission, 201, nil,
			`mutating webhooks "test.example.com" (its patch could not be applied), "label.example.com" (patched it)`},
		{"refused at storage after a patch (renamed to an existing object)", patched, &metav1.Status{Code: 409, Reason: metav1.StatusReasonAlreadyExists, Message: `configmaps "exists" already exists`}, record.StageStorage, 201, nil,
			`the replay refuses it at storage (409: configmaps "exists" already exists) after mutating webhook "label.example.com" (patched it)`},
		{"refused at validating admission, a webhook left it unchanged", unchanged, invalid, record.StageValidatingAdmission, 201, nil,
			`after mutating webhook "noop.example.com" (left it unchanged)`},
		{"webhooks called again (reinvocation)", twice, invalid, record.StageValidation, 201, nil,
			`after mutating webhooks "noop.example.com" (patched it), "label.example.com" (patched it)`},
		{"admitted after a patch, refused by the apiserver", patched, nil, "", 422, invalid,
			`the apiserver refused the write (422: ConfigMap "x" is invalid: metadata.labels: Invalid value: "-bad-": a valid label must be ...), and the replay admits it after mutating webhook "label.example.com" (patched it) in kproxy's call`},
		{"admitted, no webhook called", nil, nil, "", 422, invalid, ""},
		{"admitted, the store refused it in the apiserver", patched, nil, "", 409, &metav1.Status{Code: 409, Message: `configmaps "x" already exists`}, ""},
		{"admitted, the apiserver's call failed", patched, nil, "", 500, &metav1.Status{Code: 500, Message: "etcdserver: leader changed"}, ""},
		{"admitted, the apiserver could not apply a webhook's patch", patched, nil, "", 500, patchFailed,
			`the apiserver failed the write (500: Internal error occurred: testing value /metadata/name failed: test failed), and the replay admits it after mutating webhook "label.example.com" (patched it) in kproxy's call: a mutating webhook's patch the apiserver's code could not apply gives such an answer`},
		{"admitted, the apiserver's internal error, no webhook called", nil, nil, "", 500, patchFailed, ""},
		{"admitted, the apiserver refused another object as existing (renamed by a webhook)", patched, nil, "", 409,
			&metav1.Status{Code: 409, Message: `configmaps "exists" already exists`, Details: &metav1.StatusDetails{Name: "exists", Kind: "configmaps"}},
			`the apiserver refused the write (409: configmaps "exists" already exists), and the replay admits it after mutating webhook "label.example.com" (patched it)`},
		{"admitted, the apiserver refused the object read as existing", patched, nil, "", 409,
			&metav1.Status{Code: 409, Message: `configmaps "x" already exists`, Details: &metav1.StatusDetails{Name: "x", Kind: "configmaps"}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Run{Verb: "create", Resource: "configmaps", Plugins: tc.plugins, Status: tc.replay, Decided: tc.decided, actual: func(context.Context) (Answer, bool) {
				return Answer{Status: tc.answered, Refusal: tc.refusal}, true
			}, Reads: []StorageRead{{Key: "/registry/configmaps/ns/x"}}}
			var got string
			if tc.replay != nil {
				r.Code = int(tc.replay.Code)
				got = r.mutatedByWebhookHere(context.Background())
			} else {
				got = r.mutatedByWebhookThere(Answer{Status: tc.answered, Refusal: tc.refusal})
			}
			checkOwnAnswer(t, got, tc.want, "a mutating webhook's answer is its own")
		})
	}
}

// TestWebhookCalls: the mutating dispatcher's audit annotation of each
// call is read, and every annotation passes on to the request's own.
func TestWebhookCalls(t *testing.T) {
	inner := admission.NewAttributesRecord(nil, nil, schema.GroupVersionKind{}, "ns", "x", schema.GroupVersionResource{}, "", admission.Create, nil, true, nil)
	w := &webhookCalls{Attributes: inner}
	for k, v := range map[string]string{
		"mutation.webhook.admission.k8s.io/round_0_index_0":             `{"configuration":"c","webhook":"a.example.com","mutated":true}`,
		"failed-open.mutation.webhook.admission.k8s.io/round_0_index_1": "b.example.com",
		"patch.webhook.admission.k8s.io/round_0_index_0":                `{"configuration":"c","webhook":"a.example.com","patch":[],"patchType":"JSONPatch"}`,
	} {
		if err := w.AddAnnotation(k, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.AddAnnotationWithLevel("mutation.webhook.admission.k8s.io/round_1_index_0", `{"configuration":"c","webhook":"a.example.com","mutated":false}`, auditinternal.LevelMetadata); err != nil {
		t.Fatal(err)
	}
	want := []CalledWebhook{{Name: "a.example.com", Configuration: "c", Mutated: true}, {Name: "a.example.com", Configuration: "c"}}
	if got := w.list(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("calls %+v, want %+v", got, want)
	}
}
