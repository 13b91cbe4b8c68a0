package proxy

import (
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestKeepConnectionNamed: the headers a client's Connection header names
// go on to the apiserver, which reads them when they come to it directly;
// those RFC 9110 makes a connection's own stay behind.
func TestKeepConnectionNamed(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   http.Header
		want http.Header // what is put back on the outbound request
	}{
		{"none named", http.Header{"Connection": {"keep-alive"}, "Impersonate-User": {"erin"}}, http.Header{}},
		{"Impersonate-User named", http.Header{"Connection": {"Impersonate-User"}, "Impersonate-User": {"erin"}},
			http.Header{"Impersonate-User": {"erin"}}},
		{"lower case, among others, twice", http.Header{"Connection": {"keep-alive, authorization", " impersonate-group "}, "Authorization": {"Bearer t"}, "Impersonate-Group": {"a", "b"}},
			http.Header{"Authorization": {"Bearer t"}, "Impersonate-Group": {"a", "b"}}},
		{"a connection's own stays behind", http.Header{"Connection": {"Upgrade, Proxy-Authorization, Te"}, "Upgrade": {"websocket"}, "Proxy-Authorization": {"Basic x"}, "Te": {"trailers"}},
			http.Header{}},
		{"named but absent", http.Header{"Connection": {"X-Absent"}}, http.Header{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := http.Header{}
			keepConnectionNamed(tc.in, out)
			if d := cmp.Diff(tc.want, out); d != "" {
				t.Errorf("put back (-want +got):\n%s", d)
			}
		})
	}
}
