package apiserver

import (
	"net/http"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/record"
)

// The contract's labelling rules (docs/labelling.md) for a refusal the
// resource handler produces: by default the stage whose phase the handler
// was in, with the exceptions the contract names.

// attribute names the stage whose code produced st, following the
// contract's labelling rules.
func (r *Run) attribute(st *metav1.Status) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pluginErr != nil {
		if ps, ok := r.pluginErr.(apierrors.APIStatus); ok && ps.Status().Message == st.Message {
			return PhaseStage[r.pluginErrPhase]
		}
		if strings.Contains(st.Message, r.pluginErr.Error()) {
			return PhaseStage[r.pluginErrPhase]
		}
	}
	// A patch that parses but cannot be applied to the stored object (a
	// failing JSON-patch test; a strategic-merge patch whose list entry
	// lacks its merge key, which the patcher answers 500 with no reason)
	// is refused after the read. A server-side apply's 500 is its patch
	// failing strict decoding (a field not in the schema).
	if r.Verb == "patch" && r.phase == PhaseDecode && len(r.Reads) > 0 && (st.Reason == metav1.StatusReasonInvalid || (st.Code == 500 && !r.apply)) {
		return record.StageStorage
	}
	// The store parses the resourceVersion the request brings after
	// mutating admission and before the strategy (Store.Update's
	// GuaranteedUpdate): one that is not a number is storage's 500.
	if (r.Verb == "update" || r.Verb == "patch") && r.phase == PhaseValidation && st.Code == 500 &&
		strings.HasPrefix(st.Message, "strconv.ParseUint: parsing ") {
		return record.StageStorage
	}
	// An object the etcd3 store cannot decrypt or decode, whichever
	// request read it (a delete reads before admission).
	if st.Code == 500 && strings.Contains(st.Message, corruptObject) {
		return record.StageStorage
	}
	// A read of the store that failed (the replay's read, which cannot
	// say what the request met: the run is unknown at storage), whichever
	// phase the handler was in: a delete reads before admission, in what
	// kproxy still counts as decode's phase (a probe found a concurrent
	// delete's unknown at decode, every stage after it "see decode").
	if st.Code == 500 {
		for _, rd := range r.Reads {
			if rd.Err != nil && strings.Contains(st.Message, rd.Err.Error()) {
				return record.StageStorage
			}
		}
	}
	// A read's answer made into what the Accept header and the query
	// ask (a Table and its includeObject, the objects' metadata alone):
	// content negotiation, which the contract labels decode, though the
	// handler checks it only once it holds what storage read.
	if r.Read && (st.Code == http.StatusNotAcceptable || (st.Code == http.StatusBadRequest &&
		(strings.HasPrefix(st.Message, "Unable to convert to Table as requested") || strings.HasPrefix(st.Message, "unrecognized includeObject value")))) {
		return record.StageDecode
	}
	switch st.Reason {
	case metav1.StatusReasonNotFound, metav1.StatusReasonAlreadyExists, metav1.StatusReasonConflict:
		// The componentstatus registry reads no storage: its 404 for a
		// component it does not know is existence, as a store's is.
		if len(r.Reads) == 0 && r.phase == PhaseDecode && r.Resource != "componentstatuses" {
			return record.StageDecode // no route: the version or resource is not served
		}
		return record.StageStorage
	case metav1.StatusReasonForbidden:
		if escalationMessage(st.Message) {
			return record.StageAuthorization
		}
		// The pods registry asks the authorizer again, for create, before
		// it connects a WebSocket exec, attach or port-forward (a GET,
		// authorized as get: AuthorizePodWebsocketUpgradeCreatePermission):
		// authorization logic run inside the registry, as the escalation
		// checks are (a probe found it labelled storage).
		if UpgradeCreateCheck(r.Resource, r.Subresource, r.Verb) && r.phase == PhaseStorage {
			return record.StageAuthorization
		}
	case metav1.StatusReasonRequestEntityTooLarge:
		if r.phase < PhaseValidation {
			return record.StageDecode
		}
		return record.StageStorage
	}
	return PhaseStage[r.phase]
}

// UpgradeCreateCheck says whether the pods registry authorizes the request
// again for the create verb before it connects it (pkg/registry/core/pod/
// rest's ensureAuthorizedForVerb): an exec, attach or port-forward sent as
// a GET (a WebSocket upgrade), which the authorization filter allowed as
// get.
func UpgradeCreateCheck(resource, subresource, verb string) bool {
	if resource != "pods" || verb == "create" {
		return false
	}
	switch subresource {
	case "exec", "attach", "portforward":
		return true
	}
	return false
}
