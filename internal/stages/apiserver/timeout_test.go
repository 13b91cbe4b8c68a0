package apiserver

import (
	"context"
	"fmt"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestReplayTimedOut tells the handler's 504 for a context that ended
// (the replay's own deadline: never a prediction) from the apiserver's
// other 504s, which stay predictions.
func TestReplayTimedOut(t *testing.T) {
	status := func(err error) *metav1.Status {
		st := err.(apierrors.APIStatus).Status()
		return &st
	}
	for _, tc := range []struct {
		name string
		st   *metav1.Status
		want bool
	}{
		{"the finisher's timeout", status(apierrors.NewTimeoutError(fmt.Sprintf("request did not complete within requested timeout - %s", context.DeadlineExceeded), 0)), true},
		{"a webhook dispatcher's timeout", status(apierrors.NewTimeoutError("request did not complete within requested timeout", 0)), true},
		{"a resourceVersion too far ahead", status(apierrors.NewTimeoutError("Too large resource version: 12, current: 10", 1)), false},
		{"a storage server timeout", status(apierrors.NewServerTimeout(schema.GroupResource{Resource: "pods"}, "get", 2)), false},
		{"no status", nil, false},
	} {
		if got := replayTimedOut(tc.st); got != tc.want {
			t.Errorf("%s: replayTimedOut = %v, want %v", tc.name, got, tc.want)
		}
	}
}
