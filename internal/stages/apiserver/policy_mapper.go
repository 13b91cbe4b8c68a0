package apiserver

import (
	"context"
	"fmt"
	"sync"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/initializer"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/clock"
)

// Admission plugins that find a resource by its kind (the policy plugins
// for a paramKind, OwnerReferencesPermissionEnforcement for an owner) use
// a REST mapper over discovery that AdmissionOptions.ApplyTo builds, and
// that kube-apiserver resets every 30 seconds from a post-start hook
// (start-apiserver-admission-initializer). The replay runs no post-start
// hooks, so the mapper ApplyTo built for it never learnt a kind served
// after its first lookup: a policy whose params are a custom resource
// created later failed to configure in the replay for good ("failed to
// find resource referenced by paramKind"), and was predicted to refuse
// what the apiserver admitted (probe E, 2026-12-06: 12 records, minutes
// after the CRD). kproxy gives those plugins a mapper of its own that
// reads discovery again when a kind is not found (at most every
// mapperRetry): it follows the kinds the apiserver serves, where the
// apiserver's lags up to 30 seconds. Within that lag of a change to a
// paramKind's CRD, whether the apiserver's policy could find its params is
// not known, and a prediction that depends on it says so (paramKindLag).

// mapperRetry is how often, at most, the replay's mapper reads discovery
// again for a kind it does not know: a policy whose paramKind is never
// served retries every second in the plugin, and kproxy must not load
// the apiserver with a discovery read each time.
const mapperRetry = 5 * time.Second

// apiserverMapperLag is how long after a CRD changes the apiserver's
// admission may still map its kinds as before: its 30-second reset, the
// policy source's retry a second later, and the clocks' and the
// discovery controller's slack.
const apiserverMapperLag = 40 * time.Second

// freshMapper is a DeferredDiscoveryRESTMapper that, not finding a kind,
// reads discovery again (at most every mapperRetry) and looks once more.
type freshMapper struct {
	*restmapper.DeferredDiscoveryRESTMapper
	clock clock.PassiveClock
	mu    sync.Mutex
	last  time.Time
}

func newFreshMapper(d discovery.DiscoveryInterface, clk clock.PassiveClock) *freshMapper {
	return &freshMapper{DeferredDiscoveryRESTMapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(d)), clock: clk}
}

// again resets the mapper for another look, unless it did so less than
// mapperRetry ago.
func (m *freshMapper) again(err error) bool {
	if err == nil || !meta.IsNoMatchError(err) {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	if !m.last.IsZero() && now.Sub(m.last) < mapperRetry {
		return false
	}
	m.last = now
	m.Reset()
	return true
}

func (m *freshMapper) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	mp, err := m.DeferredDiscoveryRESTMapper.RESTMapping(gk, versions...)
	if m.again(err) {
		mp, err = m.DeferredDiscoveryRESTMapper.RESTMapping(gk, versions...)
	}
	return mp, err
}

func (m *freshMapper) RESTMappings(gk schema.GroupKind, versions ...string) ([]*meta.RESTMapping, error) {
	mps, err := m.DeferredDiscoveryRESTMapper.RESTMappings(gk, versions...)
	if m.again(err) {
		mps, err = m.DeferredDiscoveryRESTMapper.RESTMappings(gk, versions...)
	}
	return mps, err
}

// Initialize gives the plugins that want a REST mapper this one; it runs
// after ApplyTo's initializers, so it replaces theirs.
func (m *freshMapper) Initialize(p admission.Interface) {
	if w, ok := p.(initializer.WantsRESTMapper); ok {
		w.SetRESTMapper(m)
	}
}

// paramKindLag says why the replay's verdict on a write (refused or
// admitted: r) may not be the apiserver's, or "": an admission policy
// whose rules select it takes its params from a custom resource whose
// CRD changed within apiserverMapperLag of the request's arrival (or
// after it), and the apiserver did not answer as the replay did.
func (p *paramReads) paramKindLag(ctx context.Context, r *Run, info *apirequest.RequestInfo, arrival time.Time) (stage, why string) {
	if p == nil || r.Read || arrival.IsZero() || len(p.policies) == 0 {
		return "", ""
	}
	selecting := p.selectingWithParams(info)
	if len(selecting) == 0 {
		return "", ""
	}
	if r.actual != nil {
		if aw, ok := r.actual(ctx); ok && aw.Status == r.Code {
			return "", "" // the apiserver answered as the replay did
		}
	}
	for _, s := range selecting {
		crd := p.crdOf(s.params)
		if crd == nil {
			continue
		}
		changed := lastChange(crd)
		if arrival.Sub(changed) >= apiserverMapperLag {
			continue
		}
		return s.stage, fmt.Sprintf("%s %q takes its params from %s, whose CustomResourceDefinition %s last changed at %s, %s before this request: "+
			"kube-apiserver's admission finds the kinds a change serves, or stops finding the ones it no longer serves, only when it next reads discovery "+
			"(every 30 s), so whether the policy could find its params when the request came is not known",
			s.kind, s.name, s.params.Kind+" "+s.params.GroupVersion().String(), crd.Name, changed.UTC().Format(time.RFC3339),
			arrival.Sub(changed).Round(time.Second))
	}
	return "", ""
}

// crdOf is the CustomResourceDefinition of a custom resource's kind, or
// nil (a built-in kind, or no such CRD now).
func (p *paramReads) crdOf(gvk schema.GroupVersionKind) *apiextensionsv1.CustomResourceDefinition {
	crds, err := p.crds.List(labels.Everything())
	if err != nil {
		return nil
	}
	for _, crd := range crds {
		if crd.Spec.Group == gvk.Group && crd.Spec.Names.Kind == gvk.Kind {
			return crd
		}
	}
	return nil
}

// lastChange is the last time a CRD changed as far as its object says, to
// the second: created, written by a manager, a condition moved.
func lastChange(crd *apiextensionsv1.CustomResourceDefinition) time.Time {
	t := crd.CreationTimestamp.Time
	for _, mf := range crd.ManagedFields {
		if mf.Time != nil && mf.Time.After(t) {
			t = mf.Time.Time
		}
	}
	for _, c := range crd.Status.Conditions {
		if c.LastTransitionTime.After(t) {
			t = c.LastTransitionTime.Time
		}
	}
	return t
}
