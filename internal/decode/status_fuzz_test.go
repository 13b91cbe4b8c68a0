package decode

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// FuzzStatus reads arbitrary bytes as an error response body of a given
// content type, as kproxy reads the apiserver's answers. It checks that
// Status never panics; that a Status it finds encodes in JSON, YAML and
// protobuf and reads back equal from each; and that ResourceVersion and
// ObjectResourceVersion (the body as it came, or as gzip) never panic on
// the same body, and that ReadObjectHead reads the resourceVersion
// ObjectResourceVersion reads.
func FuzzStatus(f *testing.F) {
	cts := []string{"application/json", "application/yaml", "application/vnd.kubernetes.protobuf", "application/cbor", "",
		"application/json; charset=utf-8", "text/plain", "application/json;;", "application/vnd.kubernetes.protobuf;stream=watch"}
	for _, b := range testdataFiles(f, "decode/responses", ".json", ".bin", ".yaml") {
		for _, ct := range cts[:4] {
			f.Add(ct, b)
		}
	}
	for i, b := range []string{"", "{}", `{"kind":"Status","apiVersion":"v1","status":"Failure","code":404,"reason":"NotFound","details":{"causes":[{}]}}`,
		"kind: Status\napiVersion: v1\ncode: 403\n", "k8s\x00\x0a\x0c\x0a\x02v1\x12\x06Status", `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"n","resourceVersion":"5"}}`, "\xd9\xd9\xf7\xa0", "not a status"} {
		f.Add(cts[i%len(cts)], []byte(b))
	}
	f.Add("text/plain; charset=utf-8", []byte(`{"metadata":{},"status":"Failure","message":"Timeout: request did not complete within the allotted timeout","reason":"Timeout","details":{},"code":504}`))
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		_ = ResourceVersion(body)
		_ = ObjectResourceVersion(body, "")
		_ = ObjectResourceVersion(body, "gzip")
		if h, ok := ReadObjectHead(body); ok && h.ResourceVersion != "" && len(body) < protobufPrefixToRead {
			if rv := ObjectResourceVersion(body, ""); rv != h.ResourceVersion {
				t.Fatalf("ReadObjectHead(%q) reads resourceVersion %q, ObjectResourceVersion %q", body, h.ResourceVersion, rv)
			}
		}
		if bare, ok := BareStatus(contentType, body, 504); ok && (bare.Status != metav1.StatusFailure || bare.Code != 504 || bare.Message == "" || !utf8.ValidString(bare.Message)) {
			t.Fatalf("BareStatus(%q, %q) vouches for %#v", contentType, body, bare)
		}
		st, ok := Status(contentType, body)
		if !ok {
			if st != nil {
				t.Fatalf("Status(%q, %q) returns a Status it does not vouch for", contentType, body)
			}
			return
		}
		if st == nil {
			t.Fatalf("Status(%q, %q) is ok without a Status", contentType, body)
		}
		for _, ct := range []string{runtime.ContentTypeJSON, runtime.ContentTypeYAML, runtime.ContentTypeProtobuf} {
			info, _ := runtime.SerializerInfoForMediaType(StatusCodecs().SupportedMediaTypes(), ct)
			var buf bytes.Buffer
			err := info.Serializer.Encode(st, &buf)
			if ct == runtime.ContentTypeYAML && err != nil && strings.Contains(err.Error(), "control characters are not allowed") {
				// A message holding a control character (DEL, from an
				// arbitrary body) has no YAML form: the YAML encoder
				// refuses it, as it does in the apiserver. Found by this
				// fuzzer; the corpus keeps the case.
				continue
			}
			if err != nil {
				t.Fatalf("the Status of %q does not encode as %s: %v", body, ct, err)
			}
			again, ok := Status(ct, buf.Bytes())
			if !ok || !apiequality.Semantic.DeepEqual(st, again) {
				t.Fatalf("the Status of %q reads back from %s as %#v (ok %v), was %#v", body, ct, again, ok, st)
			}
		}
	})
}
