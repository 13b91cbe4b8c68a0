package proxy

import (
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/utils/clock"
)

// TestReplayNice: with a nice value, each replay runs on a thread of that
// nice value, and the goroutine that submits it (forwarding) keeps
// kproxy's own; without one, replays run at kproxy's.
func TestReplayNice(t *testing.T) {
	own := threadNice(t)
	for _, tc := range []struct {
		nice, want int
	}{
		{nice: 0, want: own},
		{nice: 7, want: max(own, 7)},
		{nice: 19, want: 19},
	} {
		q := newReplayPool(1, 4, clock.RealClock{}, nil)
		q.nice = tc.nice
		got := make(chan int, 3)
		for range 3 {
			if !q.submit(func() { got <- threadNice(t) }, false) {
				t.Fatal("a replay was shed by an idle pool")
			}
		}
		for range 3 {
			if n := <-got; n != tc.want {
				t.Errorf("--replay-nice=%d: a replay ran at nice %d, want %d", tc.nice, n, tc.want)
			}
		}
		if n := threadNice(t); n != own {
			t.Errorf("--replay-nice=%d: the submitting thread's nice is %d, want kproxy's own %d", tc.nice, n, own)
		}
	}
}

// threadNice is the nice value of the calling thread (the getpriority
// system call answers 20 minus it).
func threadNice(t *testing.T) int {
	t.Helper()
	p, err := unix.Getpriority(unix.PRIO_PROCESS, unix.Gettid())
	if err != nil {
		t.Fatal(err)
	}
	return 20 - p
}
