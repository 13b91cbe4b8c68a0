package apiserver

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"
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

// TestLateInformerNotGated: an informer registered after Start began (an
// admission policy's paramKind informer, for ConfigMap params) that
// cannot sync does not hold Start, nor every prediction, unknown: the
// gate counts the replay's own informers (a clean-clone CI run of the
// example suite waited its minute so, then said "not synced" for every
// case, when the policy was loaded during the wait).
func TestLateInformerNotGated(t *testing.T) {
	cs := fake.NewClientset()
	cs.PrependReactor("list", "namespaces", func(clienttesting.Action) (bool, runtime.Object, error) {
		time.Sleep(300 * time.Millisecond) // the replay's own informer syncs after the late one is added
		return false, nil, nil
	})
	cs.PrependReactor("list", "configmaps", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "", errors.New("kproxy may not list configmaps"))
	})
	f := informers.NewSharedInformerFactory(cs, 0)
	f.Core().V1().Namespaces().Informer()
	s := &ClusterState{Informers: f}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		time.Sleep(100 * time.Millisecond)
		f.Core().V1().ConfigMaps().Informer()
		f.Start(ctx.Done())
	}()
	if err := s.Start(ctx, 10*time.Second); err != nil {
		t.Fatalf("Start: %v, want the replay's own informers synced", err)
	}
	if !s.Synced() {
		t.Error("Synced: false, want true (the late ConfigMap informer is not the replay's)")
	}
	if f.Core().V1().ConfigMaps().Informer().HasSynced() {
		t.Error("the late informer synced: the test does not test the late informer that cannot")
	}
}
