package decode

import (
	"errors"
	"fmt"
	"io"
	"mime"

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
	dec := streaming.NewDecoder(info.StreamSerializer.Framer.NewFrameReader(rc), info.StreamSerializer.Serializer)
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
		inner, err := Payload(we.Object.Raw)
		if err != nil {
			return fmt.Errorf("watch event %s: %w", we.Type, err)
		}
		if err := fn(Event{Type: we.Type, Object: inner}); err != nil {
			return err
		}
	}
}
