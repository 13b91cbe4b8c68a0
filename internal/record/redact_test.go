package record

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"reflect"
	"strconv"
	"strings"
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
		// A proxy subresource's backend's credentials (probe AD).
		{"api_key=k1&client_secret=s1&passwd=p1&X-Amz-Signature=a1&X-Amz-Credential=c1&sig=g1&id_token=i1&code=o1&key=y1&apikey=z1",
			"api_key=REDACTED&client_secret=REDACTED&passwd=REDACTED&X-Amz-Signature=REDACTED&X-Amz-Credential=REDACTED&sig=REDACTED&id_token=REDACTED&code=REDACTED&key=REDACTED&apikey=REDACTED"},
		{"pwd=1&pass=2&private_key=3&accesskey=4&AWSAccessKeyId=5&jwt=6&bearer=7&client_assertion=8&SAMLResponse=9&sessionid=a&jsessionid=b&sid=c&otp=d&ticket=e",
			"pwd=REDACTED&pass=REDACTED&private_key=REDACTED&accesskey=REDACTED&AWSAccessKeyId=REDACTED&jwt=REDACTED&bearer=REDACTED&client_assertion=REDACTED&SAMLResponse=REDACTED&sessionid=REDACTED&jsessionid=REDACTED&sid=REDACTED&otp=REDACTED&ticket=REDACTED"},
		// The apiserver's own parameters stay.
		{"labelSelector=a%3Db&fieldSelector=x&limit=5&continue=eyJ2&resourceVersion=9&resourceVersionMatch=NotOlderThan&timeoutSeconds=3&allowWatchBookmarks=true&sendInitialEvents=true&dryRun=All&fieldManager=m&fieldValidation=Strict&force=true&propagationPolicy=Foreground&gracePeriodSeconds=0&container=c&follow=true&tailLines=5&command=sh&stdin=true&ports=80&hash=AB&exclude=etcd&verbose",
			"labelSelector=a%3Db&fieldSelector=x&limit=5&continue=eyJ2&resourceVersion=9&resourceVersionMatch=NotOlderThan&timeoutSeconds=3&allowWatchBookmarks=true&sendInitialEvents=true&dryRun=All&fieldManager=m&fieldValidation=Strict&force=true&propagationPolicy=Foreground&gracePeriodSeconds=0&container=c&follow=true&tailLines=5&command=sh&stdin=true&ports=80&hash=AB&exclude=etcd&verbose"},
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
		{"headers named as credentials, which a proxy subresource passes to its backend", http.Header{"X-Api-Key": {"k1"}, "X-Auth-Token": {"t1"},
			"X-Vault-Token": {"t2"}, "X-Client-Secret": {"s1"}, "X-Password": {"p1"}, "Kubectl-Session": {"8fb2904f"}},
			map[string][]string{"X-Api-Key": {"REDACTED"}, "X-Auth-Token": {"REDACTED"}, "X-Vault-Token": {"REDACTED"}, "X-Client-Secret": {"REDACTED"},
				"X-Password": {"REDACTED"}, "Kubectl-Session": {"8fb2904f"}}},
		{"other headers kept", http.Header{"Accept": {"application/json"}, "Impersonate-User": {"bob"}},
			map[string][]string{"Accept": {"application/json"}, "Impersonate-User": {"bob"}}},
		// What the record holds elsewhere is left out; what a HAR export,
		// kproxy test generate and the TUI read is kept.
		{"a response's restated headers left out", http.Header{"Audit-Id": {"a1"}, "Content-Type": {"application/json"},
			"Content-Length": {"400"}, "Date": {"Tue, 01 Dec 2026 14:47:43 GMT"}, "Cache-Control": {"no-cache, private"},
			"X-Kubernetes-Pf-Flowschema-Uid": {"u1"}, "X-Kubernetes-Pf-Prioritylevel-Uid": {"u2"}, "Warning": {`299 - "w"`}},
			map[string][]string{"Audit-Id": {"a1"}, "Content-Type": {"application/json"}, "Cache-Control": {"no-cache, private"}, "Warning": {`299 - "w"`}}},
		{"a request's restated headers left out", http.Header{"Content-Length": {"70"}, "Content-Type": {"application/json"},
			"User-Agent": {"kubectl/v1.37.2"}, "Accept": {"application/json"}, "Kubectl-Command": {"kubectl create"}},
			map[string][]string{"Content-Type": {"application/json"}, "User-Agent": {"kubectl/v1.37.2"}, "Accept": {"application/json"}, "Kubectl-Command": {"kubectl create"}}},
		{"only restated headers: none", http.Header{"Date": {"x"}, "content-length": {"0"}}, nil},
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
		// Misspelled fields the apiserver drops (Warn) or refuses (Strict):
		// their values were meant as data all the same.
		{"a Secret's misspelled fields", "secrets",
			map[string]any{"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "immutable": true, "stringdata": map[string]any{"pw": "hunter2"}, "Data": "aHVudGVyMg==", "metadata": map[string]any{"name": "x"}},
			map[string]any{"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "immutable": true, "stringdata": map[string]any{"pw": Redacted}, "Data": Redacted, "metadata": map[string]any{"name": "x"}}},
		{"a JSON patch of a Secret", "secrets", []any{map[string]any{"op": "add", "path": "/data/k", "value": "djE="}},
			[]any{map[string]any{"op": "add", "path": "/data/k", "value": Redacted}}},
		{"something else on secrets", "secrets", "opaque", Redacted},
		{"a TokenReview", "tokenreviews", map[string]any{"kind": "TokenReview", "spec": map[string]any{"token": "abc"}},
			map[string]any{"kind": "TokenReview", "spec": map[string]any{"token": Redacted}}},
		{"a TokenReview's token misspelled", "tokenreviews", map[string]any{"kind": "TokenReview", "spec": map[string]any{"Token": "abc", "audiences": []any{"x"}}, "Spec": map[string]any{"TOKEN": "def"}},
			map[string]any{"kind": "TokenReview", "spec": map[string]any{"Token": Redacted, "audiences": []any{"x"}}, "Spec": map[string]any{"TOKEN": Redacted}}},
		{"a ConfigMap stays", "configmaps", map[string]any{"kind": "ConfigMap", "data": map[string]any{"k": "v"}},
			map[string]any{"kind": "ConfigMap", "data": map[string]any{"k": "v"}}},
		{"a Helm release in a ConfigMap (HELM_DRIVER=configmap)", "configmaps",
			map[string]any{"kind": "ConfigMap", "metadata": map[string]any{"name": "sh.helm.release.v1.web.v1", "labels": map[string]any{"owner": "helm", "name": "web"}},
				"data": map[string]any{"release": "H4sIAAAAAAAA"}},
			map[string]any{"kind": "ConfigMap", "metadata": map[string]any{"name": "sh.helm.release.v1.web.v1", "labels": map[string]any{"owner": "helm", "name": "web"}},
				"data": map[string]any{"release": Redacted}}},
		{"a Helm release in a ConfigMap applied with kubectl apply: its copy in the annotation too", "configmaps",
			map[string]any{"kind": "ConfigMap", "metadata": map[string]any{"labels": map[string]any{"owner": "helm"},
				"annotations": map[string]any{lastApplied: `{"data":{"release":"H4sI"}}`}}, "data": map[string]any{"release": "H4sI"}},
			map[string]any{"kind": "ConfigMap", "metadata": map[string]any{"labels": map[string]any{"owner": "helm"},
				"annotations": map[string]any{lastApplied: Redacted}}, "data": map[string]any{"release": Redacted}}},
		{"a release key in another ConfigMap stays", "configmaps",
			map[string]any{"kind": "ConfigMap", "data": map[string]any{"release": "v2"}},
			map[string]any{"kind": "ConfigMap", "data": map[string]any{"release": "v2"}}},
		{"a JSON patch of a ConfigMap stays", "configmaps", []any{map[string]any{"op": "add", "value": "v"}}, []any{map[string]any{"op": "add", "value": "v"}}},
		// A ConfigMap holds strings: another value is refused, and may be
		// a kubeconfig sent as an object (a probe: a server-side apply
		// recorded its token).
		{"a kubeconfig as an object in a ConfigMap's data", "configmaps",
			map[string]any{"kind": "ConfigMap", "data": map[string]any{"plain": "v", "kubeconfig": map[string]any{"users": []any{map[string]any{"user": map[string]any{"token": "t-1"}}}}, "port": 8080.0},
				"binaryData": map[string]any{"k": []any{"x"}}},
			map[string]any{"kind": "ConfigMap", "data": map[string]any{"plain": "v", "kubeconfig": Redacted, "port": Redacted}, "binaryData": map[string]any{"k": Redacted}}},
		{"a JSON patch of a ConfigMap's data with an object", "configmaps",
			[]any{map[string]any{"op": "add", "path": "/data/kubeconfig", "value": map[string]any{"users": []any{}}},
				map[string]any{"op": "replace", "path": "/data", "value": map[string]any{"a": "v", "b": map[string]any{"token": "t"}}},
				map[string]any{"op": "add", "path": "/metadata/labels", "value": map[string]any{"a": "b"}}},
			[]any{map[string]any{"op": "add", "path": "/data/kubeconfig", "value": Redacted},
				map[string]any{"op": "replace", "path": "/data", "value": map[string]any{"a": "v", "b": Redacted}},
				map[string]any{"op": "add", "path": "/metadata/labels", "value": map[string]any{"a": "b"}}}},
		{"a kubeconfig in a ConfigMap's data", "configmaps",
			map[string]any{"kind": "ConfigMap", "data": map[string]any{"config": testKubeconfig, "other": "kept"}},
			map[string]any{"kind": "ConfigMap", "data": map[string]any{"config": testKubeconfigRedacted, "other": "kept"}}},
		{"a merge patch of a ConfigMap (no kind) with a kubeconfig", "configmaps",
			map[string]any{"data": map[string]any{"config": testKubeconfig}},
			map[string]any{"data": map[string]any{"config": testKubeconfigRedacted}}},
		{"a JSON patch of a ConfigMap with a kubeconfig", "configmaps",
			[]any{map[string]any{"op": "replace", "path": "/data/config", "value": testKubeconfig}, map[string]any{"op": "add", "path": "/data/x", "value": "v"}},
			[]any{map[string]any{"op": "replace", "path": "/data/config", "value": testKubeconfigRedacted}, map[string]any{"op": "add", "path": "/data/x", "value": "v"}}},
		{"a ConfigMap's binaryData kubeconfig and kubectl apply's copy", "configmaps",
			map[string]any{"kind": "ConfigMap", "binaryData": map[string]any{"kc": base64.StdEncoding.EncodeToString([]byte(testKubeconfig))},
				"metadata": map[string]any{"annotations": map[string]any{lastApplied: `{"apiVersion":"v1","data":{"config":` + strconv.Quote(testKubeconfig) + `},"kind":"ConfigMap"}`}}},
			map[string]any{"kind": "ConfigMap", "binaryData": map[string]any{"kc": base64.StdEncoding.EncodeToString([]byte(testKubeconfigRedacted))},
				"metadata": map[string]any{"annotations": map[string]any{lastApplied: `{"apiVersion":"v1","data":{"config":` + strconv.Quote(testKubeconfigRedacted) + `},"kind":"ConfigMap"}`}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := RedactBody(tc.resource, tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// testKubeconfig is a kubeconfig with every kind of credential; its
// redacted form keeps everything else.
const testKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: prod
  cluster:
    server: https://prod.example:6443
    certificate-authority-data: Q0EtREFUQQ==
users:
- name: admin
  user:
    token: tok-1234
    client-certificate: /etc/admin.crt
    client-key: /etc/admin.key
    client-key-data: S0VZLURBVEE=
- name: basic
  user:
    username: bob
    password: pass-1234
- name: oidc
  user:
    auth-provider:
      name: oidc
      config:
        client-id: kubectl
        client-secret: cs-1234
        id-token: idt-1234
        refresh-token: rt-1234
- name: exec
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: get-token
      env:
      - name: REGION
        value: eu-1
      - name: API_TOKEN
        value: env-1234
contexts:
- name: prod
  context: {cluster: prod, user: admin}
current-context: prod
`

const testKubeconfigRedacted = `apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: Q0EtREFUQQ==
    server: https://prod.example:6443
  name: prod
contexts:
- context:
    cluster: prod
    user: admin
  name: prod
current-context: prod
kind: Config
users:
- name: admin
  user:
    client-certificate: /etc/admin.crt
    client-key: /etc/admin.key
    client-key-data: REDACTED
    token: REDACTED
- name: basic
  user:
    password: REDACTED
    username: bob
- name: oidc
  user:
    auth-provider:
      config:
        client-id: kubectl
        client-secret: REDACTED
        id-token: REDACTED
        refresh-token: REDACTED
      name: oidc
- name: exec
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: get-token
      env:
      - name: REGION
        value: eu-1
      - name: API_TOKEN
        value: REDACTED
`

func TestRedactKubeconfig(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
		redacted       bool
	}{
		{"every credential, the rest kept", testKubeconfig, testKubeconfigRedacted, true},
		{"JSON stays JSON", `{"apiVersion":"v1","kind":"Config","users":[{"name":"u","user":{"token":"t-1"}}]}`,
			`{"apiVersion":"v1","kind":"Config","users":[{"name":"u","user":{"token":"REDACTED"}}]}`, true},
		{"no kind, a users list: client-go loads it", "users:\n- name: u\n  user:\n    password: p-1\n",
			"users:\n- name: u\n  user:\n    password: REDACTED\n", true},
		{"a kubeconfig without credentials is left as it is", "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n    tokenFile: /t\n",
			"apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n    tokenFile: /t\n", false},
		{"another kind is not a kubeconfig", "kind: Other\nusers:\n- user: {token: t}\n", "kind: Other\nusers:\n- user: {token: t}\n", false},
		{"another apiVersion is not a kubeconfig", "apiVersion: x/v2\nkind: Config\nusers:\n- user: {token: t}\n",
			"apiVersion: x/v2\nkind: Config\nusers:\n- user: {token: t}\n", false},
		{"plain text", "the users of this token", "the users of this token", false},
		{"a broken kubeconfig with a credential goes whole", "clusters: [\nusers:\n- user: {token: t-1}\n", Redacted, true},
		{"not text about users", "token: t", "token: t", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, redacted := RedactKubeconfig(tc.in)
			if got != tc.want || redacted != tc.redacted {
				t.Errorf("got %t\n%s\nwant %t\n%s", redacted, got, tc.redacted, tc.want)
			}
			for _, secret := range []string{"tok-1234", "S0VZLURBVEE=", "pass-1234", "cs-1234", "idt-1234", "rt-1234", "env-1234", "t-1", "p-1"} {
				if tc.redacted && strings.Contains(got, secret) {
					t.Errorf("%q survived", secret)
				}
			}
		})
	}
}

func TestRedactConfigMapObject(t *testing.T) {
	cm := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "kc"},
		"data": map[string]any{"config": testKubeconfig, "plain": "users: none"}}
	got := RedactConfigMapObject(cm)
	if d := got["data"].(map[string]any); d["config"] != testKubeconfigRedacted || d["plain"] != "users: none" {
		t.Errorf("a ConfigMap's data: %v", d)
	}
	other := map[string]any{"kind": "Pod", "data": map[string]any{"config": testKubeconfig}}
	if got := RedactConfigMapObject(other); got["data"].(map[string]any)["config"] != testKubeconfig {
		t.Errorf("another kind must stay: %v", got)
	}
	if RedactConfigMapObject(nil) != nil {
		t.Error("nil")
	}
}

// TestRedactEchoes: what the apiserver's messages echo of a body or an
// object is redacted whole, the rest kept: the values a server-side
// apply's error quotes (structured-merge-diff's Go rendering), a patched
// object a field.Invalid quotes, YAML's invalid map key, the body's start
// that "the object provided is unrecognized" adds (the last three as
// probe AD found them, with Secret data and a Helm release).
func TestRedactEchoes(t *testing.T) {
	for _, tc := range []struct{ in, want, gone string }{ // gone: where want is "", text that must not remain
		{`failed to create typed patch object (/v1, Kind=Secret): .stringData.password: expected string, got &value.valueUnstructured{Value:987654321}`,
			`failed to create typed patch object (/v1, Kind=Secret): .stringData.password: expected string, got &value.valueUnstructured{Value:REDACTED}`, ""},
		{`.stringData.pw: expected string, got &value.valueUnstructured{Value:[]interface {}{"SECRET"}}`,
			`.stringData.pw: expected string, got &value.valueUnstructured{Value:REDACTED}`, ""},
		{`.stringData: expected map, got &value.valueUnstructured{Value:map[string]interface {}{"a":"x}y\"}{"}} and .data.b: expected string, got &value.valueUnstructured{Value:true}`,
			`.stringData: expected map, got &value.valueUnstructured{Value:REDACTED} and .data.b: expected string, got &value.valueUnstructured{Value:REDACTED}`, ""},
		{`cut short: &value.valueUnstructured{Value:[]interface {}{"SEC`, `cut short: &value.valueUnstructured{Value:REDACTED`, ""},
		{`configmaps "x" not found`, `configmaps "x" not found`, ""},
		{` "" is invalid: patch: Invalid value: "{\"apiVersion\":\"v1\",\"data\":{\"pw\":\"U0VLUklUNg==\"},\"kind\":\"Secret\"}": error decoding from json: illegal base64 data at input byte 4`,
			` "" is invalid: patch: Invalid value: "REDACTED": error decoding from json: illegal base64 data at input byte 4`, ""},
		{` "" is invalid: patch: Invalid value: "{\"apiVersion\":\"v1\",\"data\":{\"release\":\"SDRzSUFBQUFB`, ` "" is invalid: patch: Invalid value: "REDACTED`, ""},
		{` "" is invalid: patch: Invalid value: "map[data:map[x:!!]]": error decoding from json: illegal base64 data at input byte 0`,
			` "" is invalid: patch: Invalid value: "REDACTED": error decoding from json: illegal base64 data at input byte 0`, ""},
		{`Secret "e3" is invalid: data[.dockerconfigjson]: Invalid value: "<secret contents redacted>": invalid character 'S'`,
			`Secret "e3" is invalid: data[.dockerconfigjson]: Invalid value: "<secret contents redacted>": invalid character 'S'`, ""},
		{`ConfigMap "kc-x" is invalid: metadata.name: Invalid value: "kc-x": a lowercase RFC 1123 subdomain`,
			`ConfigMap "kc-x" is invalid: metadata.name: Invalid value: "kc-x": a lowercase RFC 1123 subdomain`, ""},
		{`error encoding patch: yaml: invalid map key: map[interface {}]interface {}{"pw":"SEKRITK5"}`, `error encoding patch: yaml: invalid map key: REDACTED`, ""},
		{`the object provided is unrecognized (must be of type TokenReview): yaml: line 4: did not find expected node content (737065633a207b746f6b656e3a206162636465662e303132333435363738 ...)`,
			`the object provided is unrecognized (must be of type TokenReview): yaml: line 4: did not find expected node content (REDACTED)`, ""},
		{`the object provided is unrecognized (must be of type Secret): couldn't get version/kind; json parse error: unexpected end (737065)`,
			`the object provided is unrecognized (must be of type Secret): couldn't get version/kind; json parse error: unexpected end (REDACTED)`, ""},
		{`the object provided is unrecognized (must be of type Secret): Object 'Kind' is missing in '{"data":{"pw":"c2VjcmV0"}}' ({"data":{"pw":"c2VjcmV0"}} ...)`,
			"", "c2VjcmV0"},
		{`the object provided is unrecognized (must be of type Secret): Object 'apiVersion' is missing in '{"kind":"Secret","data":{"pw":"it's c2VjcmV0"}}' ({"kind":"Secret","data":{"pw": ...)`,
			`the object provided is unrecognized (must be of type Secret): Object 'apiVersion' is missing in 'REDACTED' (REDACTED)`, ""},
		{`the object provided is unrecognized (must be of type ConfigMap): couldn't get version/kind; json parse error: unexpected end of JSON input (<empty>)`,
			`the object provided is unrecognized (must be of type ConfigMap): couldn't get version/kind; json parse error: unexpected end of JSON input (REDACTED)`, ""},
		// klog's "Unhandled Error": the rendering inside a Go-quoted string, then as is.
		{`apiserver received an error that is not an metav1.Status: &errors.errorString{s:"failed to create typed patch object (/x; /v1, Kind=Secret): .stringData.pins: expected string, got &value.valueUnstructured{Value:[]interface {}{\"44fa}\"}}"}: failed to create typed patch object (/x; /v1, Kind=Secret): .stringData.pins: expected string, got &value.valueUnstructured{Value:[]interface {}{"44fa}"}}`,
			"", "44fa"},
	} {
		got := RedactEchoes(tc.in)
		if tc.want == "" { // the value must be gone, wherever the redaction ends
			if strings.Contains(got, tc.gone) || !strings.Contains(got, Redacted) {
				t.Errorf("RedactEchoes(%q) = %q: the value is not redacted", tc.in, got)
			}
			continue
		}
		if got != tc.want {
			t.Errorf("RedactEchoes(%q)\n got %q\nwant %q", tc.in, got, tc.want)
		}
	}
}

// TestRedactHelmReleasePatches: a patch of a Helm release's ConfigMap has
// no label to tell it by; its name does (a probe: a merge and a JSON
// patch of data.release were kept). A snapshot's ConfigMaps are redacted
// alike (a probe: a snapshot held a release whole).
func TestRedactHelmReleasePatches(t *testing.T) {
	const name = "sh.helm.release.v1.web.v3"
	merge := RedactBodyOf("configmaps", name, map[string]any{"data": map[string]any{"release": "H4sIAAAA"}})
	if want := map[string]any{"data": map[string]any{"release": Redacted}}; !reflect.DeepEqual(merge, want) {
		t.Errorf("merge patch: %v, want %v", merge, want)
	}
	jsonPatch := RedactBodyOf("configmaps", name, []any{map[string]any{"op": "replace", "path": "/data/release", "value": "H4sIAAAA"}})
	if want := []any{map[string]any{"op": "replace", "path": "/data/release", "value": Redacted}}; !reflect.DeepEqual(jsonPatch, want) {
		t.Errorf("JSON patch: %v, want %v", jsonPatch, want)
	}
	binary := RedactBodyOf("configmaps", name, map[string]any{"binaryData": map[string]any{"x": "H4sIAAAA"}})
	if want := map[string]any{"binaryData": map[string]any{"x": Redacted}}; !reflect.DeepEqual(binary, want) {
		t.Errorf("merge patch of binaryData: %v, want %v", binary, want)
	}
	if got := RedactBody("tokenreviews", map[string]any{"kind": "TokenReview", "token": "misplaced-token"}); got.(map[string]any)["token"] != Redacted {
		t.Errorf("a TokenReview's misplaced top-level token kept: %v", got)
	}
	other := RedactBodyOf("configmaps", "settings", map[string]any{"data": map[string]any{"release": "v2"}})
	if want := map[string]any{"data": map[string]any{"release": "v2"}}; !reflect.DeepEqual(other, want) {
		t.Errorf("another ConfigMap's patch: %v, want it kept", other)
	}
	obj := RedactConfigMapObject(map[string]any{"kind": "ConfigMap", "metadata": map[string]any{"name": name, "labels": map[string]any{"owner": "helm"}},
		"data": map[string]any{"release": "H4sIAAAA"}})
	if got := obj["data"].(map[string]any)["release"]; got != Redacted {
		t.Errorf("a snapshot's Helm release ConfigMap: release %v, want it redacted", got)
	}
}

// TestScrubSecretStrings: the values a body's redaction takes out are
// scrubbed from a refusal's free text, as they are, base64-encoded or
// decoded (a probe: a ValidatingAdmissionPolicy's message quoted a
// Secret's data); what the redaction keeps is not.
func TestScrubSecretStrings(t *testing.T) {
	body := map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": "db"},
		"data":       map[string]any{"pw": "aHVudGVyMg=="}, // hunter2
		"stringData": map[string]any{"token": "tok-12345", "pins": []any{"9876", 54321.0}, "x": "ab"}}
	raw, _ := json.Marshal(body)
	values := SecretStrings("secrets", "db", raw)
	msg := `admission webhook denied: pw too short: hunter2 (aHVudGVyMg==), token tok-12345 (dG9rLTEyMzQ1), pins 9876 54321, name db, x ab`
	got := ScrubValues(msg, values)
	for _, gone := range []string{"hunter2", "aHVudGVyMg==", "tok-12345", "dG9rLTEyMzQ1", "9876", "54321"} {
		if strings.Contains(got, gone) {
			t.Errorf("%q left in %q", gone, got)
		}
	}
	for _, kept := range []string{"name db", "x ab", "pw too short"} {
		if !strings.Contains(got, kept) {
			t.Errorf("%q lost from %q", kept, got)
		}
	}
	if v := SecretStrings("configmaps", "plain", []byte(`{"kind":"ConfigMap","data":{"a":"not secret"}}`)); len(v) != 0 {
		t.Errorf("a plain ConfigMap's values: %q", v)
	}
	for _, c := range []struct {
		name, body string
		want       bool
	}{
		{"plain", `{"data":{"a":"b"}}`, false},
		{"plain", `{"data":{"kubeconfig":"apiVersion: v1\nusers: []"}}`, true},
		{"sh.helm.release.v1.web.v1", `{"data":{"release":"H4sI"}}`, true},
		{"plain", `{"binaryData":{"k":"eHl6"}}`, true},
	} {
		if got := ConfigMapMayHoldSecrets(c.name, []byte(c.body)); got != c.want {
			t.Errorf("ConfigMapMayHoldSecrets(%q, %s) = %v, want %v", c.name, c.body, got, c.want)
		}
	}
	// A kubeconfig's credentials on their own, as a policy may quote
	// them (probe AG), in a string and base64-encoded in binaryData.
	kc := "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n    token: kc-token-1234\n    password: kc-pass-5678\n"
	cm, _ := json.Marshal(map[string]any{"kind": "ConfigMap", "data": map[string]any{"kubeconfig": kc},
		"binaryData": map[string]any{"kc": base64.StdEncoding.EncodeToString([]byte(strings.ReplaceAll(kc, "kc-", "bin-")))}})
	values = SecretStrings("configmaps", "cfg", cm)
	got = ScrubValues(`token found: kc-token-1234; password kc-pass-5678; binary bin-token-1234`, values)
	if got != `token found: REDACTED; password REDACTED; binary REDACTED` {
		t.Errorf("a kubeconfig's credentials quoted alone: %q", got)
	}
	// A Secret's data wrapped over lines, as base64(1) prints it: the
	// apiserver decodes it alike, and a policy quotes it on one line.
	long := strings.Repeat("wrapped-secret-", 6)
	enc := base64.StdEncoding.EncodeToString([]byte(long))
	wrapped, _ := json.Marshal(map[string]any{"kind": "Secret", "data": map[string]any{"k": enc[:76] + "\n" + enc[76:]}})
	if got := ScrubValues("quoted: "+enc, SecretStrings("secrets", "w", wrapped)); got != "quoted: REDACTED" {
		t.Errorf("wrapped base64 quoted on one line: %q", got)
	}
}

// TestScrubDerivedValues: what a policy's message makes of a Secret's
// value: a part of it, its case changed, a part base64-encoded (probe
// AH), and the value quoted inside a JSON string, as kubectl's
// last-applied-configuration annotation holds stringData (probe AI).
func TestScrubDerivedValues(t *testing.T) {
	const v = "S3CR3T-AH-VALUE-0001-vap-proto"
	part := v[3:]
	for _, tc := range []struct{ name, msg, secret string }{
		{"a part", "got " + part + " here", part},
		{"a prefix", "starts " + v[:14] + ".", v[:14]},
		{"lowered", "got " + strings.ToLower(v), strings.ToLower(v)},
		{"a part in base64", "got " + base64.StdEncoding.EncodeToString([]byte(part)), base64.StdEncoding.EncodeToString([]byte(part))},
	} {
		got := ScrubValues(tc.msg, []string{v})
		if strings.Contains(got, tc.secret) || !strings.Contains(got, Redacted) {
			t.Errorf("%s: %q scrubbed to %q", tc.name, tc.msg, got)
		}
	}
	if got := ScrubValues("name db-creds in namespace prod is refused", []string{v}); got != "name db-creds in namespace prod is refused" {
		t.Errorf("a message holding no part of the value changed: %q", got)
	}
	for _, sv := range []string{`{"pw": "JsonPw-Tw-5521"}`, "MLfirst-Tw-Q7x\nMLsecond-Tw-Z9k", "Amp&Lt<Tw>Gt-tab\there"} {
		obj, _ := json.Marshal(map[string]any{"stringData": map[string]any{"k": sv}})
		msg := "annotation: " + string(obj)
		got := ScrubValues(msg, []string{sv})
		if strings.Contains(got, "Tw") {
			t.Errorf("%q quoted in JSON: scrubbed to %q", sv, got)
		}
	}
}

// TestScrubRunsBounded: a value of one repeated character quoted in a
// long text is cut out whole, in bounded work.
func TestScrubRunsBounded(t *testing.T) {
	v := strings.Repeat("z", 4000)
	msg := "before " + strings.Repeat("z", 20000) + " after"
	if got := ScrubValues(msg, []string{v}); strings.Contains(got, "zzzzzzzz") {
		t.Errorf("a repeated value left in the text: %d bytes of it", strings.Count(got, "z"))
	}
}
