package snapshot

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
)

// Server answers reads from a snapshot as the apiserver would; it is an
// http.Handler for the replay's client.
type Server struct {
	s    *Snapshot
	info *apirequest.RequestInfoFactory
	// Idle bounds how long a watch stays open (the informers re-watch).
	Idle time.Duration
}

// NewServer serves s.
func NewServer(s *Snapshot) *Server {
	return &Server{s: s, Idle: 5 * time.Minute, info: newRequestInfoFactory()}
}

// newRequestInfoFactory resolves paths as the apiserver does (/api, /apis).
func newRequestInfoFactory() *apirequest.RequestInfoFactory {
	return &apirequest.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}
}

func (h *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		status(w, http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed, "a snapshot is read-only: "+r.Method+" "+r.URL.Path)
		return
	}
	info, err := h.info.NewRequestInfo(r)
	if err != nil || !info.IsResourceRequest {
		h.serveDoc(w, r)
		return
	}
	res, ok := h.s.Resource(info.APIGroup, info.APIVersion, info.Resource)
	if !ok || info.Subresource != "" {
		what := info.Resource
		if info.Subresource != "" {
			what += "/" + info.Subresource
		}
		status(w, http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("the server could not find the requested resource (%s is not served in this snapshot)", what))
		return
	}
	switch info.Verb {
	case "get":
		h.get(w, res, info)
	case "list":
		h.list(w, r, res, info)
	case "watch":
		h.watch(w, r, res, info)
	default:
		status(w, http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed, "a snapshot is read-only: "+info.Verb)
	}
}

func (h *Server) get(w http.ResponseWriter, res Resource, info *apirequest.RequestInfo) {
	// A Namespace's own path resolves with namespace = name; a
	// cluster-scoped object is kept without one (found by a probe: every
	// get of /api/v1/namespaces/NAME was 404 locally).
	ns := info.Namespace
	if !res.Namespaced {
		ns = ""
	}
	if o, ok := h.s.Get(res, ns, info.Name); ok {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(o.Raw)
		return
	}
	switch {
	case res.Collected == CollectedAll, res.Collected == CollectedNamed && slices.Contains(res.Absent, objKey(ns, info.Name)):
		status(w, http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("%s %q not found", res.Resource, info.Name))
	case res.Collected == CollectedWithheld:
		unavailable(w, fmt.Sprintf("%s are never written to a snapshot, so %s/%s cannot be read", res.Resource, info.Namespace, info.Name))
	default:
		unavailable(w, fmt.Sprintf("the snapshot does not hold %s %s/%s: take it again with the test files that name it (kproxy snapshot --for)", res.Resource, info.Namespace, info.Name))
	}
}

// selected are the objects a list or watch returns, or an error message
// (and whether that is the client's fault).
func (h *Server) selected(r *http.Request, res Resource, info *apirequest.RequestInfo) ([]*Object, int, string) {
	switch res.Collected {
	case CollectedAll, CollectedWithheld:
	default:
		return nil, http.StatusServiceUnavailable, fmt.Sprintf("the snapshot holds only some %s (or none): a list of them cannot be answered; take it again with kproxy snapshot", res.Resource)
	}
	q := r.URL.Query()
	ls, err := labels.Parse(q.Get("labelSelector"))
	if err != nil {
		return nil, http.StatusBadRequest, "labelSelector: " + err.Error()
	}
	fs, err := fields.ParseSelector(q.Get("fieldSelector"))
	if err != nil {
		return nil, http.StatusBadRequest, "fieldSelector: " + err.Error()
	}
	var out []*Object
	for _, o := range h.s.Objects(res, info.Namespace) {
		if !ls.Matches(labels.Set(o.Labels)) {
			continue
		}
		if !fs.Empty() {
			set := fields.Set{}
			for _, req := range fs.Requirements() {
				set[req.Field] = o.Field(req.Field)
			}
			if !fs.Matches(set) {
				continue
			}
		}
		out = append(out, o)
	}
	return out, 0, ""
}

func (h *Server) list(w http.ResponseWriter, r *http.Request, res Resource, info *apirequest.RequestInfo) {
	objs, code, msg := h.selected(r, res, info)
	if code != 0 {
		writeError(w, code, msg)
		return
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"kind":%q,"apiVersion":%q,"metadata":{"resourceVersion":%q},"items":[`, res.Kind+"List", res.GroupVersion(), h.s.ResourceVersion())
	for i, o := range objs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(o.Raw)
	}
	b.WriteString("]}")
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b.Bytes())
}

// watch sends the initial events when asked (watch-list), then a
// bookmark, then nothing: a snapshot does not change.
func (h *Server) watch(w http.ResponseWriter, r *http.Request, res Resource, info *apirequest.RequestInfo) {
	objs, code, msg := h.selected(r, res, info)
	if code != 0 {
		writeError(w, code, msg)
		return
	}
	q := r.URL.Query()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Transfer-Encoding", "chunked")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	enc := func(typ string, obj json.RawMessage) {
		_ = json.NewEncoder(w).Encode(struct {
			Type   string          `json:"type"`
			Object json.RawMessage `json:"object"`
		}{typ, obj})
	}
	if q.Get("sendInitialEvents") == "true" {
		for _, o := range objs {
			enc("ADDED", o.Raw)
		}
	}
	if q.Get("allowWatchBookmarks") == "true" {
		bm := map[string]any{"kind": res.Kind, "apiVersion": res.GroupVersion(), "metadata": map[string]any{
			"resourceVersion": h.s.ResourceVersion(),
			"annotations":     map[string]string{metav1.InitialEventsAnnotationKey: "true"},
		}}
		raw, _ := json.Marshal(bm)
		enc("BOOKMARK", raw)
	}
	if fl != nil {
		fl.Flush()
	}
	idle := h.Idle
	if t, err := strconv.Atoi(q.Get("timeoutSeconds")); err == nil && t > 0 && time.Duration(t)*time.Second < idle {
		idle = time.Duration(t) * time.Second
	}
	select {
	case <-r.Context().Done():
	case <-time.After(idle):
	}
}

func (h *Server) serveDoc(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if r.URL.RawQuery != "" {
		path += "?" + r.URL.RawQuery
	}
	accept := r.Header.Get("Accept")
	var found *Doc
	for i := range h.s.Docs {
		d := &h.s.Docs[i]
		if d.Path != path {
			continue
		}
		if d.Accept == accept {
			found = d
			break
		}
		if found == nil && d.Accept == "" {
			found = d
		}
	}
	if found == nil {
		// Not a 404: the apiserver may well serve it. Unknown, not wrong.
		unavailable(w, fmt.Sprintf("the snapshot does not hold %s: take it again with the test files that ask for it (kproxy snapshot --for)", path))
		return
	}
	if found.ContentType != "" {
		w.Header().Set("Content-Type", found.ContentType)
	}
	if found.LastModified != "" {
		w.Header().Set("Last-Modified", found.LastModified)
	}
	if found.CacheControl != "" {
		w.Header().Set("Cache-Control", found.CacheControl)
	}
	if found.ETag != "" {
		w.Header().Set("ETag", found.ETag)
		if r.Header.Get("If-None-Match") == found.ETag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
	}
	w.WriteHeader(found.Status)
	_, _ = w.Write([]byte(found.Body))
}

func unavailable(w http.ResponseWriter, msg string) {
	status(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, msg)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	reason := metav1.StatusReasonServiceUnavailable
	if code == http.StatusBadRequest {
		reason = metav1.StatusReasonBadRequest
	}
	status(w, code, reason, msg)
}

func status(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Code: int32(code), Reason: reason, Message: msg,
	})
}
