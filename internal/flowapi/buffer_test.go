package flowapi

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/record"
)

// rec makes record n: ids r00001, ...; even records are alice's 200s,
// odd ones bob's 403s.
func rec(n int) *record.Record {
	r := &record.Record{ID: fmt.Sprintf("r%05d", n)}
	r.Request.Method, r.Request.Path = "GET", "/api/v1/namespaces/default/pods"
	r.Predicted.Status, r.Actual.Status, r.Request.User = 200, 200, "alice"
	if n%2 == 1 {
		r.Predicted.Status, r.Predicted.Stage, r.Actual.Status, r.Request.User = 403, record.StageAuthorization, 403, "bob"
	}
	return r
}

func writeN(b *Buffer, from, to int) {
	for i := from; i <= to; i++ {
		b.Write(rec(i))
	}
}

func ids(recs []*record.Record) string {
	s := make([]string, len(recs))
	for i, r := range recs {
		s[i] = r.ID
	}
	return strings.Join(s, ",")
}

func TestBufferEviction(t *testing.T) {
	for _, tc := range []struct {
		name        string
		capacity    int
		writes      int
		want        string // List(nil, 0)
		evicted     uint64
		gone, found string
	}{
		{"empty", 3, 0, "", 0, "r00001", ""},
		{"under capacity", 3, 2, "r00001,r00002", 0, "r00003", "r00001"},
		{"exactly full", 3, 3, "r00001,r00002,r00003", 0, "r00004", "r00003"},
		{"wrapped once", 3, 4, "r00002,r00003,r00004", 1, "r00001", "r00002"},
		{"wrapped many times", 3, 10, "r00008,r00009,r00010", 7, "r00007", "r00008"},
		{"capacity one", 1, 5, "r00005", 4, "r00004", "r00005"},
		{"capacity below one is one", 0, 2, "r00002", 1, "r00001", "r00002"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBuffer(tc.capacity)
			writeN(b, 1, tc.writes)
			if got := ids(b.List(nil, 0)); got != tc.want {
				t.Errorf("List = %s, want %s", got, tc.want)
			}
			if got := b.Evicted(); got != tc.evicted {
				t.Errorf("Evicted = %d, want %d", got, tc.evicted)
			}
			if _, ok := b.Get(tc.gone); ok {
				t.Errorf("Get(%s) found an evicted or unknown record", tc.gone)
			}
			if tc.found != "" {
				if r, ok := b.Get(tc.found); !ok || r.ID != tc.found {
					t.Errorf("Get(%s) = %v, %v", tc.found, r, ok)
				}
			}
			if b.Len() > b.Capacity() {
				t.Errorf("Len %d > capacity %d", b.Len(), b.Capacity())
			}
		})
	}
}

