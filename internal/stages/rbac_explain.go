package stages

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	rbacv1helpers "k8s.io/kubernetes/pkg/apis/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// rbacExplainer writes what the RBAC authorizer does not say: every
// binding the subject has, the rules nearest to allowing the request and
// what each misses, bindings that almost apply, and the smallest Role and
// RoleBinding that would allow the request. It reads the same informers
// the replayed RBAC authorizer reads, and matches rules with RBAC's own
// helpers (rbacv1helpers), so "nearest" means what RBAC would check.
type rbacExplainer struct{ s *apiserver.ClusterState }

// binding is a RoleBinding or ClusterRoleBinding, flattened.
type binding struct {
	kind, namespace, name string
	roleRef               rbacv1.RoleRef
	subjects              []rbacv1.Subject
}

func (b binding) String() string {
	if b.namespace != "" {
		return fmt.Sprintf("%s %s/%s", b.kind, b.namespace, b.name)
	}
	return fmt.Sprintf("%s %s", b.kind, b.name)
}

// miss is one rule and what it lacks for the request.
type miss struct {
	via     string // the binding and role the rule comes from
	rule    rbacv1.PolicyRule
	missing []string
}

// missScore ranks rules by how far they are from allowing the request: a
// rule for the right resource with the wrong verb or name is nearer than
// a rule for another resource.
func missScore(m miss) int {
	score := 0
	for _, s := range m.missing {
		switch {
		case strings.HasPrefix(s, "resource "), strings.HasPrefix(s, "nonResourceURL"):
			score += 4
		case strings.HasPrefix(s, "apiGroup"):
			score += 3
		default: // verb, subresource, name
			score++
		}
	}
	return score
}

func (e rbacExplainer) explainDeny(u user.Info, a authorizer.Attributes) string {
	if e.s == nil || u == nil || a == nil {
		return ""
	}
	all := e.bindings()
	var mine, elsewhere, otherSubjects []string
	var misses []miss
	for _, b := range all {
		rules, roleErr := e.rules(b)
		applies := false
		for _, s := range b.subjects {
			if subjectMatches(u, s, b.namespace) {
				applies = true
			}
		}
		inScope := b.namespace == "" || b.namespace == a.GetNamespace()
		switch {
		case applies && inScope:
			line := fmt.Sprintf("%s -> %s %s", b, b.roleRef.Kind, b.roleRef.Name)
			if roleErr != nil {
				line += " (" + roleErr.Error() + ")"
			}
			mine = append(mine, line)
			for _, rule := range rules {
				misses = append(misses, miss{via: fmt.Sprintf("%s %s via %s", b.roleRef.Kind, b.roleRef.Name, b), rule: rule, missing: ruleMisses(a, rule)})
			}
		case applies && !inScope && allowsAny(a, rules):
			elsewhere = append(elsewhere, fmt.Sprintf("%s grants this in namespace %q, not %q", b, b.namespace, a.GetNamespace()))
		case !applies && inScope && allowsAny(a, rules) && hint(b, rules) && len(otherSubjects) < 3:
			otherSubjects = append(otherSubjects, fmt.Sprintf("%s grants this to %s, and %s is none of them", b, describeSubjects(b.subjects), u.GetName()))
		}
	}

	var out strings.Builder
	if len(mine) == 0 {
		fmt.Fprintf(&out, "\n%s has no RoleBinding or ClusterRoleBinding in scope", u.GetName())
	} else {
		fmt.Fprintf(&out, "\nbindings of %s in scope:\n  %s", u.GetName(), strings.Join(mine, "\n  "))
	}
	sort.SliceStable(misses, func(i, j int) bool { return missScore(misses[i]) < missScore(misses[j]) })
	if len(misses) > 0 {
		out.WriteString("\nnearest rules:")
		for i, m := range misses {
			if i == 5 {
				fmt.Fprintf(&out, "\n  (%d more)", len(misses)-5)
				break
			}
			fmt.Fprintf(&out, "\n  %s: %s misses %s", m.via, describeRule(m.rule), strings.Join(m.missing, ", "))
		}
	}
	for _, s := range append(elsewhere, otherSubjects...) {
		out.WriteString("\nalmost: " + s)
	}
	if fix := smallestGrant(u, a); fix != "" {
		out.WriteString("\nthe smallest grant that allows it:\n" + fix)
	}
	return out.String()
}

// hint reports whether another subject's binding is worth naming: not the
// superuser roles or the system's own bindings, which grant everything to
// someone and would drown the useful lines.
func hint(b binding, rules []rbacv1.PolicyRule) bool {
	if len(b.subjects) == 0 {
		return false
	}
	for _, r := range rules {
		if slices.Contains(r.Resources, "*") || slices.Contains(r.NonResourceURLs, "*") {
			return false // broad roles (cluster-admin, readers of everything)
		}
	}
	for _, s := range b.subjects {
		if !strings.HasPrefix(s.Name, "system:") && (s.Kind != rbacv1.ServiceAccountKind || s.Namespace != "kube-system") {
			return true
		}
	}
	return false
}

