package apiserver

import (
	"net/http"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestParamsUnsyncedIn(t *testing.T) {
	// The policy plugins' words (v1.37), as the dispatcher wraps them.
	notSynced := "ValidatingAdmissionPolicy 'max' with binding 'max' denied request: failed to configure binding: paramKind kind `&ParamKind{APIVersion:v1,Kind:ConfigMap,}` not yet synced to use for admission"
	for _, c := range []struct {
		name string
		st   metav1.Status
		want string
	}{
		{"the refusal", metav1.Status{Message: `deployments.apps "d" is forbidden: ` + notSynced}, "ConfigMap v1"},
		{"a later cause", metav1.Status{Message: "policy 'a' denied request: no",
			Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Message: "no"}, {Message: notSynced}}}}, "ConfigMap v1"},
		{"a group's kind", metav1.Status{Message: "paramKind kind `&ParamKind{APIVersion:example.com/v1,Kind:Limit,}` not yet synced to use for admission"}, "Limit example.com/v1"},
		{"a policy's own denial", metav1.Status{Message: "ValidatingAdmissionPolicy 'max' with binding 'max' denied request: too many replicas"}, ""},
		{"params not found", metav1.Status{Message: "failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction"}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := paramsUnsyncedIn(&c.st); got != c.want {
				t.Errorf("paramsUnsyncedIn = %q, want %q", got, c.want)
			}
		})
	}
}

func TestListOutcomes(t *testing.T) {
	code := http.StatusOK
	l := &listOutcomes{}
	c := &http.Client{Transport: l.wrap(answering(func(r *http.Request) *http.Response {
		return &http.Response{StatusCode: code, Body: http.NoBody, Request: r}
	}))}
	get := func(path string) {
		t.Helper()
		resp, err := c.Get("https://apiserver" + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
	}
	const gadgets = "/apis/example.com/v1/gadgets"
	if l.listed(gadgets) {
		t.Fatal("listed before any list")
	}
	code = http.StatusServiceUnavailable // a snapshot that holds only some
	get(gadgets + "?limit=500")
	if l.listed(gadgets) {
		t.Error("a list answered 503 counts as listed")
	}
	code = http.StatusOK
	get("/apis/example.com/v1/namespaces/a/gadgets/g") // a get of one object
	get(gadgets + "?watch=true")                       // a watch after a list
	if l.listed(gadgets) {
		t.Error("a get or a plain watch counts as a list")
	}
	get(gadgets + "?watch=true&sendInitialEvents=true") // a watch-list
	if !l.listed(gadgets) {
		t.Error("a watch-list answered 200 does not count")
	}
	get("/api/v1/configmaps?limit=500")
	if !l.listed("/api/v1/configmaps") {
		t.Error("a core list answered 200 does not count")
	}
}

// answering is a transport that answers every request itself.
type answering func(*http.Request) *http.Response

func (f answering) RoundTrip(r *http.Request) (*http.Response, error) { return f(r), nil }
