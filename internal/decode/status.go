// Package decode turns Kubernetes wire and storage payloads into objects:
// JSON, YAML, protobuf ("k8s\x00" envelope), CBOR, and the metav1.Status
// bodies the apiserver answers errors with. It never imports the proxy or
// the TUI; everything here works on bytes.
package decode

import (
	"bytes"
	"mime"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
)

var (
	statusScheme = func() *runtime.Scheme {
		s := runtime.NewScheme()
		metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
		return s
	}()
	statusCodecs = serializer.NewCodecFactory(statusScheme)
)

// StatusCodecs encode and decode metav1.Status in every media type the
// apiserver serves: what kproxy answers with itself (through the
// apiserver's own response writers) and what the replay predicts.
func StatusCodecs() serializer.CodecFactory { return statusCodecs }

// protobufPrefix starts every Kubernetes protobuf payload.
var protobufPrefix = []byte("k8s\x00")

// Status decodes a metav1.Status from a response body of the given content
// type (JSON, YAML, protobuf or CBOR). ok is false when the body is not a
// Status, which is normal for successful responses.
func Status(contentType string, body []byte) (st *metav1.Status, ok bool) {
	if len(body) == 0 {
		return nil, false
	}
	mediaType, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		mediaType = ""
	}
	if mediaType == "" && bytes.HasPrefix(body, protobufPrefix) {
		mediaType = runtime.ContentTypeProtobuf
	}
	info, found := runtime.SerializerInfoForMediaType(statusCodecs.SupportedMediaTypes(), mediaType)
	if !found {
		info, _ = runtime.SerializerInfoForMediaType(statusCodecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	}
	obj, _, err := info.Serializer.Decode(body, nil, nil)
	if err != nil {
		return nil, false
	}
	s, isStatus := obj.(*metav1.Status)
	return s, isStatus
}

// ResourceVersion is metadata.resourceVersion of the object in an
// apiserver answer (JSON, YAML or protobuf), or "" if there is none.
func ResourceVersion(body []byte) string {
	d, err := Payload(body)
	if err != nil || d.Object == nil {
		return ""
	}
	m, err := meta.Accessor(d.Object)
	if err != nil {
		return ""
	}
	return m.GetResourceVersion()
}
