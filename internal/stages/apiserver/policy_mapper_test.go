package apiserver

import (
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery/cached/memory"
	fakediscovery "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/restmapper"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestFreshMapperRetry: the replay's REST mapper reads discovery again
// for a kind it does not know, at most every mapperRetry.
func TestFreshMapperRetry(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1e9, 0))
	m := &freshMapper{clock: clk}
	noMatch := &meta.NoKindMatchError{GroupKind: schema.GroupKind{Group: "x.test", Kind: "Dial"}}
	m.DeferredDiscoveryRESTMapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(fakediscovery.NewSimpleClientset().Discovery()))
	for _, step := range []struct {
		after time.Duration
		err   error
		want  bool
	}{
		{0, noMatch, true},
		{time.Second, noMatch, false},
		{mapperRetry, noMatch, true},
		{mapperRetry, errors.New("connection refused"), false},
		{mapperRetry, nil, false},
	} {
		clk.SetTime(clk.Now().Add(step.after))
		if got := m.again(step.err); got != step.want {
			t.Errorf("after %v, %v: again = %v, want %v", step.after, step.err, got, step.want)
		}
	}
}
