package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"regexp"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/mutating"
	auditinternal "k8s.io/apiserver/pkg/apis/audit"
	"k8s.io/kubernetes/pkg/api/legacyscheme"

	"github.com/kproxy/kproxy/internal/record"
)

// The admission decorators: the replay sees the admission chain go by
// through two wrappers. phaseMarker wraps the whole chain and marks where
// the handler is; observedPlugin wraps each plugin and keeps its time,
// verdict and mutation. The interface guards make an upstream change of
// the admission interfaces a build failure here, rather than a decorator
// silently dropped.
var (
	_ admission.MutationInterface   = (*phaseMarker)(nil)
	_ admission.ValidationInterface = (*phaseMarker)(nil)
	_ admission.MutationInterface   = (*observedPlugin)(nil)
	_ admission.ValidationInterface = (*observedPlugin)(nil)
	_ admission.Attributes          = (*webhookCalls)(nil)
)

// phaseMarker wraps the admission chain to mark where the handler is:
// mutating admission begins with Admit, the strategy's validation follows
// it, validating admission is Validate, and storage comes after.
type phaseMarker struct{ inner admission.Interface }

func (p *phaseMarker) Handles(op admission.Operation) bool { return p.inner.Handles(op) }

func (p *phaseMarker) Admit(ctx context.Context, a admission.Attributes, o admission.ObjectInterfaces) error {
	r := runFrom(ctx)
	if r != nil {
		r.enter(PhaseMutating)
		r.noteSecrets(a)
	}
	var err error
	if m, ok := p.inner.(admission.MutationInterface); ok {
		err = m.Admit(ctx, a, o)
	}
	if r != nil && err == nil {
		r.enter(PhaseValidation)
	}
	return err
}

func (p *phaseMarker) Validate(ctx context.Context, a admission.Attributes, o admission.ObjectInterfaces) error {
	r := runFrom(ctx)
	if r != nil {
		r.enter(PhaseValidating)
		r.noteSecrets(a)
	}
	var err error
	if v, ok := p.inner.(admission.ValidationInterface); ok {
		err = v.Validate(ctx, a, o)
	}
	if r != nil && err == nil {
		r.enter(PhaseStorage)
	}
	return err
}

// observedPlugin is the decorator around each admission plugin: it times
// the plugin's call, keeps its verdict and, for a mutating plugin, what it
// changed in the object.
type observedPlugin struct {
	inner admission.Interface
	name  string
	// webhook describes an admission webhook by name (its configuration,
	// sideEffects, failurePolicy, timeout); nil for other plugins.
	webhook func(name string) string
	// explain adds what the plugin's refusal leaves out.
	explain PluginExplainer
}

func (p *observedPlugin) Handles(op admission.Operation) bool { return p.inner.Handles(op) }

func (p *observedPlugin) Admit(ctx context.Context, a admission.Attributes, o admission.ObjectInterfaces) error {
	m, ok := p.inner.(admission.MutationInterface)
	if !ok {
		return nil
	}
	a = connectAsDryRun(a)
	r := runFrom(ctx)
	a = asSent(a, r, p.name)
	if r == nil {
		return m.Admit(ctx, a, o)
	}
	// Most plugins change nothing: compare copies, and encode for the
	// patch only when something changed. reflect.DeepEqual is much cheaper
	// than equality.Semantic; what it calls different but is the same
	// (quantities spelled alike) encodes to the same JSON and gets no patch.
	var before runtime.Object
	if obj := a.GetObject(); obj != nil {
		before = obj.DeepCopyObject()
	}
	var calls *webhookCalls
	if p.webhook != nil {
		calls = &webhookCalls{Attributes: a}
		a = calls
	}
	c := PluginCall{Name: p.name, Start: r.now()}
	c.Err = m.Admit(ctx, a, o)
	c.End = r.now()
	if calls != nil {
		c.Webhooks = calls.list()
	}
	p.noticeSideEffects(r, record.StageMutatingAdmission, c.Err)
	c.Detail = p.explain.Explain(p.name, a, c.Err)
	if after := a.GetObject(); before != nil && after != nil && !reflect.DeepEqual(before, after) {
		if b, a := objectJSON(before), objectJSON(after); b != nil && a != nil && !bytes.Equal(b, a) {
			c.Patch = jsonPatch(b, a)
		}
	}
	r.addPlugin(c)
	return c.Err
}

