package source

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/kproxy/kproxy/internal/record"
)

// delivered is what a source delivered: each record as JSON, and the
// count of lines it could not read.
type delivered struct {
	records []string
	skipped int
}

// expected is what a capture should deliver, line by line: a line that
// unmarshals into a record with an id is that record, a blank line is
// nothing, any other line is skipped and counted. The last line counts
// even without its newline (the stream ended).
func expected(t *testing.T, data []byte) delivered {
	t.Helper()
	var d delivered
	for _, l := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(l)) == 0 {
			continue
		}
		var r record.Record
		if json.Unmarshal(l, &r) != nil || r.ID == "" || r.Start.IsZero() || r.Request.Method == "" {
			d.skipped++
			continue
		}
		d.records = append(d.records, recordJSON(t, &r))
	}
	return d
}

func recordJSON(t *testing.T, r *record.Record) string {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatalf("record %s does not marshal: %v", r.ID, err)
	}
	return string(b)
}

// collect runs src to its end.
func collect(t *testing.T, src Source) delivered {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	out := make(chan Event, 16)
	errc := make(chan error, 1)
	go func() { errc <- src.Run(ctx, out) }()
	var d delivered
	take := func(ev Event) {
		for _, r := range ev.Records {
			if r == nil || r.ID == "" {
				t.Fatalf("%s delivered a record without an id", src.Name())
			}
			d.records = append(d.records, recordJSON(t, r))
		}
		d.skipped += ev.Skipped
	}
	for {
		select {
		case ev := <-out:
			take(ev)
			if ev.Done {
				if err := <-errc; err != nil {
					t.Fatalf("%s: %v", src.Name(), err)
				}
				return d
			}
		case err := <-errc:
			// Run returns after its last send: what it sent is buffered.
			for len(out) > 0 {
				ev := <-out
				take(ev)
				if ev.Done && err == nil {
					return d
				}
			}
			t.Fatalf("%s ended without Done: %v", src.Name(), err)
		case <-ctx.Done():
			t.Fatalf("%s did not end in %s", src.Name(), wait)
		}
	}
}

// chunked returns data in reads of the sizes cuts gives (each byte plus
// one; at most eight reads so sized), then the rest in one read.
type chunked struct {
	data []byte
	cuts []byte
}

func (c *chunked) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := len(c.data)
	if len(c.cuts) > 0 {
		n = min(n, int(c.cuts[0])+1)
		c.cuts = c.cuts[1:]
	}
	n = copy(p, c.data[:n])
	c.data = c.data[n:]
	if len(c.data) == 0 {
		return n, io.EOF
	}
	return n, nil
}

// captureSeeds are single lines of the capture files under testdata (a
// few when fuzzing: a capture line is kilobytes), three lines together,
// and hand-made edge cases.
func captureSeeds(f *testing.F) [][]byte {
	f.Helper()
	var lines [][]byte
	for _, p := range []string{"flows/sample.jsonl", "tui/demo.jsonl"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "testdata", p))
		if err != nil {
			f.Fatal(err)
		}
		for _, l := range bytes.SplitAfter(b, []byte("\n")) {
			if len(l) > 0 {
				lines = append(lines, l)
			}
		}
	}
	seeds := lines
	if fl := flag.Lookup("test.fuzz"); fl != nil && fl.Value.String() != "" {
		seeds = [][]byte{lines[0], lines[len(lines)/2], lines[len(lines)-1]}
	}
	seeds = append(seeds, bytes.Join([][]byte{lines[1], lines[2], lines[3]}, nil))
	for _, s := range []string{"", "\n", "\n\n \r\n", `{"id":"a"}`, `{"id":"a"}` + "\n" + `{"id":""}` + "\n" + `{"id":"b"`, "null\n[]\n{}\n\"x\"\n",
		`{"id":"a"} ` + "\r\n" + `{"id":"b"}{"id":"c"}` + "\n", `{"id":"a","start":"not a time"}` + "\n", `{"id":"\ud800"}` + "\n\xff\n",
		`{"id":"a","request":{"groups":[1]}}` + "\n" + `{"ID":"case"}`,
		`{"id":"a","start":"2026-12-06T08:00:00Z","request":{"method":"GET"}}` + "\n" + `{"id":"log line","level":"info"}` + "\n"} {
		seeds = append(seeds, []byte(s))
	}
	return seeds
}

