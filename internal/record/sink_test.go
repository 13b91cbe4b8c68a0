package record

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestFileSinkConcurrent writes from many goroutines and expects every
// line to be one whole record.
func TestFileSinkConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.jsonl")
	s, err := OpenFile(path, func(err error) { t.Error(err) })
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			s.Write(&Record{ID: string(rune('a' + i%26)), Stages: []StageResult{{Name: "authentication", Outcome: Skip}}})
		}(i)
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %d: %v", n, err)
		}
		n++
	}
	if n != 50 {
		t.Fatalf("%d records, want 50", n)
	}
}

func TestOpenFileError(t *testing.T) {
	_, err := OpenFile(filepath.Join(t.TempDir(), "missing-dir", "c.jsonl"), nil)
	if err == nil {
		t.Fatal("want an error for a missing directory")
	}
}

func TestStreamDropsForSlowSubscriber(t *testing.T) {
	s := NewStream()
	ch, dropped, cancel := s.Subscribe(1)
	defer cancel()
	s.Write(&Record{ID: "1"})
	s.Write(&Record{ID: "2"})
	if r := <-ch; r.ID != "1" {
		t.Fatalf("got %s", r.ID)
	}
	if dropped() != 1 {
		t.Fatalf("dropped %d, want 1", dropped())
	}
}
