package apiserver

import (
	"context"
	"fmt"
	"net/http"
	"path"
	"regexp"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// An admission webhook's answer is its own. kproxy calls the webhooks
// itself, in dry run, as the apiserver calls them for the request, and a
// webhook may answer the two calls differently: one that is not
// deterministic (a counter, a quota or a clock of its own), one that
// answers a dry run (dryRun: true in its AdmissionReview) otherwise, one
// that times out on one call and not on the other. That is not cluster
// state kproxy could read as it was on arrival. So when the replay's
// verdict hangs on a webhook and the apiserver's answer contradicts it,
// the verdict says nothing about the request: the run is unknown, saying
// which webhook answered what.

// webhookNamed finds the webhook an admission webhook dispatcher's error
// names: its denial, a call that failed, a dry run it does not support.
var webhookNamed = regexp.MustCompile(`(?:admission webhook|failed calling webhook) "([^"]+)"`)

// WebhookNamed is the admission webhook msg names, or "".
func WebhookNamed(msg string) string {
	if m := webhookNamed.FindStringSubmatch(msg); m != nil {
		return m[1]
	}
	return ""
}

// webhookOf is the webhook whose denial, or failed call (failurePolicy
// Fail), st is, or "".
func webhookOf(st *metav1.Status) string {
	if st == nil || (!strings.Contains(st.Message, " denied the request") && !strings.Contains(st.Message, "failed calling webhook ")) {
		return ""
	}
	return WebhookNamed(st.Message)
}

const webhookOwnAnswer = "a webhook's answer is its own (kproxy calls it again, in dry run: a webhook that is not deterministic, " +
	"that answers dry runs otherwise, or that timed out on one call answers the two differently), so the request's outcome is not known"

// kube-apiserver calls a request's validating webhooks all at once and
// reports the refusal that comes back first (the dispatcher's error
// channel, in arrival order; the others only go to its log). When two
// refuse, which one the apiserver reports is a race, run again in the
// replay: twelve identical creates with two denying webhooks got the
// first one's name seven times and the second's five, and the replay's
// draw differed five times. A webhook's refusal in the replay that names
// another than the apiserver's says nothing of which the apiserver
// reports, nor of its status.
const webhooksInParallel = "kube-apiserver calls a request's validating webhooks at once and reports the refusal that comes back first " +
	"(several may refuse; the rest go to its log), and each call's answer is the webhook's own, " +
	"so which refusal the apiserver reports, and its status, is not known"

// webhookRefusedOnlyHere says why the replay's refusal by an admission
// webhook is not the request's, or "": the apiserver admitted the write,
// refused it by another webhook, or refused it with another status.
func (r *Run) webhookRefusedOnlyHere(ctx context.Context) string {
	if r.Read || r.actual == nil || r.Status == nil || connectSubresource(r.Subresource) {
		return ""
	}
	name := webhookOf(r.Status)
	if name == "" {
		return ""
	}
	aw, ok := r.actual(ctx)
	switch theirs := webhookOf(aw.Refusal); {
	case !ok:
	case theirs != "" && theirs != name:
		// Another webhook refused the apiserver's call: whatever the two
		// statuses, the replay's refusal is not the one reported.
		why := webhookOwnAnswer
		if r.Decided == record.StageValidatingAdmission {
			why = webhooksInParallel
		}
		return fmt.Sprintf("admission webhook %q refused kproxy's call (%d: %s), and admission webhook %q the apiserver's (%d: %s): %s",
			name, r.Code, r.Status.Message, theirs, aw.Status, aw.Refusal.Message, why)
	case aw.Status >= 200 && aw.Status < 300:
		// The apiserver may not have called it at all: a match condition
		// on request.dryRun sends kproxy's dry-run call and not the
		// apiserver's.
		return fmt.Sprintf("admission webhook %q refused kproxy's call (%d: %s), and the apiserver admitted the write (%d; the webhook "+
			"admitted the apiserver's call, or its rules or match conditions, which may test request.dryRun, did not send that call to it): %s",
			name, r.Code, r.Status.Message, aw.Status, webhookOwnAnswer)
	case aw.Refusal != nil && aw.Status != r.Code && aw.Status != http.StatusTooManyRequests:
		return fmt.Sprintf("admission webhook %q refused kproxy's call (%d: %s), and the apiserver refused the write otherwise (%d: %s): %s",
			name, r.Code, r.Status.Message, aw.Status, aw.Refusal.Message, webhookOwnAnswer)
	}
	return ""
}

// webhookRefusedOnlyThere says why the replay's admission of a write the
// apiserver refused by an admission webhook (aw) is not the request's, or
// "".
func (r *Run) webhookRefusedOnlyThere(aw Answer) string {
	name := webhookOf(aw.Refusal)
	if name == "" {
		return ""
	}
	return fmt.Sprintf("the apiserver's call to admission webhook %q refused the write (%d: %s), and the replay admits it "+
		"(the webhook admitted kproxy's call, or its rules or match conditions, which may test request.dryRun, did not send kproxy's call to it): %s", name, aw.Status, aw.Refusal.Message, webhookOwnAnswer)
}

// A custom resource's conversion webhook answers kproxy's replay too: the
// replay reads and writes the object through the apiextensions server,
// which calls it to convert between the request's version and the stored
// one. Its answer to that call is its own as well (a webhook that failed
// or was down for one call and not the other), so a replay that a
// conversion failure decides, where the apiserver answered otherwise,
// says nothing about the request.

// conversionFailed finds the apiextensions server's errors of a
// conversion webhook's call: failed, or an answer it could not use.
const conversionFailed = "conversion webhook for "

const conversionOwnAnswer = "a conversion webhook's answer is its own (kproxy's replay calls it again: a webhook that failed, " +
	"timed out or was down for one call and not the other answers the two differently), so the request's outcome is not known"

// corruptObject finds the etcd3 store's error for an object it cannot
// decrypt or decode (AllowUnsafeMalformedObjectDeletion's wrapping).
const corruptObject = "StorageError: corrupt object"

const corruptOwnAnswer = "the apiserver's store read it otherwise " +
	"(kproxy's encryption keys may not be the apiserver's), so the request's outcome is not known"

// conversionFailedOnlyHere says why the replay's failure of a write by a
// custom resource's conversion webhook, or by an object its store cannot
// decrypt or decode, where the apiserver answered otherwise, is not the
// request's, or "".
func (r *Run) conversionFailedOnlyHere(ctx context.Context) string {
	if r.Read || r.actual == nil || r.Status == nil {
		return ""
	}
	failed, why := "the conversion webhook failed kproxy's call", conversionOwnAnswer
	switch {
	case strings.Contains(r.Status.Message, conversionFailed):
	case strings.Contains(r.Status.Message, corruptObject):
		failed, why = "kproxy's store could not decrypt or decode the object", corruptOwnAnswer
	default:
		return ""
	}
	aw, ok := r.actual(ctx)
	switch {
	case !ok:
	case aw.Refusal != nil && aw.Status == r.Code && aw.Refusal.Message == r.Status.Message:
		// The same failure: the apiserver's call failed as kproxy's did.
	case aw.Refusal != nil:
		return fmt.Sprintf("%s (%d: %s), and the apiserver answered %d: %s: %s",
			failed, r.Code, r.Status.Message, aw.Status, aw.Refusal.Message, why)
	default:
		return fmt.Sprintf("%s (%d: %s), and the apiserver answered %d: %s",
			failed, r.Code, r.Status.Message, aw.Status, why)
	}
	return ""
}

// conversionFailedOnlyThere says why the replay's verdict on a write
// the apiserver failed by a custom resource's conversion webhook (its
// call failed, or its answer could not be used), where kproxy's own call
// did not fail alike, is not the request's, or "": the replay admitted
// the write, or refused it otherwise (an earlier copy's 409, say, where
// the apiserver never reached its store).
func (r *Run) conversionFailedOnlyThere(aw Answer) string {
	if aw.Refusal == nil || !strings.Contains(aw.Refusal.Message, conversionFailed) {
		return ""
	}
	verdict := fmt.Sprintf("admits it (%d)", r.Code)
	if r.Status != nil {
		if r.Code == aw.Status && r.Status.Message == aw.Refusal.Message {
			return "" // the same failure: kproxy's call failed as the apiserver's did
		}
		verdict = fmt.Sprintf("answers %d: %s", r.Code, r.Status.Message)
	}
	return fmt.Sprintf("the apiserver's call to a conversion webhook failed the write (%d: %s), and kproxy's replay %s: %s",
		aw.Status, aw.Refusal.Message, verdict, conversionOwnAnswer)
}

// conversionFailedThere is conversionFailedOnlyThere for a replay that
// refused the write.
func (r *Run) conversionFailedThere(ctx context.Context) string {
	if r.Read || r.actual == nil || r.Status == nil {
		return ""
	}
	aw, ok := r.actual(ctx)
	if !ok {
		return ""
	}
	return r.conversionFailedOnlyThere(aw)
}

// A mutating webhook's answer is its own too, and what it changes moves
// every stage after it: a label it sets that validation refuses, a
// field a ValidatingAdmissionPolicy checks. A webhook that patches a dry
// run otherwise (dryRun: true in its AdmissionReview) had kproxy predict
// 422 for a create the apiserver admitted, and 201 for one it refused,
// every time. So where the replay called a mutating webhook and its
// verdict after mutating admission contradicts the apiserver's answer,
// the replay says nothing about the request: the run is unknown, naming
// the webhooks and what they did to kproxy's call.

const mutatingWebhookOwnAnswer = "a mutating webhook's answer is its own (kproxy calls it again, in dry run: a webhook that " +
	"patches a dry run otherwise, or that is not deterministic, changes the two objects differently), so what the stages " +
	"after it saw, and the request's outcome, is not known"

// calledWebhooks are the mutating webhooks the replay called, each once
// in the order first called, and which of them changed kproxy's object.
func (r *Run) calledWebhooks() (names []string, mutated map[string]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	mutated = map[string]bool{}
	for _, p := range r.Plugins {
		for _, w := range p.Webhooks {
			if _, seen := mutated[w.Name]; !seen {
				names = append(names, w.Name)
			}
			mutated[w.Name] = mutated[w.Name] || w.Mutated
		}
	}
	return names, mutated
}

// mutatingWebhooksCalled names the mutating webhooks the replay called,
// saying which changed kproxy's object; "" when it called none. failed:
// the replay's admission ended on the last one's patch, which the
// apiserver's code could not apply.
func (r *Run) mutatingWebhooksCalled(failed bool) string {
	names, mutated := r.calledWebhooks()
	if len(names) == 0 {
		return ""
	}
	last := r.lastCalledWebhook() // reinvoked, it may be any of names
	for i, n := range names {
		did := "left it unchanged"
		switch {
		case failed && n == last:
			did = "its patch could not be applied"
		case mutated[n]:
			did = "patched it"
		}
		names[i] = fmt.Sprintf("%q (%s)", n, did)
	}
	noun := "mutating webhook "
	if len(names) > 1 {
		noun = "mutating webhooks "
	}
	return noun + strings.Join(names, ", ")
}

// lastCalledWebhook is the mutating webhook the replay called last, or "".
func (r *Run) lastCalledWebhook() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	last := ""
	for _, p := range r.Plugins {
		for _, w := range p.Webhooks {
			last = w.Name
		}
	}
	return last
}

