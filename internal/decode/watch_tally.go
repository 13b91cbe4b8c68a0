package decode

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"mime"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// WatchTally counts the events of a watch's stream as its bytes pass on
// to the client, and keeps the last ERROR event: the apiserver ends a
// watch it cannot go on with (410 "too old resource version", a storage
// error) inside its 200, which a record of the 200 alone hides. It holds
// no event but the start of the current one (to see its type) and an
// ERROR event's first maxErrorEvent bytes: the stream is never buffered.
type WatchTally struct {
	protobuf bool
	events   int64
	// cur is the current event's first bytes: up to len(errorHead) until
	// they show it is not an ERROR event, then none; an ERROR event's up
	// to maxErrorEvent.
	cur     []byte
	notErr  bool
	lastErr []byte
	// Protobuf framing: the 4-byte length being read (lenN of it so far),
	// then need bytes of the frame.
	lenBuf [4]byte
	lenN   int
	need   uint32
}

// maxErrorEvent bounds what is kept of an ERROR event (a Status).
const maxErrorEvent = 8 << 10

// How an ERROR event starts: the apiserver writes the type first, in
// JSON ({"type":"ERROR",...) and in protobuf (field 1, tag 0x0a, length 5).
var (
	jsonErrorHead  = []byte(`{"type":"ERROR"`)
	protoErrorHead = []byte("\x0a\x05ERROR")
)

// NewWatchTally is a tally for a watch stream of the given content type,
// or nil when its framing is not one the apiserver writes for a watch
// over HTTP (JSON lines, length-prefixed protobuf).
func NewWatchTally(contentType string) *WatchTally {
	mediaType, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return nil
	}
	switch {
	case mediaType == runtime.ContentTypeJSON:
		return &WatchTally{}
	case mediaType == runtime.ContentTypeProtobuf && params["stream"] == "watch":
		return &WatchTally{protobuf: true}
	}
	return nil
}

// Write takes the next bytes of the stream, as they reach the client.
func (t *WatchTally) Write(p []byte) {
	if t.protobuf {
		t.writeProtobuf(p)
		return
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			t.keep(p, jsonErrorHead)
			return
		}
		t.keep(p[:i], jsonErrorHead)
		t.end()
		p = p[i+1:]
	}
}

func (t *WatchTally) writeProtobuf(p []byte) {
	for len(p) > 0 {
		if t.need == 0 {
			n := copy(t.lenBuf[t.lenN:], p)
			t.lenN += n
			p = p[n:]
			if t.lenN < 4 {
				return
			}
			t.lenN, t.need = 0, binary.BigEndian.Uint32(t.lenBuf[:])
			if t.need == 0 {
				t.end()
			}
			continue
		}
		n := min(uint32(len(p)), t.need)
		t.keep(p[:n], protoErrorHead)
		t.need -= n
		p = p[n:]
		if t.need == 0 {
			t.end()
		}
	}
}

// keep notes the current event's next bytes b, as far as its type (head,
// an ERROR event's start) needs them.
func (t *WatchTally) keep(b, head []byte) {
	if t.notErr {
		return
	}
	if len(t.cur) < len(head) {
		n := min(len(b), len(head)-len(t.cur))
		t.cur = append(t.cur, b[:n]...)
		b = b[n:]
		if !bytes.HasPrefix(head, t.cur) {
			t.notErr, t.cur = true, t.cur[:0]
			return
		}
	}
	if len(t.cur) >= len(head) {
		t.cur = append(t.cur, b[:min(len(b), max(0, maxErrorEvent-len(t.cur)))]...)
	}
}

// end ends the current event.
func (t *WatchTally) end() {
	t.events++
	head := jsonErrorHead
	if t.protobuf {
		head = protoErrorHead
	}
	if !t.notErr && len(t.cur) >= len(head) {
		t.lastErr = append(t.lastErr[:0], t.cur...)
	}
	t.cur, t.notErr = t.cur[:0], false
}

// Events is how many whole events have passed.
func (t *WatchTally) Events() int64 { return t.events }

// LastError is the Status of the last ERROR event that passed, or nil.
func (t *WatchTally) LastError() *metav1.Status {
	if len(t.lastErr) == 0 {
		return nil
	}
	if t.protobuf {
		var ev metav1.WatchEvent
		if ev.Unmarshal(t.lastErr) != nil {
			return nil
		}
		st, _ := Status(runtime.ContentTypeProtobuf, ev.Object.Raw)
		return st
	}
	var ev struct {
		Object json.RawMessage `json:"object"`
	}
	if json.Unmarshal(t.lastErr, &ev) != nil {
		return nil
	}
	st, _ := Status(runtime.ContentTypeJSON, ev.Object)
	return st
}
