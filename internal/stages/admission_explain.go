package stages

import (
	"fmt"

	"regexp"
	"sort"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/labels"

	"k8s.io/apiserver/pkg/admission"
	admissionregistrationlisters "k8s.io/client-go/listers/admissionregistration/v1"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// admissionExplainer adds to an admission plugin's refusal what the
// apiserver's message leaves out: the webhook's configuration, the
// policy's expressions and binding, the namespace's PodSecurity labels.
// Quota and LimitRange messages already carry their numbers.
type admissionExplainer struct {
	describeWebhook func(name string) string
	policies        admissionregistrationlisters.ValidatingAdmissionPolicyLister
	bindings        admissionregistrationlisters.ValidatingAdmissionPolicyBindingLister
	namespaces      corelisters.NamespaceLister
}

func newAdmissionExplainer(s *apiserver.ClusterState) *admissionExplainer {
	ar := s.Informers.Admissionregistration().V1()
	return &admissionExplainer{
		describeWebhook: webhookDescriber(s),
		policies:        ar.ValidatingAdmissionPolicies().Lister(),
		bindings:        ar.ValidatingAdmissionPolicyBindings().Lister(),
		namespaces:      s.Informers.Core().V1().Namespaces().Lister(),
	}
}

var policyNamed = regexp.MustCompile(`ValidatingAdmissionPolicy '([^']+)' with binding '([^']+)'`)

func (e *admissionExplainer) Explain(plugin string, a admission.Attributes, err error) string {
	if e == nil || err == nil {
		return ""
	}
	msg := err.Error()
	switch plugin {
	case "MutatingAdmissionWebhook", "ValidatingAdmissionWebhook":
		if name := apiserver.WebhookNamed(msg); name != "" {
			return "the " + e.Webhook(name)
		}
	case "ValidatingAdmissionPolicy":
		if m := policyNamed.FindStringSubmatch(msg); m != nil {
			return e.describePolicy(m[1], m[2])
		}
	case "PodSecurity":
		return e.describePodSecurity(a.GetNamespace())
	}
	return ""
}

func (e *admissionExplainer) describePolicy(policy, binding string) string {
	var parts []string
	if p, err := e.policies.Get(policy); err == nil {
		var exprs []string
		for _, v := range p.Spec.Validations {
			exprs = append(exprs, fmt.Sprintf("%q", v.Expression))
		}
		parts = append(parts, fmt.Sprintf("policy %q validates %s", policy, strings.Join(exprs, ", ")))
		if p.Spec.FailurePolicy != nil {
			parts = append(parts, "failurePolicy "+string(*p.Spec.FailurePolicy))
		}
	}
	if b, err := e.bindings.Get(binding); err == nil {
		actions := make([]string, len(b.Spec.ValidationActions))
		for i, a := range b.Spec.ValidationActions {
			actions[i] = string(a)
		}
		s := fmt.Sprintf("binding %q with validationActions %v", binding, actions)
		if pr := b.Spec.ParamRef; pr != nil {
			s += fmt.Sprintf(", params %s/%s", pr.Namespace, pr.Name)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

func (e *admissionExplainer) describePodSecurity(ns string) string {
	n, err := e.namespaces.Get(ns)
	if err != nil {
		return ""
	}
	var ls []string
	for k, v := range n.Labels {
		if strings.HasPrefix(k, "pod-security.kubernetes.io/") {
			ls = append(ls, k+"="+v)
		}
	}
	sort.Strings(ls)
	if len(ls) == 0 {
		return fmt.Sprintf("namespace %q has no pod-security.kubernetes.io labels: the apiserver's defaults apply (--admission-control-config-file)", ns)
	}
	return fmt.Sprintf("namespace %q: %s (exemptions come from --admission-control-config-file)", ns, strings.Join(ls, ", "))
}

// webhookDescriber names an admission webhook with what decides how the
// apiserver treats it: its configuration, sideEffects, failurePolicy and
// timeout.
func webhookDescriber(s *apiserver.ClusterState) func(name string) string {
	mw := s.Informers.Admissionregistration().V1().MutatingWebhookConfigurations().Lister()
	vw := s.Informers.Admissionregistration().V1().ValidatingWebhookConfigurations().Lister()
	describe := func(kind, config, name string, side *admissionregistrationv1.SideEffectClass, fp *admissionregistrationv1.FailurePolicyType, timeout *int32) string {
		d := fmt.Sprintf("admission webhook %q of %s %q", name, kind, config)
		var attrs []string
		if side != nil {
			attrs = append(attrs, "sideEffects "+string(*side))
		}
		if fp != nil {
			attrs = append(attrs, "failurePolicy "+string(*fp))
		}
		if timeout != nil {
			attrs = append(attrs, fmt.Sprintf("timeout %ds", *timeout))
		}
		if len(attrs) > 0 {
			d += " (" + strings.Join(attrs, ", ") + ")"
		}
		return d
	}
	return func(name string) string {
		if cs, err := mw.List(labels.Everything()); err == nil {
			for _, c := range cs {
				for _, w := range c.Webhooks {
					if w.Name == name {
						return describe("MutatingWebhookConfiguration", c.Name, name, w.SideEffects, w.FailurePolicy, w.TimeoutSeconds)
					}
				}
			}
		}
		if cs, err := vw.List(labels.Everything()); err == nil {
			for _, c := range cs {
				for _, w := range c.Webhooks {
					if w.Name == name {
						return describe("ValidatingWebhookConfiguration", c.Name, name, w.SideEffects, w.FailurePolicy, w.TimeoutSeconds)
					}
				}
			}
		}
		return fmt.Sprintf("admission webhook %q", name)
	}
}

// Webhook describes an admission webhook by name (its configuration,
// sideEffects, failurePolicy, timeout).
func (e *admissionExplainer) Webhook(name string) string { return e.describeWebhook(name) }
