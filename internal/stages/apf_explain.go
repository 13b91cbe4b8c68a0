package stages

import (
	"fmt"
	"slices"
	"strings"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/authentication/user"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
)

// matchedRule names the rule of the FlowSchema that APF matched, for the
// explanation: the classification itself comes from the apiserver's own
// controller; this only says which of the schema's rules fits the request.
func matchedRule(fs *flowcontrolv1.FlowSchema, u user.Info, info *apirequest.RequestInfo) string {
	for i, r := range fs.Spec.Rules {
		subj := ""
		for _, s := range r.Subjects {
			if subjectFits(s, u) {
				subj = describeAPFSubject(s)
				break
			}
		}
		if subj == "" {
			continue
		}
		if info.IsResourceRequest {
			for _, rr := range r.ResourceRules {
				if resourceRuleFits(rr, info) {
					return fmt.Sprintf("rule %d: subject %s, verbs %v on %v in API groups %q", i, subj, rr.Verbs, rr.Resources, rr.APIGroups)
				}
			}
			continue
		}
		for _, nr := range r.NonResourceRules {
			if slices.Contains(nr.Verbs, "*") || slices.Contains(nr.Verbs, info.Verb) {
				for _, u := range nr.NonResourceURLs {
					if u == "*" || u == info.Path || (strings.HasSuffix(u, "/*") && strings.HasPrefix(info.Path, strings.TrimSuffix(u, "*"))) {
						return fmt.Sprintf("rule %d: subject %s, verbs %v on non-resource URLs %v", i, subj, nr.Verbs, nr.NonResourceURLs)
					}
				}
			}
		}
	}
	return ""
}

func subjectFits(s flowcontrolv1.Subject, u user.Info) bool {
	switch s.Kind {
	case flowcontrolv1.SubjectKindUser:
		return s.User != nil && (s.User.Name == "*" || s.User.Name == u.GetName())
	case flowcontrolv1.SubjectKindGroup:
		return s.Group != nil && (s.Group.Name == "*" || slices.Contains(u.GetGroups(), s.Group.Name))
	case flowcontrolv1.SubjectKindServiceAccount:
		if s.ServiceAccount == nil {
			return false
		}
		ns, name, err := serviceaccount.SplitUsername(u.GetName())
		return err == nil && ns == s.ServiceAccount.Namespace && (s.ServiceAccount.Name == "*" || s.ServiceAccount.Name == name)
	}
	return false
}

func describeAPFSubject(s flowcontrolv1.Subject) string {
	switch {
	case s.User != nil:
		return "user " + s.User.Name
	case s.Group != nil:
		return "group " + s.Group.Name
	case s.ServiceAccount != nil:
		return "service account " + s.ServiceAccount.Namespace + "/" + s.ServiceAccount.Name
	}
	return string(s.Kind)
}

func resourceRuleFits(r flowcontrolv1.ResourcePolicyRule, info *apirequest.RequestInfo) bool {
	has := func(set []string, v string) bool { return slices.Contains(set, "*") || slices.Contains(set, v) }
	if !has(r.Verbs, info.Verb) || !has(r.APIGroups, info.APIGroup) {
		return false
	}
	res := info.Resource
	if info.Subresource != "" {
		res += "/" + info.Subresource
	}
	if !has(r.Resources, res) {
		return false
	}
	if info.Namespace == "" {
		return r.ClusterScope
	}
	return has(r.Namespaces, info.Namespace)
}
