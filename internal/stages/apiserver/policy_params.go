package apiserver

import (
	"context"
	"fmt"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiextensionslisters "k8s.io/apiextensions-apiserver/pkg/client/listers/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/policy/generic"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/predicates/rules"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/informers"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	"github.com/kproxy/kproxy/internal/record"
)

// An admission policy with a paramKind reads its params from an informer
// the policy plugin starts when it loads the policy, and waits at most a
// second for it to sync before it gives up on the binding: "paramKind
// kind ... not yet synced to use for admission", a configuration error
// its failurePolicy turns into a refusal (Fail) or nothing (Ignore). The
// apiserver's informer lists with the apiserver's own rights and has
// long synced; the replay's may never sync (a snapshot that holds only
// some objects of the kind; a kproxy identity that may not list it) or
// not yet (a policy loaded just now, a large kind). Either way the
// replay's refusal is about kproxy's state, not the request's.

// paramsNotSynced matches the policy plugins' error for a param informer
// that has not synced (generic.CollectParams, v1.37), and captures the
// paramKind it names.
var paramsNotSynced = regexp.MustCompile("paramKind kind `([^`]*)` not yet synced to use for admission")

// paramsUnsyncedHere says why the replay's refusal for an admission
// policy whose params the replay could not read is not the request's,
// or "": the refusal, or one of its causes, is that error, and the
// apiserver did not answer the same.
func (r *Run) paramsUnsyncedHere(ctx context.Context) string {
	if r.Status == nil {
		return ""
	}
	kind := paramsUnsyncedIn(r.Status)
	if kind == "" {
		return ""
	}
	if r.actual != nil {
		if aw, ok := r.actual(ctx); ok && aw.Refusal != nil && aw.Status == r.Code && aw.Refusal.Message == r.Status.Message {
			return "" // the apiserver's params had not synced either
		}
	}
	return fmt.Sprintf("an admission policy's params (%s) had not synced in kproxy's replay, so the policy could not be evaluated "+
		"(kproxy may not list them, or the snapshot holds only some of them); the apiserver evaluates it with its own", kind)
}

// paramsUnsyncedIn is the paramKind a refusal's message or causes say
// has not synced, or "".
func paramsUnsyncedIn(st *metav1.Status) string {
	if m := paramsNotSynced.FindStringSubmatch(st.Message); m != nil {
		return paramKindString(m[1])
	}
	if st.Details != nil {
		for _, c := range st.Details.Causes {
			if m := paramsNotSynced.FindStringSubmatch(c.Message); m != nil {
				return paramKindString(m[1])
			}
		}
	}
	return ""
}

// paramKindString is "ConfigMap v1" for the way the error prints a
// ParamKind ("&ParamKind{APIVersion:v1,Kind:ConfigMap,}").
func paramKindString(s string) string {
	if m := printedParamKind.FindStringSubmatch(s); m != nil {
		return m[2] + " " + m[1]
	}
	return s
}

var printedParamKind = regexp.MustCompile(`^&ParamKind\{APIVersion:([^,]*),Kind:([^,]*),\}$`)

// A policy whose failurePolicy is Ignore says nothing when its params
// have not synced: the plugin skips it, and the replay admits what the
// apiserver, reading its params, may refuse. So where the replay admits
// a write that such a policy's rules select, and its params have not
// synced in the replay, the admission is not the request's: unless the
// apiserver admitted it too, the prediction is unknown, naming the policy.
// The policy plugins' informers are not reachable from here; their sync
// is read where they live: a built-in kind's informer is the shared
// factory's (the plugin asks the factory first), a custom resource's is a
// dynamic informer over the replay's dynamic client, whose lists kproxy
// sees go by (listOutcomes).

// paramReads reads the admission policies the replay's plugins load, and
// whether their params have synced.
type paramReads struct {
	typed informers.SharedInformerFactory
	crds  apiextensionslisters.CustomResourceDefinitionLister
	lists *listOutcomes
	// policies are the enabled policy plugins' (none: both are off).
	policies []policyKind
}

