package decode

import (
	"encoding/binary"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestWatchTally: the events of a watch stream, fed in pieces of every
// size as they reach the client, are counted, and the last ERROR event's
// Status is kept, in JSON and protobuf framing.
func TestWatchTally(t *testing.T) {
	gone := &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
		Message: "too old resource version: 300 (1709)", Reason: metav1.StatusReasonExpired, Code: 410}
	pbStatus := protobufStatus(t, gone)
	frame := func(typ string, raw []byte) string {
		b, err := (&metav1.WatchEvent{Type: typ, Object: runtime.RawExtension{Raw: raw}}).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return string(binary.BigEndian.AppendUint32(nil, uint32(len(b)))) + string(b)
	}
	cm := []byte("k8s\x00\n\x0f\n\x02v1\x12\tConfigMap\x12\x00")
	big := `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","data":{"k":"` + strings.Repeat("x", 20000) + `"}}}` + "\n"
	jsonErr := `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 300 (1709)","reason":"Expired","code":410}}` + "\n"
	for _, tc := range []struct {
		name, contentType, stream string
		events                    int64
		err                       *metav1.Status
	}{
		{"json events", "application/json", big + `{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1"}}` + "\n", 2, nil},
		{"json ends in an ERROR", "application/json", big + jsonErr, 2, gone},
		{"json ERROR alone", "application/json;charset=utf-8", jsonErr, 1, gone},
		{"json: an event not yet ended is not counted", "application/json", big + `{"type":"ERR`, 1, nil},
		{"json: a value that looks like the head is not the type", "application/json", `{"type":"ERRORS","object":{}}` + "\n", 1, nil},
		{"protobuf events", "application/vnd.kubernetes.protobuf;stream=watch", frame("ADDED", cm) + frame("MODIFIED", cm), 2, nil},
		{"protobuf ends in an ERROR", "application/vnd.kubernetes.protobuf;stream=watch", frame("ADDED", cm) + frame("ERROR", pbStatus), 2, gone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, piece := range []int{1, 3, 7, 4096, len(tc.stream)} {
				w := NewWatchTally(tc.contentType)
				for s := tc.stream; s != ""; {
					n := min(piece, len(s))
					w.Write([]byte(s[:n]))
					s = s[n:]
				}
				if got := w.Events(); got != tc.events {
					t.Errorf("pieces of %d: %d events, want %d", piece, got, tc.events)
				}
				got := w.LastError()
				switch {
				case tc.err == nil && got != nil:
					t.Errorf("pieces of %d: last error %+v, want none", piece, got)
				case tc.err != nil && (got == nil || got.Code != tc.err.Code || got.Reason != tc.err.Reason || got.Message != tc.err.Message):
					t.Errorf("pieces of %d: last error %+v, want %+v", piece, got, tc.err)
				}
			}
		})
	}
	for _, ct := range []string{"application/yaml", "application/vnd.kubernetes.protobuf", "text/plain", "no/such;;"} {
		if NewWatchTally(ct) != nil {
			t.Errorf("NewWatchTally(%q): a tally, want none (no watch framing)", ct)
		}
	}
}
