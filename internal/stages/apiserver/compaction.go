package apiserver

import (
	"context"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
)

// etcd's history is compacted by the apiserver itself, every 5 minutes
// (--etcd-compaction-interval): it writes the revision it compacts at to
// the key compact_rev_key, then compacts. A list at a compacted revision
// (resourceVersionMatch=Exact, a legacy exact list with a limit, a
// continue token) is answered from the apiserver's watch cache while it
// holds a snapshot of that revision (ListFromCacheSnapshot), and else by
// etcd: 410 Expired. The watch cache drops its snapshots before a
// compaction once its compactor has read the compaction's revision,
// which it does every 15 s. So a compaction past the list's revision,
// written long enough before the request arrived, leaves etcd's answer
// as the apiserver's; one written just before it, the watch cache's
// snapshots may still serve the list. kproxy follows compact_rev_key
// itself, and notes when it saw each revision.

// compactRevKey is the key the apiserver writes the revision of each
// compaction to (k8s.io/apiserver's etcd3 compactor).
const compactRevKey = "compact_rev_key"

// cacherCompactLag is how long after a compaction's revision is written
// the apiserver's watch cache has surely dropped its snapshots before it:
// its compactor reads the revision every 15 s, and a few seconds more.
const cacherCompactLag = 20 * time.Second

// compactions are the compaction revisions kproxy saw written, in order,
// with when it saw each.
type compactions struct {
	clock clock.PassiveClock
	mu    sync.Mutex
	seen  []compactionSeen
}

type compactionSeen struct {
	rev int64
	at  time.Time
}

// add notes a compaction revision seen now (older or equal ones add
// nothing); it keeps the last few.
func (c *compactions) add(rev int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := len(c.seen); n > 0 && rev <= c.seen[n-1].rev {
		return
	}
	c.seen = append(c.seen, compactionSeen{rev: rev, at: c.clock.Now()})
	if len(c.seen) > 16 {
		c.seen = c.seen[1:]
	}
}

// expired reports the first compaction kproxy saw past revision rv, if
// it saw it at least cacherCompactLag before arrival: the apiserver's
// watch cache no longer holds rv then.
func (c *compactions) expired(rv int64, arrival time.Time) (compactionSeen, bool) {
	if c == nil || arrival.IsZero() {
		return compactionSeen{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.seen {
		if s.rev > rv {
			return s, !s.at.Add(cacherCompactLag).After(arrival)
		}
	}
	return compactionSeen{}, false
}

// reachedBefore reports that etcd had reached revision rv before t: a
// compaction at or past rv was written before then (a compaction's
// revision is one etcd had reached when it was written).
func (c *compactions) reachedBefore(rv int64, t time.Time) bool {
	if c == nil || t.IsZero() {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.seen {
		if s.rev >= rv && s.at.Before(t) {
			return true
		}
	}
	return false
}

// follow reads compact_rev_key and watches it, again after any failure,
// until ctx ends. A revision read at start counts as seen then: when it
// was written is not known.
func (c *compactions) follow(ctx context.Context, client *clientv3.Client) {
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		resp, err := client.Get(ctx, compactRevKey)
		if err != nil {
			return
		}
		if len(resp.Kvs) > 0 {
			c.addValue(resp.Kvs[0].Value)
		}
		for wr := range client.Watch(ctx, compactRevKey, clientv3.WithRev(resp.Header.Revision+1)) {
			if wr.Err() != nil {
				return
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut {
					c.addValue(ev.Kv.Value)
				}
			}
		}
	}, 5*time.Second)
}

func (c *compactions) addValue(v []byte) {
	if rev, err := strconv.ParseInt(string(v), 10, 64); err == nil && rev > 0 {
		c.add(rev)
	}
}