// policyKind is one policy plugin's policies and bindings, read through
// the plugins' own accessors.
type policyKind struct {
	stage, kind string
	policies    func() []generic.PolicyAccessor
	bindings    func() []generic.BindingAccessor
}

// newParamReads rides on the informers the policy plugins registered.
func newParamReads(f informers.SharedInformerFactory, crds apiextensionslisters.CustomResourceDefinitionLister, lists *listOutcomes, plugins []string) *paramReads {
	p := &paramReads{typed: f, crds: crds, lists: lists}
	adm := f.Admissionregistration().V1()
	if slices.Contains(plugins, "ValidatingAdmissionPolicy") {
		pl, bl := adm.ValidatingAdmissionPolicies().Lister(), adm.ValidatingAdmissionPolicyBindings().Lister()
		p.policies = append(p.policies, policyKind{record.StageValidatingAdmission, "ValidatingAdmissionPolicy",
			func() []generic.PolicyAccessor {
				return accessors(pl.List, validating.NewValidatingAdmissionPolicyAccessor)
			},
			func() []generic.BindingAccessor {
				return accessors(bl.List, validating.NewValidatingAdmissionPolicyBindingAccessor)
			}})
	}
	if slices.Contains(plugins, "MutatingAdmissionPolicy") {
		pl, bl := adm.MutatingAdmissionPolicies().Lister(), adm.MutatingAdmissionPolicyBindings().Lister()
		p.policies = append(p.policies, policyKind{record.StageMutatingAdmission, "MutatingAdmissionPolicy",
			func() []generic.PolicyAccessor {
				return accessors(pl.List, mutating.NewMutatingAdmissionPolicyAccessor)
			},
			func() []generic.BindingAccessor {
				return accessors(bl.List, mutating.NewMutatingAdmissionPolicyBindingAccessor)
			}})
	}
	return p
}

// accessors lists objects and wraps each in its accessor.
func accessors[T, A any](list func(labels.Selector) ([]T, error), wrap func(T) A) []A {
	objs, err := list(labels.Everything())
	if err != nil {
		return nil
	}
	out := make([]A, len(objs))
	for i, o := range objs {
		out[i] = wrap(o)
	}
	return out
}

// skippedPolicy is an Ignore policy with params whose rules select the
// request.
type skippedPolicy struct {
	stage, kind, name string
	params            schema.GroupVersionKind
	// refs are the paramRefs of the policy's bindings.
	refs []*admissionregistrationv1.ParamRef
}

// skipped says why the replay's admission of a write (info) is not the
// request's, or "": a policy with failurePolicy Ignore selects it, and
// its params have not synced in the replay. Where the apiserver's answer
// is known, only if it refused the write.
func (p *paramReads) skipped(ctx context.Context, r *Run, info *apirequest.RequestInfo) (stage, why string) {
	if p == nil || r.Read || r.Status != nil {
		return "", ""
	}
	for _, s := range p.ignoredWithParams(info) {
		if p.paramsSynced(s.params) {
			continue
		}
		if r.actual != nil {
			aw, ok := r.actual(ctx)
			if ok && aw.Refusal == nil {
				return "", "" // the apiserver admitted it too
			}
		}
		return s.stage, fmt.Sprintf("%s %q (failurePolicy Ignore) selects this write and takes its params from %s, which had not synced in kproxy's replay "+
			"(kproxy may not list them, or the snapshot holds only some of them): the replay's plugin skipped the policy, "+
			"and the apiserver evaluates it with its params", s.kind, s.name, s.params.Kind+" "+s.params.GroupVersion().String())
	}
	return "", ""
}

// ignoredWithParams are the policies with failurePolicy Ignore, a
// paramKind and a binding with a paramRef, whose resource rules select
// the request. Only the rules: a namespace or object selector, a match
// condition or an exclusion may leave it out, which only makes the
// check say unknown where it could have said more.
func (p *paramReads) ignoredWithParams(info *apirequest.RequestInfo) []skippedPolicy {
	return p.withParams(info, true)
}

// selectingWithParams are the policies with a paramKind and a binding,
// whose resource rules select the request (as ignoredWithParams, any
// failurePolicy).
func (p *paramReads) selectingWithParams(info *apirequest.RequestInfo) []skippedPolicy {
	return p.withParams(info, false)
}

