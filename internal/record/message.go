package record

import (
	"regexp"
	"slices"
	"strings"
)

// SameMessage reports whether two apiserver messages say the same thing,
// up to what kube-apiserver itself leaves to chance, so that two runs of
// the same request (the apiserver's and the replay's, or two replays)
// are not called a change for it:
//
//   - The order of the errors in a list. kube-apiserver writes a
//     field.ErrorList as "<kind> "<name>" is invalid: [e1, e2, ...]", and a
//     custom resource's schema validation lists its errors in the order of
//     a walk over a Go map, which differs from one request to the next
//     (eight identical requests straight to the apiserver: three orders).
//     LimitRanger lists a container's "maximum cpu/memory usage" errors
//     walking its LimitRange's maps, and RBAC's denial lists the roles it
//     could not find ("RBAC: [clusterrole... "a" not found, ...]", a
//     binding to a deleted role) in its informers' order.
//   - Which of several culprits a refusal names, the first the apiserver
//     met in an order it does not keep: one of several exceeded or
//     unsatisfied ResourceQuotas (in its informer's order: six identical
//     creates past three quotas got two names), one of several denying
//     ValidatingAdmissionPolicies or failing MutatingAdmissionPolicies (in
//     an order drawn again on each reload of the policies), a
//     RuntimeClass's conflicting nodeSelector key, an impersonated extra
//     the caller may not set (the impersonation filter walks the request's
//     headers, a Go map). See also SameMessageAt.
//   - A name drawn for the request: the name generateName gets (five
//     characters of the apiserver's random alphabet, drawn again by each
//     run, and named by a refusal of the object), and the uid of the
//     AdmissionReview a webhook's answer did not match.
func SameMessage(a, b string) bool {
	if a == b || sameCulprit(a, b) {
		return true
	}
	a, b = undrawn(a), undrawn(b)
	b = withGeneratedNames(a, b)
	if a == b {
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
// field.Error formats one ("<nil>" for a rule on the whole object), or as
// one of the listed errors without a field path starts (listElement).
func errorList(s string) (prefix string, errs []string, ok bool) {
	i := strings.Index(s, ": [")
	if i < 0 || !strings.HasSuffix(s, "]") {
		return "", nil, false
	}
	prefix, body := s[:i+3], s[i+3:len(s)-1]
	start := 0
	for j := 0; j+2 < len(body); j++ {
		if body[j] != ',' || body[j+1] != ' ' || !elementStart(body[j+2:]) {
			continue
		}
		errs = append(errs, body[start:j])
		start = j + 2
	}
	return prefix, append(errs, body[start:]), true
}

// listElement starts an error of a list that has no field path, as
// kube-apiserver v1.37.2 words them: LimitRanger's ("maximum cpu usage
// per Container is 500m, but limit is 1", "cpu max limit to request
// ratio per Container is 2, but ..."), RBAC's missing roles
// ("clusterrole.rbac.authorization.k8s.io "r" not found"). Their own
// text holds ", " (", but limit is 1"), so a list of them is split only
// where the next one starts.
var listElement = regexp.MustCompile(`^(?:` + limitRangerError + `|(?:cluster)?roles?\.rbac\.authorization\.k8s\.io ")`)

// limitRangerError starts one of LimitRanger's refusals of a container's,
// a pod's or a claim's resources, as kube-apiserver v1.37.2 words them.
const limitRangerError = `(?:minimum|maximum) [^ ,]+ usage per [^ ,]+ is |[^ ,]+ max limit to request ratio per `

var limitRangerRefusal = regexp.MustCompile(limitRangerError)

// LimitRangerRefusal reports a message holding one of LimitRanger's
// refusals.
func LimitRangerRefusal(msg string) bool { return limitRangerRefusal.MatchString(msg) }

// elementStart reports whether s begins an error of a list.
func elementStart(s string) bool {
	return fieldStart(s) || listElement.MatchString(s)
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
	regexp.MustCompile(`failed quota: [^:]*: `),
	regexp.MustCompile(`conflict: runtimeClass\.scheduling\.nodeSelector\[`),
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
// match, as the webhook dispatcher words it.
var reviewUID = regexp.MustCompile(`expected response\.uid="[^"]*"`)

// impersonatedExtra is the impersonation filter's refusal of an extra the
// caller may not set, naming the value and the key it met first.
var impersonatedExtra = regexp.MustCompile(`^userextras\.authentication\.k8s\.io "[^"]*" is forbidden: (User "[^"]*" cannot impersonate resource) "userextras/[^"]*"`)

// undrawn is msg with what the apiserver draws for it (an AdmissionReview
// uid, the first extra met) left out.
func undrawn(msg string) string {
	msg = reviewUID.ReplaceAllLiteralString(msg, `expected response.uid="…"`)
	return impersonatedExtra.ReplaceAllString(msg, `userextras.authentication.k8s.io "…" is forbidden: $1 "userextras/…"`)
}

// generatedAlphabet is what the apiserver draws a generated name's
// suffix from (k8s.io/apimachinery/pkg/util/rand: no vowels, no 0, 1
// or 3), generatedLen its length (names.SimpleNameGenerator).
const (
	generatedAlphabet = "bcdfghjklmnpqrstvwxz2456789"
	generatedLen      = 5
)

// withGeneratedNames is b with the names generateName drew for it taken
// from a: where the two differ in the last five characters of a quoted
// name, each from the generator's alphabet in both, after the same base.
// Other differences stay, for the caller to judge.
func withGeneratedNames(a, b string) string {
	if len(a) != len(b) || a == b {
		return b
	}
	out := []byte(b)
	for i := 0; i < len(a); i++ {
		if a[i] == b[i] {
			continue
		}
		// The quote that ends the name: within generatedLen of i.
		end := -1
		for j := i + 1; j <= i+generatedLen && j < len(a); j++ {
			if a[j] == '"' && b[j] == '"' {
				end = j
				break
			}
		}
		start := end - generatedLen
		if end < 0 || start < 1 || a[start-1] == '"' || !drawnSuffix(a[start:end]) || !drawnSuffix(b[start:end]) {
			continue
		}
		// A name: back to its opening quote, with no space in it.
		if open := strings.LastIndexByte(a[:start], '"'); open < 0 || strings.ContainsAny(a[open:start], " ,") || a[open:start] != b[open:start] {
			continue
		}
		copy(out[start:end], a[start:end])
		i = end
	}
	return string(out)
}

func drawnSuffix(s string) bool {
	for _, c := range []byte(s) {
		if strings.IndexByte(generatedAlphabet, c) < 0 {
			return false
		}
	}
	return true
}

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