// calledMutatingWebhook reports whether the replay called the mutating
// webhook named name.
func (r *Run) calledMutatingWebhook(name string) bool {
	_, mutated := r.calledWebhooks()
	_, called := mutated[name]
	return called
}

// mutatedByWebhookHere says why the replay's refusal of a write after
// a mutating webhook's call (by validation, validating admission or the
// store, or by the webhook's patch itself, which the apiserver's code
// could not apply to kproxy's object: a JSON-patch test that fails, an
// object that no longer decodes, a patch of a DELETE), where the
// apiserver admitted the write or refused it otherwise, is not the
// request's, or "". A webhook that patches the dry run otherwise (it
// renamed kproxy's object to one that exists, or sent a patch only kproxy
// got) had been predicted 500 or 409 for a 201 (found by a probe, 69
// records).
func (r *Run) mutatedByWebhookHere(ctx context.Context) string {
	if r.Read || r.actual == nil || r.Status == nil || connectSubresource(r.Subresource) {
		return ""
	}
	// The webhook's patch failed: a refusal at mutating admission that
	// is no webhook's denial or failed call (webhookRefusedOnlyHere's).
	patchFailed := r.Decided == record.StageMutatingAdmission && webhookOf(r.Status) == ""
	switch r.Decided {
	case record.StageValidation, record.StageValidatingAdmission, record.StageStorage:
	case record.StageMutatingAdmission:
		if !patchFailed {
			return ""
		}
	default:
		return ""
	}
	called := r.mutatingWebhooksCalled(patchFailed)
	if called == "" {
		return ""
	}
	aw, ok := r.actual(ctx)
	switch {
	case !ok || momentary(aw.Status) || (momentary(r.Code) && !patchFailed):
	case aw.Status >= 200 && aw.Status < 300:
		return fmt.Sprintf("the apiserver admitted the write (%d), and the replay refuses it at %s (%d: %s) after %s in kproxy's call: %s",
			aw.Status, r.Decided, r.Code, r.Status.Message, called, mutatingWebhookOwnAnswer)
	case aw.Refusal != nil && (aw.Status != r.Code || !record.SameMessage(aw.Refusal.Message, r.Status.Message)):
		return fmt.Sprintf("the apiserver refused the write (%d: %s), and the replay refuses it otherwise at %s (%d: %s) after %s in kproxy's call: %s",
			aw.Status, aw.Refusal.Message, r.Decided, r.Code, r.Status.Message, called, mutatingWebhookOwnAnswer)
	}
	return ""
}