func (p *paramReads) withParams(info *apirequest.RequestInfo, ignoredOnly bool) []skippedPolicy {
	op, ok := admissionOperation(info.Verb)
	if !ok {
		return nil
	}
	var out []skippedPolicy
	var attr admission.Attributes // built for the first policy that may skip
	selects := func(mc *admissionregistrationv1.MatchResources) bool {
		if mc == nil {
			return false
		}
		if attr == nil {
			attr = admission.NewAttributesRecord(nil, nil, schema.GroupVersionKind{}, info.Namespace, info.Name,
				schema.GroupVersionResource{Group: info.APIGroup, Version: info.APIVersion, Resource: info.Resource}, info.Subresource, op, nil, false, nil)
		}
		return slices.ContainsFunc(mc.ResourceRules, func(rule admissionregistrationv1.NamedRuleWithOperations) bool {
			return (&rules.Matcher{Rule: rule.RuleWithOperations, Attr: attr}).Matches()
		})
	}
	for _, k := range p.policies {
		var bound map[string]bool // policy name: bound with a paramRef; listed once
		var refs map[string][]*admissionregistrationv1.ParamRef
		for _, pol := range k.policies() {
			fp := pol.GetFailurePolicy()
			if pol.GetParamKind() == nil || (ignoredOnly && (fp == nil || *fp != admissionregistrationv1.Ignore)) || !selects(pol.GetMatchConstraints()) {
				continue
			}
			if bound == nil {
				bound = map[string]bool{}
				refs = map[string][]*admissionregistrationv1.ParamRef{}
				for _, b := range k.bindings() {
					name := b.GetPolicyName().Name
					bound[name] = bound[name] || b.GetParamRef() != nil
					if ref := b.GetParamRef(); ref != nil {
						refs[name] = append(refs[name], ref)
					}
				}
			}
			withRef, ok := bound[pol.GetName()]
			if gvk, okKind := paramGVK(pol.GetParamKind()); okKind && ok && (withRef || !ignoredOnly) {
				out = append(out, skippedPolicy{k.stage, k.kind, pol.GetName(), gvk, refs[pol.GetName()]})
			}
		}
	}
	return out
}

// paramsSynced reports whether the replay's informer of a param kind has
// synced: a built-in kind's in the shared factory, a custom resource's by
// its list through the dynamic client.
func (p *paramReads) paramsSynced(gvk schema.GroupVersionKind) bool {
	if obj, err := clientgoscheme.Scheme.New(gvk); err == nil {
		return p.typed.WaitForCacheSync(closed)[reflect.TypeOf(obj)]
	}
	if crd := p.crdOf(gvk); crd != nil {
		return p.lists.listed("/apis/" + gvk.Group + "/" + gvk.Version + "/" + crd.Spec.Names.Plural)
	}
	return false
}

func paramGVK(k *admissionregistrationv1.ParamKind) (schema.GroupVersionKind, bool) {
	gv, err := schema.ParseGroupVersion(k.APIVersion)
	if err != nil || k.Kind == "" {
		return schema.GroupVersionKind{}, false
	}
	return gv.WithKind(k.Kind), true
}

// admissionOperation is the admission operation of a write verb. A patch
// may create (server-side apply): it is matched as an update, and rules
// for CREATE alone miss it; nothing else depends on it.
func admissionOperation(verb string) (admission.Operation, bool) {
	switch verb {
	case "create":
		return admission.Create, true
	case "update", "patch":
		return admission.Update, true
	case "delete", "deletecollection":
		return admission.Delete, true
	}
	return "", false
}

// listOutcomes are the lists of whole collections the replay's dynamic
// client made, by path, and whether the last one succeeded: a dynamic
// informer has synced once its list did.
type listOutcomes struct{ ok sync.Map }

func (l *listOutcomes) listed(path string) bool {
	v, ok := l.ok.Load(path)
	return ok && v.(bool)
}

// wrap observes rt's answers to lists (and watch-lists).
func (l *listOutcomes) wrap(rt http.RoundTripper) http.RoundTripper {
	return listObserver{rt: rt, l: l}
}

