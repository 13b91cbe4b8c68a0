package tui

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/source"
)

// The TUI's speed targets (make bench): a 100,000-record capture shows
// its first screen within 1 s and takes a filter within 200 ms; a live
// feed of 2,000 records a second costs the UI a small part of a core.

const benchFlows = 100_000

// writeCapture writes n records, copies of the demo's with their own IDs
// and times, as a capture file.
func writeCapture(b *testing.B, n int) string {
	b.Helper()
	recs := demoRecords(b)
	path := filepath.Join(b.TempDir(), "capture.jsonl")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	enc := json.NewEncoder(f)
	for i := 0; i < n; i++ {
		r := *recs[i%len(recs)]
		r.ID = fmt.Sprintf("flow-%07d", i)
		r.Start = r.Start.Add(time.Duration(i) * time.Millisecond)
		if err := enc.Encode(&r); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	return path
}

// load runs a file source into a model as the program would, timing the
// first screen and the whole file.
func load(b *testing.B, path string) (m *Model, first, all time.Duration) {
	b.Helper()
	start := time.Now()
	events := make(chan source.Event, 64)
	go func() {
		defer close(events)
		_ = source.File(path, false).Run(context.Background(), events)
	}()
	m = newTestModel(b, Options{})
	m.events = events
	for cmd := m.Init(); cmd != nil; {
		msg := cmd()
		_, cmd = m.Update(msg)
		_ = m.View()
		if first == 0 && len(m.flows.shown) > 0 {
			first = time.Since(start)
		}
		if _, ended := msg.(sourceEnded); ended {
			break
		}
	}
	return m, first, time.Since(start)
}

func BenchmarkCapture100k(b *testing.B) {
	path := writeCapture(b, benchFlows)
	b.ResetTimer()
	var first, all, filter time.Duration
	for i := 0; i < b.N; i++ {
		m, f, a := load(b, path)
		if len(m.flows.all) != benchFlows {
			b.Fatalf("%d flows loaded, want %d", len(m.flows.all), benchFlows)
		}
		first, all = first+f, all+a

		start := time.Now()
		send(m, tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune("/")})
		typeText(m, "~c 4xx & !~u admin")
		send(m, tea.KeyMsg{Type: tea.KeyEnter})
		_ = m.View()
		filter += time.Since(start)
		if len(m.flows.shown) == 0 || len(m.flows.shown) == benchFlows {
			b.Fatalf("the filter shows %d of %d", len(m.flows.shown), benchFlows)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(first.Milliseconds())/n, "ms-first-screen")
	b.ReportMetric(float64(all.Milliseconds())/n, "ms-all-loaded")
	b.ReportMetric(float64(filter.Milliseconds())/n, "ms-filter")
}

// BenchmarkLiveFeed is the cost of one live record: the update and a
// redraw (bubbletea draws at most 60 frames a second, and a burst arrives
// as one batch, so this is an upper bound).
func BenchmarkLiveFeed(b *testing.B) {
	recs := demoRecords(b)
	m := newTestModel(b, Options{MaxFlows: benchFlows})
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := *recs[i%len(recs)]
		m.Update(eventsMsg{{Records: []*record.Record{&r}}})
		_ = m.View()
	}
	perRecord := b.Elapsed() / time.Duration(max(b.N, 1))
	// At 2,000 records a second, the share of one core the UI spends.
	b.ReportMetric(float64(perRecord*2000)/float64(time.Second)*100, "%core-at-2000/s")
}
