package apiserver

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestShedGuard: the replay calls no admission webhook for a request the
// apiserver already shed for load (its plain-text 429), saying so; any
// other answer, or none yet, lets the call through.
func TestShedGuard(t *testing.T) {
	calls := 0
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { calls++ }))
	defer hook.Close()
	for _, tc := range []struct {
		name     string
		answered bool
		answer   Answer
		called   bool
	}{
		{"shed for load", true, Answer{Status: http.StatusTooManyRequests}, false},
		{"a 429 with a Status (an admission plugin's)", true, Answer{Status: http.StatusTooManyRequests, Refusal: &metav1.Status{Code: 429}}, true},
		{"admitted", true, Answer{Status: http.StatusCreated}, true},
		{"not answered yet", false, Answer{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls = 0
			r := &Run{actual: func(ctx context.Context) (Answer, bool) {
				if !tc.answered {
					<-ctx.Done()
					return Answer{}, false
				}
				return tc.answer, true
			}}
			req, _ := http.NewRequestWithContext(withRun(context.Background(), r), "POST", hook.URL, nil)
			resp, err := shedGuard{http.DefaultTransport}.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			if (calls == 1) != tc.called || (err == nil) != tc.called {
				t.Errorf("webhook called %d times, error %v; want called %v", calls, err, tc.called)
			}
			if !tc.called && r.Unknown != shedWhy {
				t.Errorf("run unknown %q, want %q", r.Unknown, shedWhy)
			}
		})
	}
}
