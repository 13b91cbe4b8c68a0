package decode

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
)

func TestStatus(t *testing.T) {
	st := &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
		Message: `pods "x" is forbidden`, Reason: metav1.StatusReasonForbidden, Code: 403}
	pb := protobuf.NewSerializer(statusScheme, statusScheme)
	pbBytes, err := runtime.Encode(pb, st)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, ct string
		body     []byte
		ok       bool
	}{
		{"json", "application/json", []byte(`{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \"x\" is forbidden","reason":"Forbidden","code":403}`), true},
		{"yaml", "application/yaml", []byte("kind: Status\napiVersion: v1\nstatus: Failure\nmessage: 'pods \"x\" is forbidden'\nreason: Forbidden\ncode: 403\n"), true},
		{"protobuf", "application/vnd.kubernetes.protobuf", pbBytes, true},
		{"protobuf without content type", "", pbBytes, true},
		{"not a status", "application/json", []byte(`{"kind":"Pod","apiVersion":"v1"}`), false},
		{"text", "text/plain", []byte("ok"), false},
		{"empty", "application/json", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Status(tc.ct, tc.body)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if ok && (got.Code != 403 || got.Reason != metav1.StatusReasonForbidden || got.Message != st.Message) {
				t.Errorf("got %+v", got)
			}
		})
	}
}
