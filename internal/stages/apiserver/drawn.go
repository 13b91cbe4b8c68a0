package apiserver

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// A create's name, when its body asks for one to be generated
// (generateName), and its uid are drawn at random as the registry stores
// the object, before validating admission: by the apiserver for the
// request, and by kproxy's replay for its own dry run. A
// ValidatingAdmissionPolicy that reads them (a generated name's last
// letter, a uid's first) sees other values in the two: a coin flip, not
// a prediction (found by a probe: 12 of 20 such creates predicted the
// other way). Mutating admission runs before the draw and cannot see it.
// Where such a policy refused one of the two and the answers differ, the
// replay says unknown, naming what the policy reads.

// drawnHere says why the replay's verdict on a create, decided by a
// ValidatingAdmissionPolicy that reads the object's drawn name or uid,
// is not the request's, or "".
func (p *paramReads) drawnHere(ctx context.Context, r *Run) (stage, why string) {
	if p == nil || r.Read || r.actual == nil || r.Verb != "create" || r.Subresource != "" {
		return "", ""
	}
	aw, ok := r.answeredOtherwise(ctx)
	if !ok {
		return "", ""
	}
	var policy string
	switch {
	case r.Status != nil:
		policy, _, ok = record.DenyingPolicy(r.Status.Message)
	case aw.Refusal != nil:
		policy, _, ok = record.DenyingPolicy(aw.Refusal.Message)
	default:
		return "", ""
	}
	if !ok || p.typed == nil {
		return "", ""
	}
	vap, err := p.typed.Admissionregistration().V1().ValidatingAdmissionPolicies().Lister().Get(policy)
	if err != nil {
		return "", ""
	}
	var drawn []string
	exprs := policyExpressions(vap)
	if generatedName(r.body) && strings.Contains(exprs, "name") {
		drawn = append(drawn, "name (generateName)")
	}
	if strings.Contains(exprs, "uid") {
		drawn = append(drawn, "uid")
	}
	if len(drawn) == 0 {
		return "", ""
	}
	return record.StageValidatingAdmission, fmt.Sprintf("ValidatingAdmissionPolicy %q reads the object's %s, which the registry draws at random for each create "+
		"(the apiserver for the request, kproxy's replay for its own dry run), and the apiserver answered %d where the replay answers %d: "+
		"which values the request got is not known", policy, strings.Join(drawn, " and "), aw.Status, r.Code)
}

// policyExpressions is every CEL expression of a policy, one per line.
func policyExpressions(vap *admissionregistrationv1.ValidatingAdmissionPolicy) string {
	var b strings.Builder
	for _, v := range vap.Spec.Validations {
		b.WriteString(v.Expression + "\n" + v.MessageExpression + "\n")
	}
	for _, v := range vap.Spec.Variables {
		b.WriteString(v.Expression + "\n")
	}
	for _, m := range vap.Spec.MatchConditions {
		b.WriteString(m.Expression + "\n")
	}
	for _, a := range vap.Spec.AuditAnnotations {
		b.WriteString(a.ValueExpression + "\n")
	}
	return b.String()
}

// generatedName reports a JSON create body that asks for a generated
// name: generateName, and no name. (YAML and protobuf bodies are not
// read: their names count as given.)
func generatedName(body []byte) bool {
	var obj struct {
		Metadata struct {
			Name         string `json:"name"`
			GenerateName string `json:"generateName"`
		} `json:"metadata"`
	}
	return json.Unmarshal(body, &obj) == nil && obj.Metadata.Name == "" && obj.Metadata.GenerateName != ""
}

// answeredOtherwise is the apiserver's answer to a write whose replay
// answered otherwise: not both admitted, not refused alike (the same
// status and message); ok is false when the answer is not known, or is
// of the moment (a 429, a 5xx: no admission state leads to it).
func (r *Run) answeredOtherwise(ctx context.Context) (Answer, bool) {
	if r.actual == nil {
		return Answer{}, false
	}
	aw, ok := r.actual(ctx)
	switch {
	case !ok || aw.Status == 0 || momentary(aw.Status):
	case r.Status == nil && aw.Refusal == nil && aw.Status/100 == 2:
		// admitted by both
	case r.Status != nil && aw.Refusal != nil && aw.Status == r.Code && record.SameMessage(aw.Refusal.Message, r.Status.Message):
		// refused alike
	default:
		return aw, true
	}
	return Answer{}, false
}
