package record

import (
	"net/http"
	"reflect"
	"testing"
)

func TestRedactQuery(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"watch=1&resourceVersion=5", "watch=1&resourceVersion=5"},
		{"access_token=abc&watch=1", "access_token=REDACTED&watch=1"},
		{"a=1&Token=xyz", "a=1&Token=REDACTED"},
		{"acc%65ss_token=abc", "acc%65ss_token=REDACTED"},
		{"flag&password=p", "flag&password=REDACTED"},
		{"limit=1;access_token=X", "limit=1;access_token=REDACTED"},
		{"a=1;b=2&token=t;c", "a=1;b=2&token=REDACTED;c"},
		{"%20access_token=x", "%20access_token=REDACTED"},
		{"access_token", "access_token"},
	} {
		if got := RedactQuery(tc.in); got != tc.want {
			t.Errorf("RedactQuery(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestRedactSecretObject(t *testing.T) {
	secret := map[string]any{"kind": "Secret", "data": map[string]any{"k": "djE="}, "stringData": map[string]any{"s": "v"}}
	want := map[string]any{"kind": "Secret", "data": map[string]any{"k": Redacted}, "stringData": map[string]any{"s": Redacted}}
	if got := RedactSecretObject(secret); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	cm := map[string]any{"kind": "ConfigMap", "data": map[string]any{"k": "v"}}
	if got := RedactSecretObject(cm); got["data"].(map[string]any)["k"] != "v" {
		t.Errorf("a ConfigMap's data must stay: %v", got)
	}
}

func TestRedactHeaders(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   http.Header
		want map[string][]string
	}{
		{"none", nil, nil},
		{"bearer token", http.Header{"Authorization": {"Bearer abc.def"}}, map[string][]string{"Authorization": {"Bearer REDACTED"}}},
		{"basic", http.Header{"Authorization": {"Basic dTpw"}}, map[string][]string{"Authorization": {"Basic REDACTED"}}},
		{"no known scheme: nothing kept", http.Header{"Authorization": {"secret part"}}, map[string][]string{"Authorization": {"REDACTED"}}},
		{"proxy auth and cookies", http.Header{"Proxy-Authorization": {"Basic x"}, "Cookie": {"a=b"}},
			map[string][]string{"Proxy-Authorization": {"Basic REDACTED"}, "Cookie": {"REDACTED"}}},
		{"websocket bearer subprotocol", http.Header{"Sec-Websocket-Protocol": {"v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.dG9rZW4"}},
			map[string][]string{"Sec-Websocket-Protocol": {"v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.REDACTED"}}},
		{"other headers kept", http.Header{"Accept": {"application/json"}, "Impersonate-User": {"bob"}},
			map[string][]string{"Accept": {"application/json"}, "Impersonate-User": {"bob"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := RedactHeaders(tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestRedactBody(t *testing.T) {
	for _, tc := range []struct {
		name     string
		resource string
		in, want any
	}{
		{"a Secret", "secrets",
			map[string]any{"kind": "Secret", "data": map[string]any{"k": "djE="}, "stringData": map[string]any{"s": "v"},
				"metadata": map[string]any{"name": "x", "annotations": map[string]any{lastApplied: `{"data":{"k":"djE="}}`, "team": "a"}}},
			map[string]any{"kind": "Secret", "data": map[string]any{"k": Redacted}, "stringData": map[string]any{"s": Redacted},
				"metadata": map[string]any{"name": "x", "annotations": map[string]any{lastApplied: Redacted, "team": "a"}}}},
		{"a merge patch of a Secret (no kind)", "secrets", map[string]any{"data": map[string]any{"k": "djE="}}, map[string]any{"data": map[string]any{"k": Redacted}}},
		{"a Secret's data that is not a map", "secrets", map[string]any{"data": "djE="}, map[string]any{"data": Redacted}},
		{"a JSON patch of a Secret", "secrets", []any{map[string]any{"op": "add", "path": "/data/k", "value": "djE="}},
			[]any{map[string]any{"op": "add", "path": "/data/k", "value": Redacted}}},
		{"something else on secrets", "secrets", "opaque", Redacted},
		{"a TokenReview", "tokenreviews", map[string]any{"kind": "TokenReview", "spec": map[string]any{"token": "abc"}},
			map[string]any{"kind": "TokenReview", "spec": map[string]any{"token": Redacted}}},
		{"a ConfigMap stays", "configmaps", map[string]any{"kind": "ConfigMap", "data": map[string]any{"k": "v"}},
			map[string]any{"kind": "ConfigMap", "data": map[string]any{"k": "v"}}},
		{"a JSON patch of a ConfigMap stays", "configmaps", []any{map[string]any{"op": "add", "value": "v"}}, []any{map[string]any{"op": "add", "value": "v"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := RedactBody(tc.resource, tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
