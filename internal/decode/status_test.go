package decode

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
)

// protobufStatus is st as the apiserver writes it in protobuf.
func protobufStatus(t *testing.T, st *metav1.Status) []byte {
	t.Helper()
	b, err := runtime.Encode(protobuf.NewSerializer(statusScheme, statusScheme), st)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestStatus(t *testing.T) {
	st := &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
		Message: `pods "x" is forbidden`, Reason: metav1.StatusReasonForbidden, Code: 403}
	pbBytes := protobufStatus(t, st)
	// As an apiserver serving CBOR (CBORServingAndStorage) answers a
	// client that accepts it (found by a probe: reason and message empty,
	// the prediction's message the raw bytes).
	cborBytes, err := runtime.Encode(cbor.NewSerializer(statusScheme, statusScheme), st)
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
		{"cbor", "application/cbor", cborBytes, true},
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

// TestBareStatus: the timeout filter's 504, as kube-apiserver v1.37.2 sent
// it to GET /api/v1/namespaces/default/configmaps?timeout=1ms (Content-Type
// "text/plain; charset=utf-8"), and bodies that only look like it.
func TestBareStatus(t *testing.T) {
	const timeout = `{"metadata":{},"status":"Failure","message":"Timeout: request did not complete within the allotted timeout","reason":"Timeout","details":{},"code":504}` + "\n"
	for _, tc := range []struct {
		name, ct, body string
		code           int
		ok             bool
	}{
		{"the timeout filter's answer", "text/plain; charset=utf-8", timeout, 504, true},
		{"another code than the response's", "text/plain; charset=utf-8", timeout, 500, false},
		{"typed: Status reads it", "text/plain", `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"m","code":504}`, 504, false},
		{"JSON content type: Status reads it", "application/json", timeout, 504, false},
		{"success", "text/plain", `{"status":"Success","message":"m","code":504}`, 504, false},
		{"no message", "text/plain", `{"status":"Failure","code":504}`, 504, false},
		{"plain text", "text/plain", "Too many requests, please try again later.\n", 429, false},
		{"not JSON", "text/plain", "{oops", 504, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := BareStatus(tc.ct, []byte(tc.body), tc.code)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v (%+v)", ok, tc.ok, got)
			}
			if ok && (got.Reason != metav1.StatusReasonTimeout || got.Message != "Timeout: request did not complete within the allotted timeout") {
				t.Errorf("got %+v", got)
			}
		})
	}
}