// FuzzCaptureReader reads arbitrary bytes as a capture stream (kproxy
// flows -, a capture file). It checks that a line is delivered as a
// record exactly when it unmarshals into one with an id, a start and a
// method (what every record has), that any other
// non-blank line is counted as skipped, and that this does not depend on
// how the bytes arrive (reads of any size, a pipe or a file); and that a
// torn last line (a record line cut before its end, as a writer killed
// mid-line leaves it) is never delivered as a record, but counted. It
// also checks the line splitter's overlong-line accounting with a small
// limit.
func FuzzCaptureReader(f *testing.F) {
	for i, s := range captureSeeds(f) {
		f.Add(s, []byte{0, 3, 200, 7}, uint16(len(s)/2+i))
	}
	f.Fuzz(func(t *testing.T, data, cuts []byte, cut uint16) {
		if len(cuts) > 8 {
			cuts = cuts[:8]
		}
		want := expected(t, data)
		got := collect(t, Reader("stdin", &chunked{data: data, cuts: cuts}))
		sameDelivery(t, "the stream", data, got, want)

		path := filepath.Join(t.TempDir(), "capture.jsonl")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		sameDelivery(t, "the file", data, collect(t, File(path, false)), want)

		// Tear the stream at cut: if that falls inside a record line,
		// before its closing brace, the torn line is no record.
		p := int(cut) % (len(data) + 1)
		start := bytes.LastIndexByte(data[:p], '\n') + 1
		end := len(data)
		if i := bytes.IndexByte(data[start:], '\n'); i >= 0 {
			end = start + i
		}
		torn := collect(t, Reader("stdin", bytes.NewReader(data[:p])))
		full := expected(t, data[start:end])
		if len(full.records) == 1 && p-start < len(bytes.TrimRight(data[start:end], " \t\r")) {
			before := expected(t, data[:start])
			if len(bytes.TrimSpace(data[start:p])) > 0 {
				before.skipped++
			}
			sameDelivery(t, "a stream torn inside a record line", data[:p], torn, before)
		} else {
			sameDelivery(t, "a stream cut short", data[:p], torn, expected(t, data[:p]))
		}

		checkLines(t, data, cuts, int(cut%97)+1)
	})
}

func sameDelivery(t *testing.T, what string, data []byte, got, want delivered) {
	t.Helper()
	if got.skipped != want.skipped || len(got.records) != len(want.records) {
		t.Fatalf("%s %q delivers %d records and %d skipped lines, want %d and %d", what, data, len(got.records), got.skipped, len(want.records), want.skipped)
	}
	for i := range got.records {
		if got.records[i] != want.records[i] {
			t.Fatalf("%s %q: record %d is\n%s\nwant\n%s", what, data, i, got.records[i], want.records[i])
		}
	}
}

// checkLines feeds data to a line splitter of limit max in chunks: every
// line up to max bytes comes out whole, every longer one is counted, and
// the unfinished rest is kept (or counted) the same way.
func checkLines(t *testing.T, data, cuts []byte, max int) {
	t.Helper()
	var wantLines []string
	wantOver := 0
	parts := bytes.Split(data, []byte("\n"))
	for _, l := range parts[:len(parts)-1] {
		if len(l) > max {
			wantOver++
		} else {
			wantLines = append(wantLines, string(l))
		}
	}
	last := parts[len(parts)-1]

	ls := lines{max: max}
	var gotLines []string
	gotOver := 0
	rd := &chunked{data: data, cuts: cuts}
	buf := make([]byte, len(data)+1)
	for {
		n, err := rd.Read(buf)
		over, ferr := ls.feed(buf[:n], func(l []byte) error { gotLines = append(gotLines, string(l)); return nil })
		if ferr != nil {
			t.Fatal(ferr)
		}
		gotOver += over
		if err != nil || n == 0 {
			break
		}
	}
	rest, overlong := ls.rest()
	if gotOver != wantOver || len(gotLines) != len(wantLines) {
		t.Fatalf("lines{max: %d} splits %q into %d lines and %d overlong, want %d and %d", max, data, len(gotLines), gotOver, len(wantLines), wantOver)
	}
	for i := range gotLines {
		if gotLines[i] != wantLines[i] {
			t.Fatalf("lines{max: %d}: line %d of %q is %q, want %q", max, i, data, gotLines[i], wantLines[i])
		}
	}
	if overlong != (len(last) > max) || (!overlong && string(rest) != string(last)) {
		t.Fatalf("lines{max: %d}: the rest of %q is %q (overlong %v), want %q", max, data, rest, overlong, last)
	}
}
