package apiserver

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/endpoints/handlers/negotiation"
	"k8s.io/apiserver/pkg/util/apihelpers"
	"k8s.io/kubernetes/pkg/api/legacyscheme"

	policyv1 "k8s.io/api/policy/v1"
	policyv1beta1 "k8s.io/api/policy/v1beta1"
)

// The replay runs every write in dry run: the registry then only reads,
// admission plugins persist nothing, and webhooks are called only when
// they declare no side effects. Where a request carries its options
// decides how: create, update and patch read theirs from the query, but a
// delete (or deletecollection) with a body reads DeleteOptions from the
// body alone and ignores the query (the handler's DeleteResource), so
// kubectl delete, which always sends a body, must get dryRun there.

// dryRunRequest says whether the request itself is a dry run, reading its
// options where the apiserver reads them.
func dryRunRequest(verb, subresource string, query url.Values, body []byte, contentType string) bool {
	if isDeleteVerb(verb) && len(body) > 0 {
		opts, ok := decodeDeleteOptions(body, contentType)
		return ok && len(opts.DryRun) > 0
	}
	if isEviction(verb, subresource) && len(evictionDryRun(body)) > 0 {
		return true
	}
	return len(query["dryRun"]) > 0
}

// An eviction (a create of pods/eviction) takes dryRun from its query and
// from its body's deleteOptions (the registry's propagateDryRun): either
// makes it a dry run (any value: one the registry refuses is refused by
// validation before anything is written), and the two, when both are
// set, must be equal or the eviction is refused (500 "Non-matching
// dry-run options"). So an eviction whose body sets it is already a dry
// run, and a dryRun added to its query would be refused where the
// apiserver went on with the body's (found by a probe: predicted 500 for
// the apiserver's 422, 404 and 201).

func isDeleteVerb(verb string) bool { return verb == "delete" || verb == "deletecollection" }

func isEviction(verb, subresource string) bool { return verb == "create" && subresource == "eviction" }

// evictionDryRun is the dryRun of an eviction body's deleteOptions, as
// the handler decodes it (policy/v1 unless the body names a version; the
// universal deserializer tells JSON, YAML and protobuf apart), or nil.
func evictionDryRun(body []byte) []string {
	if len(body) == 0 {
		return nil
	}
	def := policyv1.SchemeGroupVersion.WithKind("Eviction")
	obj, _, err := legacyscheme.Codecs.UniversalDeserializer().Decode(body, &def, nil)
	if err != nil {
		return nil // the handler's to refuse
	}
	switch e := obj.(type) {
	case *policyv1.Eviction:
		if e.DeleteOptions != nil {
			return e.DeleteOptions.DryRun
		}
	case *policyv1beta1.Eviction:
		if e.DeleteOptions != nil {
			return e.DeleteOptions.DryRun
		}
	}
	return nil
}

// forceDryRun makes r a dry run however it carries its options (dry: the
// request is one already, dryRunRequest). It returns the body to send
// (changed only for a delete whose body is not a dry run) and its content
// type. A body the handler cannot decode is left as it is: the handler
// refuses it before anything is written.
func forceDryRun(verb, subresource string, dry bool, q url.Values, body []byte, contentType string) (newQuery url.Values, newBody []byte, newContentType string) {
	// An eviction dryRunRequest found dry without a dryRun in its query
	// carries it in its body, which the query must not contradict.
	bodyDry := dry && isEviction(verb, subresource)
	if _, ok := q["dryRun"]; !ok && !bodyDry {
		q = cloneValues(q)
		q.Set("dryRun", metav1.DryRunAll)
	}
	if !isDeleteVerb(verb) || len(body) == 0 {
		return q, body, contentType
	}
	if isJSON(contentType) {
		if b, ok := dryRunJSONBody(body); ok {
			return q, b, contentType
		}
	}
	opts, ok := decodeDeleteOptions(body, contentType)
	if !ok || len(opts.DryRun) > 0 {
		return q, body, contentType
	}
	opts.DryRun = []string{metav1.DryRunAll}
	opts.APIVersion, opts.Kind = "meta.k8s.io/v1", "DeleteOptions"
	b, err := json.Marshal(opts)
	if err != nil {
		return q, body, contentType
	}
	return q, b, "application/json"
}

