package decode

import (
	"bytes"
	"fmt"
	"io"
	"testing"
	"testing/iotest"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
)

// watchSeeds are the golden watch streams and streams made of the payload
// seeds' objects, in both framings.
func watchSeeds(f *testing.F) (jsonStreams, protoStreams [][]byte) {
	f.Helper()
	for _, b := range testdataFiles(f, "decode/responses", ".json", ".bin") {
		if ct, ok := DetectWatch(b); ok {
			if ct == WatchProtobuf {
				protoStreams = append(protoStreams, b)
			} else {
				jsonStreams = append(jsonStreams, b)
			}
		}
	}
	var objs []runtime.Object
	for _, s := range spread(payloadSeeds(f), 16) {
		if d, err := Payload(s); err == nil && d.Object != nil {
			objs = append(objs, d.Object)
		}
	}
	for _, ct := range []string{WatchJSON, runtime.ContentTypeProtobuf} {
		info, _ := runtime.SerializerInfoForMediaType(payloadCodecs.SupportedMediaTypes(), ct)
		var buf bytes.Buffer
		enc := streaming.NewEncoder(info.StreamSerializer.NewFrameWriter(&buf), info.StreamSerializer.Serializer)
		for i, o := range objs {
			raw, err := runtime.Encode(info.Serializer, o)
			if err != nil {
				continue
			}
			ev := &metav1.WatchEvent{Type: []string{"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"}[i%5], Object: runtime.RawExtension{Raw: raw}}
			if err := enc.Encode(ev); err != nil {
				f.Fatal(err)
			}
			if i%3 != 2 {
				continue // three events a stream
			}
			if ct == WatchJSON {
				jsonStreams = append(jsonStreams, bytes.Clone(buf.Bytes()))
			} else {
				protoStreams = append(protoStreams, bytes.Clone(buf.Bytes()))
			}
			buf.Reset()
		}
	}
	jsonStreams = append(jsonStreams, []byte(""), []byte("\n"), []byte(`{"type":"ADDED"}`), []byte(`{"type":"ADDED","object":null}`),
		[]byte(`{"type":"X\nobject: 1","object":{"kind":"Status","apiVersion":"v1"}}`), []byte(`{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1"}}{"type"`),
		[]byte(`[{"type":"ADDED","object":{}}]`))
	protoStreams = append(protoStreams, []byte(""), []byte("\x00\x00\x00"), []byte("\x00\x00\x00\x00"), []byte("\xff\xff\xff\xff\x0a\x05ADDED"),
		[]byte("\x00\x00\x00\x07\x0a\x05ADDED"), []byte("\x00\x00\x00\x09\x0a\x05ADDED\x12\x00"))
	return jsonStreams, protoStreams
}

// watchResult is what a watch stream delivered: one line per event, and
// how it ended.
type watchResult struct {
	events []string
	err    error
}

func readWatch(t *testing.T, body []byte, contentType string, oneByte bool) watchResult {
	var res watchResult
	var in io.Reader = bytes.NewReader(body)
	if oneByte {
		in = iotest.OneByteReader(in)
	}
	res.err = WatchStream(in, contentType, func(e Event) error {
		if e.Object == nil {
			t.Fatalf("event %q has no object", e.Type)
		}
		j, err := e.JSON()
		if rawNotJSON(err) {
			return err
		}
		if err != nil {
			t.Fatalf("event %q (%s) does not render as JSON: %v", e.Type, e.Object.GVK, err)
		}
		if _, err := e.YAML(); err != nil && !yamlUnprintable(j) {
			t.Fatalf("event %q (%s) renders as JSON but not as YAML: %v", e.Type, e.Object.GVK, err)
		}
		res.events = append(res.events, fmt.Sprintf("%q %s", e.Type, e.Object.GVK))
		return nil
	})
	return res
}

// FuzzWatchStream reads arbitrary bytes as a watch response body, in JSON
// and in length-prefixed protobuf framing. It checks that WatchStream
// never panics and always ends; that the events do not depend on how the
// body arrives (all at once, or a byte per read); that every event has an
// object that renders; and that the JSON stream the events render as
// reads back as the same events.
func FuzzWatchStream(f *testing.F) {
	js, pbs := watchSeeds(f)
	for _, b := range js {
		f.Add(b, false)
	}
	for _, b := range pbs {
		f.Add(b, true)
	}
	f.Fuzz(func(t *testing.T, body []byte, protobuf bool) {
		if ct, ok := DetectWatch(body); ok && ct != WatchJSON && ct != WatchProtobuf {
			t.Fatalf("DetectWatch(%q) = %q", body, ct)
		}
		ct := WatchJSON
		if protobuf {
			ct = WatchProtobuf
		}
		whole := readWatch(t, body, ct, false)
		bytewise := readWatch(t, body, ct, true)
		if fmt.Sprint(whole.events) != fmt.Sprint(bytewise.events) || (whole.err == nil) != (bytewise.err == nil) {
			t.Fatalf("%s stream %q reads differently a byte at a time:\nwhole:    %v %v\nbytewise: %v %v", ct, body, whole.events, whole.err, bytewise.events, bytewise.err)
		}
		// The tally of the stream as it reaches a client does not depend
		// on the pieces it comes in either, and counts a protobuf
		// stream's frames as WatchStream reads them.
		tw, tb := NewWatchTally(ct), NewWatchTally(ct)
		tw.Write(body)
		for i := range body {
			tb.Write(body[i : i+1])
		}
		if tw.Events() != tb.Events() || fmt.Sprint(tw.LastError()) != fmt.Sprint(tb.LastError()) {
			t.Fatalf("%s stream %q tallies differently a byte at a time: %d %v, %d %v", ct, body, tw.Events(), tw.LastError(), tb.Events(), tb.LastError())
		}
		if protobuf && whole.err == nil && tw.Events() != int64(len(whole.events)) {
			t.Fatalf("protobuf stream %q: tallied %d events, read %d", body, tw.Events(), len(whole.events))
		}
		// Render the events that decoded as a JSON stream, and read it.
		var again bytes.Buffer
		_ = WatchStream(bytes.NewReader(body), ct, func(e Event) error {
			j, err := e.JSON()
			again.Write(j)
			again.WriteByte('\n')
			return err
		})
		res := readWatch(t, again.Bytes(), WatchJSON, false)
		if res.err != nil || fmt.Sprint(res.events) != fmt.Sprint(whole.events) {
			t.Fatalf("the events %v of %q render as a JSON stream that reads as %v (%v):\n%s", whole.events, body, res.events, res.err, again.Bytes())
		}
	})
}
