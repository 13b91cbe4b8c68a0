package proxy

import (
	"fmt"
	"testing"
	"time"
)

func TestTokenCallers(t *testing.T) {
	now := time.Date(2026, 12, 6, 20, 0, 0, 0, time.UTC)
	var c tokenCallers
	a, b := keyOfToken("token-a"), keyOfToken("token-b")
	c.note(a, "alice", []string{"devs"}, now)
	c.note(tokenKey{}, "nobody", nil, now) // no token: not kept
	c.note(b, "", nil, now)                // no name: not kept
	for _, tc := range []struct {
		key  tokenKey
		at   time.Time
		want string // "" for none
	}{
		{a, now.Add(time.Minute), "alice"},
		{a, now.Add(callerTTL), "alice"},
		{a, now.Add(callerTTL + time.Second), ""},
		{b, now, ""},
		{tokenKey{}, now, ""},
		{keyOfToken("token-c"), now, ""},
	} {
		got, ok := c.lookup(tc.key, tc.at)
		if (tc.want != "") != ok || got.name != tc.want {
			t.Errorf("lookup at +%s: %q %v, want %q", tc.at.Sub(now), got.name, ok, tc.want)
		}
	}
	// Full: the names past their TTL go, then the oldest quarter.
	for i := range callersKept + 10 {
		c.note(keyOfToken(fmt.Sprint("t", i)), "u", nil, now.Add(time.Duration(i)*time.Millisecond))
	}
	if n := len(c.m); n > callersKept {
		t.Errorf("%d callers kept, want at most %d", n, callersKept)
	}
	if _, ok := c.lookup(keyOfToken("t0"), now.Add(time.Minute)); ok {
		t.Error("the oldest caller was kept past a prune")
	}
	if _, ok := c.lookup(keyOfToken(fmt.Sprint("t", callersKept+9)), now.Add(time.Minute)); !ok {
		t.Error("the newest caller was pruned")
	}
}
