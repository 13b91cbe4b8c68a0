package decode

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

// The resourceVersion of a write's answer tells the replay the request's
// own write from one before it (a create that finds its object in etcd, an
// update whose object moved on). The answer is what the client got: gzip
// when the client asked for it and the object is large (the apiserver
// compresses answers over 128 KiB), and only its first bytes when the
// object is larger than what kproxy keeps of it. The resourceVersion sits
// near the start of the object (metadata is the first field of every
// built-in type, resourceVersion an early field of metadata), so it is
// read from the stream without decoding the rest.

// answerInflateLimit bounds what is inflated of a gzip answer while the
// resourceVersion is looked for: more than any object the apiserver
// stores, far less than a hostile stream could inflate to.
const answerInflateLimit = 8 << 20

// ObjectResourceVersion is the resourceVersion of the object in body as it
// came on the wire (an apiserver's answer, a write's body), perhaps only
// its first bytes, compressed as contentEncoding says (gzip or none). ""
// when the object has none, or it is not in the bytes kept, or they are
// not an object kproxy reads.
func ObjectResourceVersion(body []byte, contentEncoding string) string {
	br, ok := answerReader(body, contentEncoding)
	if !ok {
		return ""
	}
	head, _ := br.Peek(len(protobufMagic))
	switch {
	case bytes.Equal(head, protobufMagic):
		return protobufResourceVersion(br)
	case firstNonSpace(br) == '{':
		return jsonResourceVersion(json.NewDecoder(br))
	}
	// Another encoding (CBOR, YAML): decoded whole, as far as it is kept.
	b, _ := io.ReadAll(br)
	return ResourceVersion(b)
}

// answerReader reads body as it came on the wire, inflating gzip (up to
// answerInflateLimit); ok is false for another encoding or a broken gzip
// header.
func answerReader(body []byte, contentEncoding string) (*bufio.Reader, bool) {
	var r io.Reader = bytes.NewReader(body)
	switch strings.ToLower(strings.TrimSpace(contentEncoding)) {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, false
		}
		r = io.LimitReader(zr, answerInflateLimit)
	default:
		return nil, false
	}
	return bufio.NewReader(r), true
}

var protobufMagic = []byte{0x6b, 0x38, 0x73, 0x00} // "k8s\x00"

// firstNonSpace peeks at the first byte that is not JSON whitespace.
func firstNonSpace(br *bufio.Reader) byte {
	for i := 1; ; i++ {
		b, err := br.Peek(i)
		if err != nil || len(b) < i {
			return 0
		}
		switch c := b[i-1]; c {
		case ' ', '\t', '\r', '\n':
		default:
			return c
		}
	}
}

// jsonResourceVersion reads a JSON object's metadata.resourceVersion from
// the stream, skipping every other member, and stops there.
func jsonResourceVersion(dec *json.Decoder) string {
	if !delim(dec, '{') || !member(dec, "metadata") || !delim(dec, '{') || !member(dec, "resourceVersion") {
		return ""
	}
	v, err := dec.Token()
	if s, ok := v.(string); ok && err == nil {
		return s
	}
	return ""
}

// member reads the members of the object dec is in until the one named
// name, and reports it found it: the decoder is then at its value.
func member(dec *json.Decoder, name string) bool {
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return false
		}
		if key == name {
			return true
		}
		if !skipValue(dec) {
			return false
		}
	}
	return false
}

// delim reads the next token and reports it is d.
func delim(dec *json.Decoder, d json.Delim) bool {
	t, err := dec.Token()
	return err == nil && t == d
}

