package apiserver

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// TestReplayReadsShed: a write replay's reads through the apiserver are
// shed past their rate (bursts of twice it), saying which flag bounds
// them, rather than queued behind client-go's throttle.
func TestReplayReadsShed(t *testing.T) {
	s := &ClusterState{}
	if err := s.admitRead(); err != nil {
		t.Fatalf("no limit set: %v", err)
	}
	s.SetReplayReadQPS(1)
	for i := range 2 {
		if err := s.admitRead(); err != nil {
			t.Fatalf("read %d within the burst: %v", i, err)
		}
	}
	err := s.admitRead()
	if err == nil || !strings.Contains(err.Error(), "--replay-apiserver-qps=1") {
		t.Errorf("a read past the burst: %v, want it shed naming --replay-apiserver-qps", err)
	}
}

// TestSecretListObserved: a list of secrets the apiserver answers with an
// error is seen at once (SecretsErr), while client-go, which retries a
// 429 by itself, still gets the answer untouched.
func TestSecretListObserved(t *testing.T) {
	tooMany := `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"storage is (re)initializing","reason":"TooManyRequests","code":429}`
	for _, tc := range []struct {
		name    string
		answers []func(http.ResponseWriter)
		wantErr string // "" : none recorded
	}{
		{"a 429, then the list", []func(http.ResponseWriter){
			func(w http.ResponseWriter) {
				w.Header().Set("Retry-After", "1")
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusTooManyRequests)
				_, _ = io.WriteString(w, tooMany)
			},
			func(w http.ResponseWriter) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, `{"kind":"SecretList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[]}`)
			},
		}, "a list of secrets was answered 429: storage is (re)initializing"},
		{"the list", []func(http.ResponseWriter){
			func(w http.ResponseWriter) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, `{"kind":"SecretList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[]}`)
			},
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				tc.answers[min(int(n.Add(1))-1, len(tc.answers)-1)](w)
			}))
			defer srv.Close()
			s, err := NewClusterState(&rest.Config{Host: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			c, err := s.SecretsClient()
			if err != nil {
				t.Fatal(err)
			}
			list, err := c.CoreV1().Secrets("kube-system").List(context.Background(), metav1.ListOptions{})
			if err != nil || list.ResourceVersion != "7" {
				t.Fatalf("the client's list: %v, %+v; want the list answered last", err, list)
			}
			got := s.SecretsErr()
			switch {
			case tc.wantErr == "" && got != nil:
				t.Errorf("SecretsErr: %v, want none", got)
			case tc.wantErr != "" && (got == nil || got.Error() != tc.wantErr):
				t.Errorf("SecretsErr: %v, want %q", got, tc.wantErr)
			}
		})
	}
}