func TestBufferList(t *testing.T) {
	b := NewBuffer(10)
	writeN(b, 1, 15) // keeps 6..15
	bob := func(r *record.Record) bool { return r.Request.User == "bob" }
	for _, tc := range []struct {
		name  string
		match func(*record.Record) bool
		limit int
		want  string
	}{
		{"all", nil, 0, "r00006,r00007,r00008,r00009,r00010,r00011,r00012,r00013,r00014,r00015"},
		{"newest 3, oldest first", nil, 3, "r00013,r00014,r00015"},
		{"filtered", bob, 0, "r00007,r00009,r00011,r00013,r00015"},
		{"filtered and limited", bob, 2, "r00013,r00015"},
		{"limit beyond what matches", bob, 100, "r00007,r00009,r00011,r00013,r00015"},
		{"nothing matches", func(*record.Record) bool { return false }, 5, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ids(b.List(tc.match, tc.limit)); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

// drain reads a subscription's ready events, writing "missed:N" for a gap.
func drain(s *Subscription) []string {
	var out []string
	for {
		ev, ok, _ := s.TryNext()
		if !ok {
			return out
		}
		if ev.Record == nil {
			out = append(out, fmt.Sprintf("missed:%d", ev.Missed))
			continue
		}
		out = append(out, ev.Record.ID)
	}
}

func TestSubscriptionResume(t *testing.T) {
	for _, tc := range []struct {
		name    string
		from    Resume
		before  int // records written before subscribing (capacity 4)
		after   int // records written after, before reading
		want    []string
		backlog []string
	}{
		{"live only", Resume{Backlog: 0}, 3, 2, []string{"r00004", "r00005"}, nil},
		{"all the backlog", Resume{Backlog: -1}, 6, 1, []string{"r00007"}, []string{"r00003", "r00004", "r00005", "r00006"}},
		{"some backlog", Resume{Backlog: 2}, 6, 0, nil, []string{"r00005", "r00006"}},
		{"after a retained id", Resume{AfterID: "r00004"}, 6, 0, []string{"r00005", "r00006"}, nil},
		{"after the newest id", Resume{AfterID: "r00006"}, 6, 1, []string{"r00007"}, nil},
		{"after an evicted id: exact count", Resume{AfterID: "r00001"}, 8, 0, []string{"missed:3", "r00005", "r00006", "r00007", "r00008"}, nil},
		{"after the id just evicted: nothing missed", Resume{AfterID: "r00002"}, 6, 0, []string{"r00003", "r00004", "r00005", "r00006"}, nil},
		{"after an unknown id: everything evicted", Resume{AfterID: "nope"}, 6, 0, []string{"missed:2", "r00003", "r00004", "r00005", "r00006"}, nil},
		{"unknown id, nothing evicted: everything", Resume{AfterID: "nope"}, 2, 0, []string{"r00001", "r00002"}, nil},
		{"falls behind after subscribing", Resume{Backlog: 0}, 1, 7, []string{"missed:3", "r00005", "r00006", "r00007", "r00008"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBuffer(4)
			writeN(b, 1, tc.before)
			s, backlog := b.Subscribe(tc.from, nil)
			writeN(b, tc.before+1, tc.before+tc.after)
			var gotBacklog []string
			for _, r := range backlog {
				gotBacklog = append(gotBacklog, r.ID)
			}
			if !slices.Equal(gotBacklog, tc.backlog) {
				t.Errorf("backlog %v, want %v", gotBacklog, tc.backlog)
			}
			if got := drain(s); !slices.Equal(got, tc.want) {
				t.Errorf("events %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSubscriptionWakesOnWrite(t *testing.T) {
	b := NewBuffer(4)
	s, _ := b.Subscribe(Resume{}, func(r *record.Record) bool { return r.Request.User == "bob" })
	_, ok, wait := s.TryNext()
	if ok {
		t.Fatal("an event before any write")
	}
	b.Write(rec(2)) // alice: wakes, but does not match
	<-wait
	if got := drain(s); len(got) != 0 {
		t.Fatalf("events %v, want none", got)
	}
	done := make(chan struct{})
	go b.Write(rec(3))
	ev, ok := s.Next(done)
	if !ok || ev.Record.ID != "r00003" {
		t.Fatalf("Next = %+v, %v", ev, ok)
	}
	close(done)
	if _, ok := s.Next(done); ok {
		t.Fatal("Next returned an event after done")
	}
}

// TestWriteWithStuckSubscribers writes into a buffer with many stuck
// subscribers: none of them holds anything, so the writer does the same
// work whatever they do.
func TestWriteWithStuckSubscribers(t *testing.T) {
	b := NewBuffer(8)
	subs := make([]*Subscription, 1000)
	for i := range subs {
		subs[i], _ = b.Subscribe(Resume{}, nil)
		_, _, _ = subs[i].TryNext() // waiting, never reading again
	}
	writeN(b, 1, 10000)
	if got := drain(subs[0]); got[0] != "missed:9992" || len(got) != 9 {
		t.Fatalf("a stuck subscriber got %v, want missed:9992 then the 8 newest", got)
	}
}