// skipValue reads past one JSON value, however nested.
func skipValue(dec *json.Decoder) bool {
	depth := 0
	for {
		t, err := dec.Token()
		if err != nil {
			return false
		}
		switch t {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
		if depth == 0 {
			return true
		}
	}
}

// Field numbers of the protobuf encoding: runtime.Unknown's raw object,
// every built-in object's metadata, ObjectMeta's resourceVersion.
const (
	unknownRawField      = 2
	objectMetadataField  = 1
	metaResourceVersion  = 6
	protobufPrefixToRead = 64 << 10 // what is read of the stream: metadata's start is in it
)

// protobufResourceVersion reads the resourceVersion of a "k8s\x00"
// envelope's object from the start of the stream: the envelope's raw
// object, its metadata (field 1 of every built-in type), metadata's field
// 6. A message cut short is read as far as it goes.
func protobufResourceVersion(br *bufio.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(br, protobufPrefixToRead))
	md, ok := protobufMetadata(b[len(protobufMagic):], false)
	if !ok {
		return ""
	}
	rv, ok := protoField(md, metaResourceVersion, true)
	if !ok {
		return ""
	}
	return string(rv)
}

// protobufMetadata is the metadata of a "k8s\x00" envelope's object (b,
// the magic taken off): the envelope's raw object, its field 1. whole as
// for protoField: false reads a message cut short as far as it goes.
func protobufMetadata(b []byte, whole bool) ([]byte, bool) {
	raw, ok := protoField(b, unknownRawField, whole)
	if !ok {
		return nil, false
	}
	return protoField(raw, objectMetadataField, whole)
}

// protoField finds the length-delimited field num in the message b and
// returns its bytes, cut short where b is unless whole: what precedes it
// must be whole.
func protoField(b []byte, num protowire.Number, whole bool) ([]byte, bool) {
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return nil, false
		}
		b = b[l:]
		if n == num && typ == protowire.BytesType {
			size, l := protowire.ConsumeVarint(b)
			if l < 0 {
				return nil, false
			}
			b = b[l:]
			if whole && size > uint64(len(b)) {
				return nil, false
			}
			return b[:min(uint64(len(b)), size)], true
		}
		l = protowire.ConsumeFieldValue(n, typ, b)
		if l < 0 {
			return nil, false
		}
		b = b[l:]
	}
	return nil, false
}

// ObjectHead is what the start of an object's encoding says it is: its
// apiVersion and kind, and its metadata's name, namespace and
// resourceVersion.
type ObjectHead struct {
	APIVersion, Kind                 string
	Name, Namespace, ResourceVersion string
}

// Field numbers of runtime.Unknown's TypeMeta and of ObjectMeta's name
// and namespace (k8s.io/apimachinery's generated.proto).
const (
	unknownTypeMetaField = 1
	typeMetaAPIVersion   = 1
	typeMetaKind         = 2
	metaName             = 1
	metaNamespace        = 3
)

// ReadObjectHead reads an object's head from its JSON or protobuf
// encoding, whole and uncompressed, without decoding the rest: a reader
// that only needs to know which object body is (a get's answer, whose
// content the replay never looks at) is spared a decode that costs more
// than everything else it does. Metadata is read up to its
// resourceVersion: name and namespace come before it in every encoding
// the apiserver writes (ObjectMeta's field order), so another order reads
// as an object with no namespace, a mismatch for a caller checking it,
// never another object. ok is false for anything else: another encoding,
// a body that is not an object, a head that is not all there.
func ReadObjectHead(body []byte) (ObjectHead, bool) {
	if bytes.HasPrefix(body, protobufMagic) {
		return protobufHead(body[len(protobufMagic):])
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	var h ObjectHead
	if !delim(dec, '{') {
		return h, false
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return h, false
		}
		switch key {
		case "apiVersion":
			h.APIVersion, err = stringToken(dec)
		case "kind":
			h.Kind, err = stringToken(dec)
		case "metadata":
			// The apiserver writes kind and apiVersion first; metadata
			// is read only so far, so the head ends here.
			err = jsonMetadataHead(dec, &h)
			return h, err == nil && h.APIVersion != "" && h.Kind != "" && h.Name != ""
		default:
			if !skipValue(dec) {
				return h, false
			}
		}
		if err != nil {
			return h, false
		}
	}
	return h, false
}

var errNotString = errors.New("not a string")

// stringToken reads a JSON string value.
func stringToken(dec *json.Decoder) (string, error) {
	t, err := dec.Token()
	if s, ok := t.(string); ok && err == nil {
		return s, nil
	}
	return "", errNotString
}

