package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/record"
	"github.com/kproxy/kproxy/internal/serve"
	"github.com/kproxy/kproxy/internal/source"
)

// TestCaptureRotation: kproxy serve --capture-maxsize --capture-compress
// in front of the real apiserver: the capture file is rotated as it
// fills, the rotated files are gzipped, and reading them all back the way
// kproxy flows does finds every request's record exactly once.
func TestCaptureRotation(t *testing.T) {
	dir := t.TempDir()
	capture := filepath.Join(dir, "capture.jsonl")
	k := startKproxy(t, kproxyOptions{capture: capture, set: func(o *serve.Options) {
		o.CaptureRotation = record.Rotation{MaxSize: 8 << 10, Compress: true}
	}})
	r := reverseRoute(k)
	c := r.client(nil)
	const n = 24
	for i := range n {
		path := fmt.Sprintf("/api/v1/namespaces/%s/configmaps/rotation-%d", testNS, i)
		if got := do(t, c, r.base, request{method: "GET", path: path, user: "admin"}); got.status != 404 {
			t.Fatalf("GET %s: %d %s", path, got.status, got.body)
		}
	}
	k.stop() // flushes the capture, and waits for the compression

	files, _ := filepath.Glob(filepath.Join(dir, "capture*"))
	var rotated int
	seen := map[string]int{}
	for _, f := range files {
		base := filepath.Base(f)
		switch {
		case base == "capture.jsonl":
		case strings.HasPrefix(base, "capture-") && strings.HasSuffix(base, ".jsonl.gz"):
			rotated++
		default:
			t.Errorf("unexpected file %s (rotated files are capture-TIME.jsonl.gz)", base)
		}
		for _, rec := range readSource(t, source.File(f, false)) {
			if strings.Contains(rec.Request.Path, "/configmaps/rotation-") {
				seen[rec.Request.Path]++
			}
		}
	}
	if rotated < 2 {
		t.Errorf("%d rotated files of %d records at 8 KiB each: want several (%v)", rotated, n, files)
	}
	for i := range n {
		path := fmt.Sprintf("/api/v1/namespaces/%s/configmaps/rotation-%d", testNS, i)
		if seen[path] != 1 {
			t.Errorf("%s: %d records across the capture files, want 1", path, seen[path])
		}
	}
}

// readSource reads a source to its end.
func readSource(t *testing.T, src source.Source) []*record.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := make(chan source.Event, 16)
	errc := make(chan error, 1)
	go func() { errc <- src.Run(ctx, out) }()
	var recs []*record.Record
	for {
		select {
		case ev := <-out:
			recs = append(recs, ev.Records...)
			if ev.Done {
				return recs
			}
		case err := <-errc:
			for len(out) > 0 {
				ev := <-out
				recs = append(recs, ev.Records...)
			}
			if err != nil {
				t.Fatalf("%s: %v", src.Name(), err)
			}
			return recs
		case <-ctx.Done():
			t.Fatalf("%s: not read within 30s", src.Name())
		}
	}
}
