// Package decode turns Kubernetes wire and storage payloads into objects:
// JSON, YAML, protobuf ("k8s\x00" envelope), CBOR, and the metav1.Status
// bodies the apiserver answers errors with. It never imports the proxy or
// the TUI; everything here works on bytes.
package decode

import (
	"bytes"
	"encoding/json"
	"mime"
	"reflect"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor"
)

var (
	statusScheme = func() *runtime.Scheme {
		s := runtime.NewScheme()
		metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
		return s
	}()
	statusCodecs = serializer.NewCodecFactory(statusScheme)
	// statusDecoders read CBOR too, which an apiserver serving it
	// (CBORServingAndStorage) answers a client accepting it with; kproxy's
	// own answers (statusCodecs) are not offered in it.
	statusDecoders = serializer.NewCodecFactory(statusScheme, serializer.WithSerializer(cbor.NewSerializerInfo))
)

// StatusCodecs encode and decode metav1.Status in every media type the
// apiserver serves: what kproxy answers with itself (through the
// apiserver's own response writers) and what the replay predicts.
func StatusCodecs() serializer.CodecFactory { return statusCodecs }

// protobufPrefix starts every Kubernetes protobuf payload.
var protobufPrefix = []byte("k8s\x00")

// Status decodes a metav1.Status from a response body of the given content
// type (JSON, YAML, protobuf or CBOR). ok is false when the body is not a
// Status, which is normal for successful responses. Its strings are valid
// UTF-8: a protobuf Status can carry any bytes, but it ends up in records,
// spans and views, which are text (JSON would swap the bytes for U+FFFD
// anyway), so the swap happens here, once, the same for every reader.
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
	info, found := runtime.SerializerInfoForMediaType(statusDecoders.SupportedMediaTypes(), mediaType)
	if !found {
		info, _ = runtime.SerializerInfoForMediaType(statusDecoders.SupportedMediaTypes(), runtime.ContentTypeJSON)
	}
	obj, _, err := info.Serializer.Decode(body, nil, nil)
	if err != nil {
		return nil, false
	}
	s, isStatus := obj.(*metav1.Status)
	// The apiserver writes every Status as apiVersion v1, whatever group
	// the request was for; a body that says otherwise (or, through the
	// case-blind kind sniffing of the JSON decoder, "ApiVersion") is
	// not an apiserver's error answer, so kproxy does not vouch for it.
	if !isStatus || s.APIVersion != "v1" {
		return nil, false
	}
	validUTF8(reflect.ValueOf(s))
	return s, true
}

// validUTF8 replaces invalid UTF-8 in every settable string reachable from
// v (through pointers, structs and slices) with U+FFFD, as encoding/json
// does. It walks by reflection so that a field metav1.Status gains in a
// later release is covered too.
func validUTF8(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			validUTF8(v.Elem())
		}
	case reflect.Struct:
		for i := range v.NumField() {
			validUTF8(v.Field(i))
		}
	case reflect.Slice:
		for i := range v.Len() {
			validUTF8(v.Index(i))
		}
	case reflect.String:
		if s := v.String(); v.CanSet() && !utf8.ValidString(s) {
			v.SetString(strings.ToValidUTF8(s, "\uFFFD"))
		}
	}
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

// BareStatus decodes the one error answer kube-apiserver writes without
// its type: the timeout filter (k8s.io/apiserver/pkg/server/filters,
// timeout.go) encodes the Status struct itself with encoding/json, so the
// body has no kind or apiVersion, and Go's content sniffing labels it
// "text/plain; charset=utf-8". It is taken for a Status only when it
// says Failure with the code the response was sent with (code), so a
// plain-text body that happens to be JSON is not vouched for.
func BareStatus(contentType string, body []byte, code int) (*metav1.Status, bool) {
	if mediaType, _, _ := mime.ParseMediaType(contentType); mediaType != "text/plain" {
		return nil, false
	}
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		return nil, false
	}
	var s metav1.Status
	if err := json.Unmarshal(body, &s); err != nil {
		return nil, false
	}
	if s.Kind != "" || s.APIVersion != "" || s.Status != metav1.StatusFailure || int(s.Code) != code || s.Message == "" {
		return nil, false
	}
	validUTF8(reflect.ValueOf(&s))
	return &s, true
}
