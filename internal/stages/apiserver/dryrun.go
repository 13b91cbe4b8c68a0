package apiserver

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/endpoints/handlers/negotiation"
	"k8s.io/apiserver/pkg/util/apihelpers"
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
func dryRunRequest(verb string, query url.Values, body []byte, contentType string) bool {
	if isDeleteVerb(verb) && len(body) > 0 {
		opts, ok := decodeDeleteOptions(body, contentType)
		return ok && len(opts.DryRun) > 0
	}
	return len(query["dryRun"]) > 0
}

func isDeleteVerb(verb string) bool { return verb == "delete" || verb == "deletecollection" }

// forceDryRun makes r a dry run however it carries its options. It
// returns the body to send (changed only for a delete whose body is not a
// dry run) and its content type. A body the handler cannot decode is left
// as it is: the handler refuses it before anything is written.
func forceDryRun(verb string, q url.Values, body []byte, contentType string) (newQuery url.Values, newBody []byte, newContentType string) {
	if _, ok := q["dryRun"]; !ok {
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