// allowedBy parses the RBAC authorizer's allow reason:
// RBAC: allowed by RoleBinding "name/namespace" of Role "role" to User "x".
var allowedBy = regexp.MustCompile(`^RBAC: allowed by (ClusterRoleBinding|RoleBinding) "([^"]+)" of (ClusterRole|Role) "([^"]+)"`)

// explainAllow names the rules that allow the request in the binding the
// RBAC authorizer names in its reason (it stops at the first one). It is
// on every allowed request's path, so it looks up that one role only.
func (e rbacExplainer) explainAllow(reason string, a authorizer.Attributes) string {
	m := allowedBy.FindStringSubmatch(reason)
	if e.s == nil || a == nil || m == nil {
		return ""
	}
	b := binding{kind: m[1], name: m[2], roleRef: rbacv1.RoleRef{Kind: m[3], Name: m[4]}}
	if b.kind == "RoleBinding" {
		b.name, b.namespace, _ = strings.Cut(m[2], "/")
	}
	rules, err := e.rules(b)
	if err != nil {
		return ""
	}
	var lines []string
	for _, r := range rules {
		if len(ruleMisses(a, r)) == 0 {
			lines = append(lines, fmt.Sprintf("%s %s via %s: %s", b.roleRef.Kind, b.roleRef.Name, b, describeRule(r)))
		}
	}
	if len(lines) == 0 {
		return ""
	}
	return "\nthe rule that allows it:\n  " + strings.Join(lines, "\n  ")
}

// bindings lists every ClusterRoleBinding and RoleBinding, sorted.
func (e rbacExplainer) bindings() []binding {
	r := e.s.Informers.Rbac().V1()
	var all []binding
	if crbs, err := r.ClusterRoleBindings().Lister().List(labels.Everything()); err == nil {
		for _, b := range crbs {
			all = append(all, binding{"ClusterRoleBinding", "", b.Name, b.RoleRef, b.Subjects})
		}
	}
	if rbs, err := r.RoleBindings().Lister().List(labels.Everything()); err == nil {
		for _, b := range rbs {
			all = append(all, binding{"RoleBinding", b.Namespace, b.Name, b.RoleRef, b.Subjects})
		}
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].kind != all[j].kind {
			return all[i].kind < all[j].kind
		}
		if all[i].namespace != all[j].namespace {
			return all[i].namespace < all[j].namespace
		}
		return all[i].name < all[j].name
	})
	return all
}

// rules resolves a binding's role, saying so when it does not exist.
func (e rbacExplainer) rules(b binding) ([]rbacv1.PolicyRule, error) {
	r := e.s.Informers.Rbac().V1()
	switch b.roleRef.Kind {
	case "ClusterRole":
		cr, err := r.ClusterRoles().Lister().Get(b.roleRef.Name)
		if err != nil {
			return nil, fmt.Errorf("ClusterRole %q not found", b.roleRef.Name)
		}
		return cr.Rules, nil
	case "Role":
		role, err := r.Roles().Lister().Roles(b.namespace).Get(b.roleRef.Name)
		if err != nil {
			return nil, fmt.Errorf("Role %s/%s not found", b.namespace, b.roleRef.Name) //nolint:staticcheck // "Role" is the kind, as in the explanation
		}
		return role.Rules, nil
	}
	return nil, fmt.Errorf("unknown roleRef kind %q", b.roleRef.Kind)
}

// subjectMatches is RBAC's appliesToUser.
func subjectMatches(u user.Info, s rbacv1.Subject, bindingNamespace string) bool {
	switch s.Kind {
	case rbacv1.UserKind:
		return u.GetName() == s.Name
	case rbacv1.GroupKind:
		for _, g := range u.GetGroups() {
			if g == s.Name {
				return true
			}
		}
	case rbacv1.ServiceAccountKind:
		ns := s.Namespace
		if ns == "" {
			ns = bindingNamespace
		}
		return serviceaccount.MakeUsername(ns, s.Name) == u.GetName()
	}
	return false
}

// ruleMisses lists what a rule lacks to allow the request, checked with
// RBAC's own matching helpers.
func ruleMisses(a authorizer.Attributes, rule rbacv1.PolicyRule) []string {
	var m []string
	if !rbacv1helpers.VerbMatches(&rule, a.GetVerb()) {
		m = append(m, fmt.Sprintf("verb %q", a.GetVerb()))
	}
	if a.IsResourceRequest() && len(rule.Resources) == 0 && len(rule.NonResourceURLs) > 0 {
		return append(m, "resource: the rule is for non-resource URLs only")
	}
	if !a.IsResourceRequest() {
		if len(rule.NonResourceURLs) == 0 {
			return append(m, fmt.Sprintf("nonResourceURL %q: the rule is for resources only", a.GetPath()))
		}
		if !rbacv1helpers.NonResourceURLMatches(&rule, a.GetPath()) {
			m = append(m, fmt.Sprintf("nonResourceURL %q", a.GetPath()))
		}
		return m
	}
	if !rbacv1helpers.APIGroupMatches(&rule, a.GetAPIGroup()) {
		m = append(m, fmt.Sprintf("apiGroup %q", a.GetAPIGroup()))
	}
	combined := a.GetResource()
	if a.GetSubresource() != "" {
		combined += "/" + a.GetSubresource()
	}
	if !rbacv1helpers.ResourceMatches(&rule, combined, a.GetSubresource()) {
		if a.GetSubresource() != "" && rbacv1helpers.ResourceMatches(&rule, a.GetResource(), "") {
			m = append(m, fmt.Sprintf("subresource %q", combined))
		} else {
			m = append(m, fmt.Sprintf("resource %q", combined))
		}
	}
	if !rbacv1helpers.ResourceNameMatches(&rule, a.GetName()) {
		if a.GetName() == "" {
			m = append(m, fmt.Sprintf("a name: it is limited to resourceNames %v, and %s names none", rule.ResourceNames, a.GetVerb()))
		} else {
			m = append(m, fmt.Sprintf("resourceName %q", a.GetName()))
		}
	}
	return m
}

