package proxy

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/stages"
)

// A bearer token names no user until something authenticates it, and for
// kproxy that is the replay. A request whose replay is shed (kproxy over
// its budget) or left out by --replay-filter would then be recorded with
// no user, and overload is when an operator most asks who is sending what
// (--stats, ~u). So kproxy remembers, for a while, who the replay
// authenticated each token as, keyed by the token's SHA-256 (the token
// itself is never kept), and names an unreplayed request's caller from
// it, saying so in its authentication stage: a name from an earlier
// replay, not a verdict on this request.

// Bounds of what is remembered: a token's user changes rarely (a
// service account's token names it in its claims), and a name older than
// callerTTL is not used.
const (
	callerTTL     = 10 * time.Minute
	callersKept   = 16384
	callersPruned = callersKept / 4
)

// tokenKey is the SHA-256 of a bearer token; the zero key is none.
type tokenKey [sha256.Size]byte

func keyOfToken(token string) tokenKey {
	if token == "" {
		return tokenKey{}
	}
	return sha256.Sum256([]byte(token))
}

type knownCaller struct {
	name   string
	groups []string
	at     time.Time
}

// tokenCallers is who the replay last authenticated each token as.
type tokenCallers struct {
	mu sync.Mutex
	m  map[tokenKey]knownCaller
}

// note remembers that the replay authenticated the token keyed k as name
// in groups, at now.
func (c *tokenCallers) note(k tokenKey, name string, groups []string, now time.Time) {
	if k == (tokenKey{}) || name == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.m[k]; ok && old.name == name && slices.Equal(old.groups, groups) {
		old.at = now
		c.m[k] = old
		return
	}
	if c.m == nil {
		c.m = map[tokenKey]knownCaller{}
	}
	if len(c.m) >= callersKept {
		c.prune(now)
	}
	c.m[k] = knownCaller{name: name, groups: slices.Clone(groups), at: now}
}

// prune drops the names past callerTTL and, if that leaves the map full,
// the oldest quarter.
func (c *tokenCallers) prune(now time.Time) {
	for k, v := range c.m {
		if now.Sub(v.at) > callerTTL {
			delete(c.m, k)
		}
	}
	if len(c.m) < callersKept {
		return
	}
	ats := make([]time.Time, 0, len(c.m))
	for _, v := range c.m {
		ats = append(ats, v.at)
	}
	slices.SortFunc(ats, func(a, b time.Time) int { return a.Compare(b) })
	cut := ats[callersPruned]
	for k, v := range c.m {
		if v.at.Before(cut) {
			delete(c.m, k)
		}
	}
}

// lookup is who the replay authenticated the token keyed k as, within
// callerTTL of now.
func (c *tokenCallers) lookup(k tokenKey, now time.Time) (knownCaller, bool) {
	if k == (tokenKey{}) {
		return knownCaller{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[k]
	if !ok || now.Sub(v.at) > callerTTL {
		return knownCaller{}, false
	}
	return v, true
}

// namedFromEarlierReplay is o (an unreplayed outcome, shared by many
// records) with its authentication stage saying where the record's user
// came from; o's stages are copied, not changed.
func namedFromEarlierReplay(o stages.Outcome, c knownCaller, now time.Time) stages.Outcome {
	st := slices.Clone(o.Stages)
	for i := range st {
		if st[i].Name == record.StageAuthentication {
			st[i].Explanation += fmt.Sprintf("; the caller is named as kproxy's replay authenticated the same bearer token %s before (user %q)",
				now.Sub(c.at).Truncate(time.Second), c.name)
		}
	}
	o.Stages = st
	return o
}