func (p *observedPlugin) Validate(ctx context.Context, a admission.Attributes, o admission.ObjectInterfaces) error {
	v, ok := p.inner.(admission.ValidationInterface)
	if !ok {
		return nil
	}
	a = connectAsDryRun(a)
	r := runFrom(ctx)
	a = asSent(a, r, p.name)
	if r == nil {
		return v.Validate(ctx, a, o)
	}
	c := PluginCall{Name: p.name, Validating: true, Start: r.now()}
	c.Err = v.Validate(ctx, a, o)
	c.End = r.now()
	p.noticeSideEffects(r, record.StageValidatingAdmission, c.Err)
	c.Detail = p.explain.Explain(p.name, a, c.Err)
	r.addPlugin(c)
	return c.Err
}

// dryRunUnsupported is the webhook dispatchers' refusal to call a webhook
// with side effects in dry run.
var dryRunUnsupported = regexp.MustCompile(`admission webhook "([^"]+)" does not support dry run`)

// noticeSideEffects makes the run unknown when the replay (always a dry
// run) could not call a webhook that the real, non-dry-run request does
// call: kproxy never calls a webhook that declares side effects.
func (p *observedPlugin) noticeSideEffects(r *Run, stage string, err error) {
	if err == nil || r.DryRun || p.webhook == nil {
		return
	}
	m := dryRunUnsupported.FindStringSubmatch(err.Error())
	if m == nil {
		return
	}
	r.markUnknownAt(stage, "depends on "+p.webhook(m[1])+": it declares side effects, and kproxy calls webhooks only in dry run")
}

// objectJSON is the object as JSON in its external version, for diffs.
func objectJSON(obj runtime.Object) []byte {
	if obj == nil {
		return nil
	}
	gvks, _, err := legacyscheme.Scheme.ObjectKinds(obj)
	if err != nil || len(gvks) == 0 {
		return nil
	}
	gv := gvks[0].GroupVersion()
	if gv.Version == runtime.APIVersionInternal {
		if vs := legacyscheme.Scheme.PrioritizedVersionsForGroup(gv.Group); len(vs) > 0 {
			gv = vs[0]
		}
	}
	b, err := runtime.Encode(legacyscheme.Codecs.LegacyCodec(gv), obj)
	if err != nil {
		return nil
	}
	return b
}

// webhookCalls notes the mutating webhooks the dispatcher calls, from the
// audit annotation it adds for each call (mutation.webhook.admission.k8s.io/
// round_R_index_I: the configuration, the webhook, whether it mutated),
// and passes every annotation on.
type webhookCalls struct {
	admission.Attributes
	mu    sync.Mutex
	calls []CalledWebhook
}

func (w *webhookCalls) AddAnnotation(key, value string) error {
	w.note(key, value)
	return w.Attributes.AddAnnotation(key, value)
}

func (w *webhookCalls) AddAnnotationWithLevel(key, value string, level auditinternal.Level) error {
	w.note(key, value)
	return w.Attributes.AddAnnotationWithLevel(key, value, level)
}

func (w *webhookCalls) note(key, value string) {
	if !strings.HasPrefix(key, mutating.MutationAuditAnnotationPrefix) {
		return
	}
	var v struct {
		Configuration string `json:"configuration"`
		Webhook       string `json:"webhook"`
		Mutated       bool   `json:"mutated"`
	}
	if json.Unmarshal([]byte(value), &v) != nil || v.Webhook == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls = append(w.calls, CalledWebhook{Name: v.Webhook, Configuration: v.Configuration, Mutated: v.Mutated})
}

func (w *webhookCalls) list() []CalledWebhook {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.calls
}
