package stages

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/kproxy/kproxy/internal/record"
)

// The replay runs the apiserver's code after the apiserver did, on
// kproxy's own state, at another instant. Some answers belong to the
// instant the apiserver gave them: its load (API Priority and Fairness
// shedding a request), a limit it met then (a watch cache not ready, a
// rate limit), a failure (etcd unavailable, a request out of time). The
// replay cannot meet those, so where such an answer contradicts the
// replay's prediction, the record says unknown, with what the replay's
// stages answer, rather than a confident miss. OfTheMoment is applied once
// the answer is known, when the record is written.

// shedBody begins the plain-text answer API Priority and Fairness and
// max-in-flight give a request they reject for load (the apiserver's
// tooManyRequests), which no Status carries.
const shedBody = "Too many requests, please try again later."

// OfTheMoment is the prediction to record once the apiserver's answer a
// is known: p, unless a is an answer of that instant that the replay
// cannot meet.
//   - Shed for load by API Priority and Fairness or max-in-flight (their
//     plain-text 429): the flowcontrol stage cannot predict that (it
//     depends on the apiserver's load at that instant), so whatever the
//     stages after it predicted is not what the request met. A refusal
//     predicted before flowcontrol (authentication, impersonation) stands:
//     the apiserver decides those first, and a 429 contradicts it.
//   - Any other 429 (a Status: a watch cache still initializing or behind
//     the revision asked for, a rate-limiting admission plugin, a
//     disruption budget), where the replay predicted success.
//   - A 500, 503 or 504 (etcd failing, a request out of time, an
//     aggregated API gone unavailable), where the replay predicted
//     success: the same code succeeded in the replay; or where it
//     predicted a refusal that rests on what failed (failedUnder).
//
// An answer kproxy gave itself (actual.error) is not the apiserver's and
// changes nothing.
func OfTheMoment(p record.Prediction, a record.Actual) record.Prediction {
	if p.Stage == record.StageUnknown || a.Error != "" {
		return p
	}
	shed := a.Status == http.StatusTooManyRequests && a.Reason == "" && strings.HasPrefix(a.Message, shedBody)
	var why string
	switch {
	case shed:
		if p.Stage == record.StageAuthentication || p.Stage == record.StageImpersonation {
			return p
		}
		by := "max-in-flight (--max-requests-inflight, --max-mutating-requests-inflight)"
		switch {
		case a.PriorityLevel != "":
			by = fmt.Sprintf("API Priority and Fairness, priority level %q", a.PriorityLevel)
		case a.PriorityLevelUID != "":
			by = "API Priority and Fairness, priority level uid " + a.PriorityLevelUID
		}
		why = "the apiserver shed the request for load (429 from " + by + "); whether a request is shed depends on the apiserver's load at that instant, which kproxy does not predict"
	case p.Stage != "" && (p.Status == a.Status || !failedUnder(p.Stage, a.Status)):
		return p
	case a.Status == http.StatusTooManyRequests:
		why = fmt.Sprintf("the apiserver refused the request with 429 (%q), a limit of that instant (a watch cache not ready or behind, a rate limit, a disruption budget) that kproxy's replay, run after it on kproxy's own state, does not meet", a.Message)
	case a.Status == http.StatusGatewayTimeout && strings.HasPrefix(a.Message, "Too large resource version"):
		// The watch cache waits up to 3 s for a revision it has not seen,
		// then answers this; the replay, later, found etcd there (probe S).
		why = fmt.Sprintf("the apiserver answered 504 (%q): its watch cache waited up to 3 seconds for a resourceVersion it had not yet seen, and the replay, run after it, found etcd at or past that revision, so whether the cache could have caught up in time was a matter of that instant", a.Message)
	case a.Status == http.StatusInternalServerError || a.Status == http.StatusServiceUnavailable || a.Status == http.StatusGatewayTimeout:
		why = fmt.Sprintf("the apiserver failed the request with %d (%q), a failure of that instant (etcd, a request out of time, a backend unavailable) that the same code, replayed after it, did not meet", a.Status, a.Message)
	default:
		return p
	}
	then := fmt.Sprintf("the replay's stages allow the request (%d)", p.Status)
	switch {
	case p.Stage != "":
		then = fmt.Sprintf("the stages after flowcontrol refuse it at %s (%d)", p.Stage, p.Status)
	case shed:
		then = fmt.Sprintf("the stages after flowcontrol allow the request (%d)", p.Status)
	}
	return record.Prediction{Stage: record.StageUnknown, FlowSchema: p.FlowSchema, PriorityLevel: p.PriorityLevel,
		Message: "cannot predict: " + why + "; " + then}
}

// failedUnder reports a failure of the moment (status) that a refusal the
// replay predicted at stage cannot be told from: the apiserver could not
// finish what that refusal rests on. A 500, 503 or 504 where storage
// refuses (a get's 404 rests on the etcd read the apiserver could not
// finish; found by a probe: GETs answered 504 while etcd was down,
// predicted 404 from a read made once etcd was back), and a 504, the
// request out of time, where any stage after flowcontrol refuses (a
// webhook, an admission plugin's read, etcd: all wait under the timeout).
// The stages before flowcontrol answer at once.
func failedUnder(stage string, status int) bool {
	switch status {
	case http.StatusGatewayTimeout:
		return stage != record.StageAuthentication && stage != record.StageImpersonation && stage != record.StageFlowControl
	case http.StatusInternalServerError, http.StatusServiceUnavailable:
		return stage == record.StageStorage
	}
	return false
}