// mutatedByWebhookThere says why the replay's admission of a write the
// apiserver refused (aw), where the replay called a mutating webhook, is
// not the request's, or "". The store's refusals (404, 409: the object's
// existence and version) are not what a patch changes, unless they name
// another object than the one the replay read (a webhook renamed the
// apiserver's). Nor are the apiserver's failures of the moment, but its
// 500 that a webhook's patch it could not apply gives (an internal error
// that names no webhook; found by a probe, said to be a failure of that
// instant).
func (r *Run) mutatedByWebhookThere(aw Answer) string {
	if aw.Refusal == nil {
		return ""
	}
	switch {
	case aw.Status == http.StatusNotFound || aw.Status == http.StatusConflict:
		if !r.namesAnother(aw.Refusal) {
			return ""
		}
	case aw.Status == http.StatusInternalServerError:
		if !strings.HasPrefix(aw.Refusal.Message, "Internal error occurred: ") || webhookOf(aw.Refusal) != "" {
			return ""
		}
		if called := r.mutatingWebhooksCalled(false); called != "" {
			return fmt.Sprintf("the apiserver failed the write (%d: %s), and the replay admits it after %s in kproxy's call: "+
				"a mutating webhook's patch the apiserver's code could not apply gives such an answer, and %s",
				aw.Status, aw.Refusal.Message, called, mutatingWebhookOwnAnswer)
		}
		return ""
	case momentary(aw.Status):
		return ""
	}
	called := r.mutatingWebhooksCalled(false)
	if called == "" {
		return ""
	}
	return fmt.Sprintf("the apiserver refused the write (%d: %s), and the replay admits it after %s in kproxy's call: %s",
		aw.Status, aw.Refusal.Message, called, mutatingWebhookOwnAnswer)
}

// namesAnother reports a refusal that names an object (its details'
// name) other than every one the replay read: the apiserver's object was
// not kproxy's (a mutating webhook renamed one of them).
func (r *Run) namesAnother(st *metav1.Status) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.Reads) == 0 {
		return false
	}
	for _, read := range r.Reads {
		if read.List || !namesOther(st, read.Key) {
			return false
		}
	}
	return true
}

// namesOther reports a refusal whose details name an object other than
// the one stored at key.
func namesOther(st *metav1.Status, key string) bool {
	return st != nil && st.Details != nil && st.Details.Name != "" && path.Base(key) != st.Details.Name
}
