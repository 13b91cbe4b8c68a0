package serve

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

// TestReachable: any HTTP answer to /version is an apiserver that is
// there (a 403 for an identity that may not read it too); no answer is
// an error that names the address and the cause.
func TestReachable(t *testing.T) {
	forbidden := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403}`))
	}))
	defer forbidden.Close()
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"major":"1","minor":"37","gitVersion":"v1.37.2"}`))
	}))
	defer up.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "https://" + ln.Addr().String()
	ln.Close()
	for _, tc := range []struct {
		name, host string
		wantErr    []string
	}{
		{"an apiserver that answers", up.URL, nil},
		{"an apiserver that forbids /version", forbidden.URL, nil},
		{"nothing listening", closed, []string{"cannot reach the apiserver at " + closed, "connection refused"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Reachable(context.Background(), &rest.Config{Host: tc.host, TLSClientConfig: rest.TLSClientConfig{Insecure: true}})
			if tc.wantErr == nil {
				if err != nil {
					t.Errorf("Reachable: %v", err)
				}
				return
			}
			for _, w := range tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("Reachable: %v, want an error containing %q", err, w)
				}
			}
		})
	}
}
