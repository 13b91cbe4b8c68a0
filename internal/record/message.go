package record

import (
	"regexp"
	"slices"
	"strings"
)

// SameMessage reports whether two apiserver messages say the same thing,
// up to the order of the errors in a list. kube-apiserver writes a
// field.ErrorList as "<kind> "<name>" is invalid: [e1, e2, ...]", and a
// custom resource's schema validation lists its errors in the order of a
// walk over a Go map, which differs from one request to the next (eight
// identical requests straight to the apiserver: three orders). Comparing
// two verdicts by their message text would call that a change.
//
// Likewise a refusal that names one of several culprits, the first the
// apiserver met in an order it does not keep: one of several exceeded
// ResourceQuotas (in its informer's order: six identical creates past
// three quotas got two names), one of several denying
// ValidatingAdmissionPolicies or failing MutatingAdmissionPolicies (in an
// order drawn again on each reload of the policies). Two such refusals of
// the same request say the same thing, whichever culprit they name (and
// see SameMessageAt). And a webhook's answer to another AdmissionReview
// than it was sent is reported with the review's uid, drawn afresh for
// each call.
func SameMessage(a, b string) bool {
	if a == b || sameCulprit(a, b) {
		return true
	}
	if ua, ub := reviewUID.ReplaceAllLiteralString(a, reviewUIDSame), reviewUID.ReplaceAllLiteralString(b, reviewUIDSame); ua != a && ua == ub {
		return true
	}
	if len(a) != len(b) {
		return false
	}
	pa, ea, ok := errorList(a)
	if !ok {
		return false
	}
	pb, eb, ok := errorList(b)
	if !ok || pa != pb || len(ea) != len(eb) {
		return false
	}
	slices.Sort(ea)
	slices.Sort(eb)
	return slices.Equal(ea, eb)
}

// errorList splits a message ending in a bracketed error list into what
// comes before the list and the list's errors. An error starts after ", "
// with a field path (no spaces, not a quoted value) and ": ", as
// field.Error formats one ("<nil>" for a rule on the whole object).
func errorList(s string) (prefix string, errs []string, ok bool) {
	i := strings.Index(s, ": [")
	if i < 0 || !strings.HasSuffix(s, "]") {
		return "", nil, false
	}
	prefix, body := s[:i+3], s[i+3:len(s)-1]
	start := 0
	for j := 0; j+2 < len(body); j++ {
		if body[j] != ',' || body[j+1] != ' ' || !fieldStart(body[j+2:]) {
			continue
		}
		errs = append(errs, body[start:j])
		start = j + 2
	}
	return prefix, append(errs, body[start:]), true
}

// fieldStart reports whether s begins with a field path and ": ".
func fieldStart(s string) bool {
	end := strings.Index(s, ": ")
	if end <= 0 || s[0] == '"' {
		return false
	}
	return !strings.ContainsAny(s[:end], " ,")
}

// policyDenial is a ValidatingAdmissionPolicy's denial as the plugin
// words it, capturing the policy and the binding.
var policyDenial = regexp.MustCompile(`ValidatingAdmissionPolicy '([^']*)'(?: with binding '([^']*)')? denied request: `)

// policyFailure is how the policy plugins' shared dispatcher words the
// first error of an admission policy's run (generic.PolicyError): a
// MutatingAdmissionPolicy's failed mutation, either kind's params not
// found; the policy and the binding, or the policy alone.
var policyFailure = regexp.MustCompile(`^policy (?:'([^']*)' with binding '([^']*)'|"([^"]*)") denied request: `)

// DenyingPolicy is the admission policy (and its binding, if named) whose
// denial or failure msg is.
func DenyingPolicy(msg string) (policy, binding string, ok bool) {
	if m := policyDenial.FindStringSubmatch(msg); m != nil {
		return m[1], m[2], true
	}
	if m := policyFailure.FindStringSubmatch(msg); m != nil {
		return m[1] + m[3], m[2], true
	}
	return "", "", false
}

// drawnCulprits start the part of a refusal that names the culprit the
// apiserver met first (see SameMessage).
var drawnCulprits = []*regexp.Regexp{
	regexp.MustCompile(`exceeded quota: [^,]*, requested: `),
	policyDenial,
	policyFailure,
}

// webhookDenial is an admission webhook's denial as the dispatchers word
// it.
var webhookDenial = regexp.MustCompile(`^admission webhook "[^"]*" denied the request`)

// SameMessageAt is SameMessage for two refusals by the same stage. At
// validating-admission it also forgives another webhook's denial:
// kube-apiserver calls a request's validating webhooks at once and
// reports the first refusal back, so two runs of the same request may
// name either. Mutating webhooks are called one after another, in a
// fixed order: there another webhook is another verdict.
func SameMessageAt(stage, a, b string) bool {
	if SameMessage(a, b) {
		return true
	}
	return stage == StageValidatingAdmission && webhookDenial.MatchString(a) && webhookDenial.MatchString(b)
}

// reviewUID is the uid of the AdmissionReview a webhook's answer did not
// match, as the webhook dispatcher words it; reviewUIDSame replaces it.
var reviewUID = regexp.MustCompile(`expected response\.uid="[^"]*"`)

const reviewUIDSame = `expected response.uid="…"`

// sameCulprit reports two refusals of the same request (the same text
// before it) that each name a culprit of the same kind.
func sameCulprit(a, b string) bool {
	for _, re := range drawnCulprits {
		ia, ib := re.FindStringIndex(a), re.FindStringIndex(b)
		if ia != nil && ib != nil && a[:ia[0]] == b[:ib[0]] {
			return true
		}
	}
	return false
}
