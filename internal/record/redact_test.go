package record

import (
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
