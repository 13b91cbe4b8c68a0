package decode

import (
	"sigs.k8s.io/yaml"

	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
)

// Event is one event of a watch stream.
type Event struct {
	Type   string
	Object *Decoded
}

// WatchStream reads a watch response body in the framing its content type
// names (JSON lines, or length-prefixed protobuf for
// application/vnd.kubernetes.protobuf;stream=watch), calling fn for each
// event until the stream ends or fn returns an error.
func WatchStream(r io.Reader, contentType string, fn func(Event) error) error {
	mediaType, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return fmt.Errorf("watch content type %q: %w", contentType, err)
	}
	info, ok := runtime.SerializerInfoForMediaType(payloadCodecs.SupportedMediaTypes(), mediaType)
	if !ok || info.StreamSerializer == nil {
		return fmt.Errorf("watch content type %q has no stream framing kproxy knows (json or protobuf)", contentType)
	}
	rc, ok := r.(io.ReadCloser)
	if !ok {
		rc = io.NopCloser(r)
	}
	dec := streaming.NewDecoder(info.StreamSerializer.NewFrameReader(rc), info.StreamSerializer.Serializer)
	for {
		var ev metav1.WatchEvent
		obj, _, err := dec.Decode(nil, &ev)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("watch frame: %w", err)
		}
		we, ok := obj.(*metav1.WatchEvent)
		if !ok {
			return fmt.Errorf("watch frame holds a %T, not a WatchEvent", obj)
		}
		// Protobuf strings are bytes: a type that is not UTF-8 would render
		// as something else than what was sent (JSON replaces the bytes).
		// The apiserver never sends one; say so rather than show a lookalike.
		if !utf8.ValidString(we.Type) {
			return fmt.Errorf("watch event type %q is not UTF-8: not a stream the apiserver writes (its types are ADDED, MODIFIED, DELETED, BOOKMARK and ERROR)", we.Type)
		}
		inner, err := Payload(we.Object.Raw)
		if err != nil {
			return fmt.Errorf("watch event %s: %w", we.Type, err)
		}
		if err := fn(Event{Type: we.Type, Object: inner}); err != nil {
			return err
		}
	}
}

// Watch stream content types, for WatchStream.
const (
	WatchJSON     = "application/json"
	WatchProtobuf = "application/vnd.kubernetes.protobuf;stream=watch"
)

// DetectWatch says whether b is a watch response body, and in which
// framing: JSON (one {"type":...,"object":...} per event) or protobuf
// (each WatchEvent message behind a 4-byte big-endian length, its type
// first, its object in the k8s\x00 envelope). The content type it returns
// is WatchStream's argument.
func DetectWatch(b []byte) (contentType string, ok bool) {
	// Protobuf: length, then field 1 (the type): tag 0x0a, a one-byte
	// length, the type.
	if len(b) >= 6 && b[4] == 0x0a && int(binary.BigEndian.Uint32(b)) <= len(b)-4 {
		if n := int(b[5]); len(b) >= 6+n && isEventType(string(b[6:6+n])) {
			return WatchProtobuf, true
		}
	}
	var first map[string]json.RawMessage
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&first); err != nil || len(first) != 2 || first["object"] == nil {
		return "", false
	}
	var typ string
	if json.Unmarshal(first["type"], &typ) != nil || !isEventType(typ) {
		return "", false
	}
	return WatchJSON, true
}

func isEventType(s string) bool {
	switch s {
	case "ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR":
		return true
	}
	return false
}

// JSON renders the event as {"type": ..., "object": ...}, indented.
func (e Event) JSON() ([]byte, error) {
	obj, err := e.Object.JSON()
	if err != nil {
		return nil, err
	}
	typ, err := json.Marshal(e.Type)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	err = json.Indent(&out, []byte(`{"type": `+string(typ)+`, "object": `+string(obj)+`}`), "", "  ")
	return out.Bytes(), err
}

// YAML renders the event as a YAML document: type, then the object.
func (e Event) YAML() ([]byte, error) {
	obj, err := e.Object.YAML()
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	// The type is data from the stream: quoted when it needs to be, so it
	// cannot add keys of its own.
	typ, err := yaml.Marshal(e.Type)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(&out, "type: %sobject:\n", typ)
	for _, line := range bytes.SplitAfter(bytes.TrimSuffix(obj, []byte("\n")), []byte("\n")) {
		out.WriteString("  ")
		out.Write(line)
	}
	out.WriteString("\n")
	return out.Bytes(), nil
}