type listObserver struct {
	rt http.RoundTripper
	l  *listOutcomes
}

func (o listObserver) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := o.rt.RoundTrip(req)
	if req.Method == http.MethodGet && collectionPath(req.URL.Path) {
		q := req.URL.Query()
		if q.Get("watch") != "true" || q.Get("sendInitialEvents") == "true" {
			o.l.ok.Store(req.URL.Path, err == nil && resp.StatusCode < 300)
		}
	}
	return resp, err
}

// collectionPath: /api/v1/R or /apis/G/V/R, all namespaces.
func collectionPath(p string) bool {
	parts := strings.Split(strings.Trim(p, "/"), "/")
	return (len(parts) == 3 && parts[0] == "api") || (len(parts) == 4 && parts[0] == "apis")
}

// A write to a policy's params is judged by the policy with the params
// it replaces: the apiserver's plugin reads them from its informer on the
// request's way, before the write lands, and the replay's informer may
// already hold the write (the replay of a write runs as it is answered).
// A patch raising the limit a ConfigMap of params sets, a delete of the
// params a binding with parameterNotFoundAction Deny names, a patch of
// the value a MutatingAdmissionPolicy copies into a label: the apiserver
// admitted each, the replay's policy refused it (found by a probe). The
// plugin's informers are its own, so the replay cannot read the params
// as they were before; where the two answers differ, it says so.

// paramsWritten says why the replay's verdict on a write of an object of
// a kind that an admission policy selecting the write takes its params
// from is not the request's, or "": the apiserver answered otherwise.
func (p *paramReads) paramsWritten(ctx context.Context, r *Run, info *apirequest.RequestInfo) (stage, why string) {
	if p == nil || r.Read || r.actual == nil || info == nil || !info.IsResourceRequest || info.Subresource != "" || len(p.policies) == 0 {
		return "", ""
	}
	for _, s := range p.selectingWithParams(info) {
		if s.params.Group != info.APIGroup || p.resourceOf(s.params) != info.Resource || !slices.ContainsFunc(s.refs, func(ref *admissionregistrationv1.ParamRef) bool {
			return mayName(ref, info)
		}) {
			continue
		}
		aw, ok := r.answeredOtherwise(ctx)
		if !ok {
			return "", ""
		}
		replay := fmt.Sprintf("admits it (%d)", r.Code)
		if r.Status != nil {
			replay = fmt.Sprintf("refuses it (%d: %s)", r.Code, r.Status.Message)
		}
		answered := fmt.Sprintf("admitted it (%d)", aw.Status)
		if aw.Refusal != nil {
			answered = fmt.Sprintf("refused it (%d: %s)", aw.Status, aw.Refusal.Message)
		}
		return s.stage, fmt.Sprintf("this write changes a %s, the kind %s %q takes its params from: the apiserver %s, its policy reading the params "+
			"as they were before this write, and kproxy's replay %s, its policy reading them after (this write's own change, or a later one), "+
			"so the params the request met, and its outcome, are not known",
			s.params.Kind, s.kind, s.name, answered, replay)
	}
	return "", ""
}

// mayName reports whether a binding's paramRef may name the object the
// request writes: by its name (and namespace, where the ref names one;
// one that names none takes the request's namespace), or by a selector
// (its labels, before or after the write, are not read here).
func mayName(ref *admissionregistrationv1.ParamRef, info *apirequest.RequestInfo) bool {
	if ref.Name == "" {
		return ref.Selector != nil
	}
	return ref.Name == info.Name && (ref.Namespace == "" || ref.Namespace == info.Namespace)
}

// resourceOf is the resource (plural) of a param kind: a custom
// resource's as its CustomResourceDefinition names it, a built-in kind's
// as the apiserver names its kinds' resources.
func (p *paramReads) resourceOf(gvk schema.GroupVersionKind) string {
	if crd := p.crdOf(gvk); crd != nil {
		return crd.Spec.Names.Plural
	}
	plural, _ := meta.UnsafeGuessKindToResource(gvk)
	return plural.Resource
}