func allowsAny(a authorizer.Attributes, rules []rbacv1.PolicyRule) bool {
	for _, r := range rules {
		if len(ruleMisses(a, r)) == 0 {
			return true
		}
	}
	return false
}

func describeRule(r rbacv1.PolicyRule) string {
	var parts []string
	if len(r.NonResourceURLs) > 0 {
		parts = append(parts, fmt.Sprintf("nonResourceURLs %v", r.NonResourceURLs))
	} else {
		parts = append(parts, fmt.Sprintf("apiGroups %q resources %v", r.APIGroups, r.Resources))
	}
	if len(r.ResourceNames) > 0 {
		parts = append(parts, fmt.Sprintf("resourceNames %v", r.ResourceNames))
	}
	parts = append(parts, fmt.Sprintf("verbs %v", r.Verbs))
	return "{" + strings.Join(parts, " ") + "}"
}

func describeSubjects(ss []rbacv1.Subject) string {
	var out []string
	for _, s := range ss {
		if s.Kind == rbacv1.ServiceAccountKind {
			out = append(out, fmt.Sprintf("ServiceAccount %s/%s", s.Namespace, s.Name))
			continue
		}
		out = append(out, s.Kind+" "+s.Name)
	}
	return strings.Join(out, ", ")
}

// smallestGrant is a Role and RoleBinding (or ClusterRole and
// ClusterRoleBinding for cluster-scoped and non-resource requests) that
// allow exactly this request, as YAML ready to apply.
func smallestGrant(u user.Info, a authorizer.Attributes) string {
	subject, ok := subjectFor(u)
	if !ok {
		return ""
	}
	rule := rbacv1.PolicyRule{Verbs: []string{a.GetVerb()}}
	if a.IsResourceRequest() {
		res := a.GetResource()
		if a.GetSubresource() != "" {
			res += "/" + a.GetSubresource()
		}
		rule.APIGroups, rule.Resources = []string{a.GetAPIGroup()}, []string{res}
		if a.GetName() != "" {
			rule.ResourceNames = []string{a.GetName()}
		}
	} else {
		rule.NonResourceURLs = []string{a.GetPath()}
	}
	name := fmt.Sprintf("allow-%s-%s", sanitize(u.GetName()), sanitize(a.GetVerb()+"-"+firstNonEmpty(a.GetResource(), "nonresource")))
	namespaced := a.IsResourceRequest() && a.GetNamespace() != ""
	var role, bind any
	if namespaced {
		role = &rbacv1.Role{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: a.GetNamespace()}, Rules: []rbacv1.PolicyRule{rule}}
		bind = &rbacv1.RoleBinding{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: a.GetNamespace()},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}, Subjects: []rbacv1.Subject{subject}}
	} else {
		role = &rbacv1.ClusterRole{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
			ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{rule}}
		bind = &rbacv1.ClusterRoleBinding{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}, Subjects: []rbacv1.Subject{subject}}
	}
	var docs []string
	for _, o := range []any{role, bind} {
		b, err := yaml.Marshal(o)
		if err != nil {
			return ""
		}
		// creationTimestamp: null is noise in a manifest to apply.
		docs = append(docs, strings.ReplaceAll(string(b), "  creationTimestamp: null\n", ""))
	}
	return "---\n" + strings.Join(docs, "---\n")
}

// subjectFor is the RBAC subject naming u: a ServiceAccount for service
// account users, else the User (never a group: grant the caller only).
func subjectFor(u user.Info) (rbacv1.Subject, bool) {
	if ns, name, err := serviceaccount.SplitUsername(u.GetName()); err == nil {
		return rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}, true
	}
	if u.GetName() == "" || u.GetName() == user.Anonymous {
		return rbacv1.Subject{}, false // granting anonymous access is not a fix to suggest
	}
	return rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: u.GetName()}, true
}

func sanitize(s string) string {
	s = strings.ToLower(s)
	var b strings.Builder
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			b.WriteRune(r)
		default:
			b.WriteRune('-')
		}
	}
	return strings.Trim(b.String(), "-")
}

func firstNonEmpty(v ...string) string {
	for _, s := range v {
		if s != "" {
			return s
		}
	}
	return ""
}