// dryRunJSONBody sets dryRun in a JSON DeleteOptions body, keeping every
// other field as it was (the apiserver's JSON decoding is case-sensitive,
// so only the exact key "dryRun" counts).
func dryRunJSONBody(body []byte) ([]byte, bool) {
	t := bytes.TrimSpace(body)
	if len(t) == 0 || t[0] != '{' {
		return nil, false
	}
	d := json.NewDecoder(bytes.NewReader(t))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil || m == nil {
		return nil, false
	}
	if dr, ok := m["dryRun"].([]any); ok && len(dr) > 0 {
		return body, true // already a dry run; the handler validates the values
	}
	m["dryRun"] = []string{metav1.DryRunAll}
	b, err := json.Marshal(m)
	return b, err == nil
}

// decodeDeleteOptions decodes a DeleteOptions body as the delete handler
// does (any media type it accepts, group-versioned or meta.k8s.io).
func decodeDeleteOptions(body []byte, contentType string) (*metav1.DeleteOptions, bool) {
	codecs := apihelpers.GetMetaInternalVersionCodecs()
	r := &http.Request{Header: http.Header{"Content-Type": {contentType}}}
	s, err := negotiation.NegotiateInputSerializer(r, false, codecs)
	if err != nil {
		return nil, false
	}
	opts := &metav1.DeleteOptions{}
	def := metav1.SchemeGroupVersion.WithKind("DeleteOptions")
	obj, _, err := codecs.DecoderToVersion(s.Serializer, def.GroupVersion()).Decode(body, &def, opts)
	if err != nil || obj != runtime.Object(opts) {
		return nil, false
	}
	return opts, true
}

func isJSON(contentType string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	mt = strings.TrimSpace(strings.ToLower(mt))
	return mt == "" || mt == "application/json"
}

func cloneValues(v url.Values) url.Values {
	out := make(url.Values, len(v)+1)
	for k, vs := range v {
		out[k] = append([]string(nil), vs...)
	}
	return out
}

// The replay's dry run is kproxy's, not the request's, and an admission
// policy can tell: its CEL reads request.dryRun and request.options.dryRun
// (a policy refusing dry runs of some objects, a MutatingAdmissionPolicy
// labelling them). Webhooks must be told (one with side effects is not
// called in dry run; a webhook's answer is its own anyway), and so must
// the plugins that would persist something (ResourceQuota), but the
// policy plugins evaluate CEL in process and persist nothing: they see
// the request as it was sent (found by a probe: 7 of 7 wrong, a create
// predicted 201 that a policy requiring dry runs refused).

// asSent is a's attributes with the request's own dryRun, for the policy
// plugins, when the replay made a write that was not a dry run one.
func asSent(a admission.Attributes, run *Run, plugin string) admission.Attributes {
	if run == nil || run.DryRun || !a.IsDryRun() || a.GetOperation() == admission.Connect ||
		(plugin != "ValidatingAdmissionPolicy" && plugin != "MutatingAdmissionPolicy") {
		return a
	}
	return sentAttributes{Attributes: a, options: withoutDryRun(a.GetOperationOptions())}
}

type sentAttributes struct {
	admission.Attributes
	options runtime.Object
}

func (sentAttributes) IsDryRun() bool                        { return false }
func (s sentAttributes) GetOperationOptions() runtime.Object { return s.options }

// withoutDryRun is a copy of a write's options without the dryRun the
// replay added.
func withoutDryRun(o runtime.Object) runtime.Object {
	switch opts := o.(type) {
	case *metav1.CreateOptions:
		c := opts.DeepCopy()
		c.DryRun = nil
		return c
	case *metav1.UpdateOptions:
		c := opts.DeepCopy()
		c.DryRun = nil
		return c
	case *metav1.PatchOptions:
		c := opts.DeepCopy()
		c.DryRun = nil
		return c
	case *metav1.DeleteOptions:
		c := opts.DeepCopy()
		c.DryRun = nil
		return c
	}
	return o
}