// jsonMetadataHead reads metadata's name, namespace and resourceVersion,
// stopping at the resourceVersion (or metadata's end).
func jsonMetadataHead(dec *json.Decoder, h *ObjectHead) error {
	if !delim(dec, '{') {
		return errNotString
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return err
		}
		switch key {
		case "name":
			h.Name, err = stringToken(dec)
		case "namespace":
			h.Namespace, err = stringToken(dec)
		case "resourceVersion":
			h.ResourceVersion, err = stringToken(dec)
			return err
		default:
			if !skipValue(dec) {
				return errNotString
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// protobufHead reads the head of a "k8s\x00" envelope's object (the magic
// taken off): the envelope's TypeMeta, then the raw object's metadata.
func protobufHead(b []byte) (ObjectHead, bool) {
	var h ObjectHead
	tm, ok := protoField(b, unknownTypeMetaField, true)
	if !ok {
		return h, false
	}
	md, ok := protobufMetadata(b, true)
	if !ok {
		return h, false
	}
	for _, f := range []struct {
		msg []byte
		num protowire.Number
		to  *string
	}{
		{tm, typeMetaAPIVersion, &h.APIVersion}, {tm, typeMetaKind, &h.Kind},
		{md, metaName, &h.Name}, {md, metaNamespace, &h.Namespace}, {md, metaResourceVersion, &h.ResourceVersion},
	} {
		if v, ok := protoField(f.msg, f.num, true); ok {
			*f.to = string(v)
		}
	}
	return h, h.APIVersion != "" && h.Kind != "" && h.Name != ""
}

// ObjectMeta field numbers of a deletion's state.
const (
	metaDeletionTimestamp = 9
	metaFinalizers        = 14
)

// ObjectEmptiedFinalizers reports that body, an object as it came on the
// wire (compressed as contentEncoding says), is being deleted and has no
// finalizers left: the answer to an update that removed the last
// finalizers of an object being deleted, which the apiserver deletes
// instead of storing the update, answering with the request's object at
// the resourceVersion the request met. (A pod in graceful deletion is
// stored so; the caller tells them apart.) False for anything it cannot
// read whole (metadata cut off, another encoding), and, in JSON, as soon
// as a field ObjectMeta places after deletionTimestamp comes without one.
func ObjectEmptiedFinalizers(body []byte, contentEncoding string) bool {
	br, ok := answerReader(body, contentEncoding)
	if !ok {
		return false
	}
	head, _ := br.Peek(len(protobufMagic))
	if bytes.Equal(head, protobufMagic) {
		b, _ := io.ReadAll(io.LimitReader(br, answerInflateLimit))
		md, ok := protobufMetadata(b[len(protobufMagic):], true)
		if !ok {
			return false
		}
		_, deleting := protoField(md, metaDeletionTimestamp, true)
		_, finalizers := protoField(md, metaFinalizers, true)
		return deleting && !finalizers
	}
	if firstNonSpace(br) != '{' {
		return false
	}
	dec := json.NewDecoder(br)
	if !delim(dec, '{') || !member(dec, "metadata") || !delim(dec, '{') {
		return false
	}
	var deleting, finalizers bool
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return false
		}
		switch key {
		case "labels", "annotations", "ownerReferences", "finalizers", "managedFields":
			// ObjectMeta's fields after deletionTimestamp: the apiserver
			// writes them in this order, so an object not being deleted
			// (nearly every write's answer) is told here, without a walk
			// through its labels and managedFields.
			if !deleting {
				return false
			}
		}
		switch key {
		case "deletionTimestamp":
			t, err := dec.Token()
			if err != nil {
				return false
			}
			deleting = t != nil
		case "finalizers":
			var f []string
			if err := dec.Decode(&f); err != nil {
				return false
			}
			finalizers = len(f) > 0
		default:
			if !skipValue(dec) {
				return false
			}
		}
	}
	// Only a whole metadata is read: the closing brace must be there.
	return delim(dec, '}') && deleting && !finalizers
}
