package proxy_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// countingWriter counts the writes of an answer's body to the client,
// and the flushes.
type countingWriter struct {
	http.ResponseWriter
	writes, flushes *atomic.Int64
}

func (c countingWriter) Flush() {
	c.flushes.Add(1)
	http.NewResponseController(c.ResponseWriter).Flush()
}

func (c countingWriter) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.ResponseWriter.Write(b)
}

func (c countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// TestListRelayedInFullReads: a LIST the apiserver streams in 1 KiB
// pieces reaches the client in 32 KiB writes, none flushed on its own
// (net/http flushes the end of the response), while a followed log, a
// stream of no end, is still relayed piece by piece as it arrives (the
// upstream sends each line only once the client has read the one
// before, so holding any of them back would stall the test).
func TestListRelayedInFullReads(t *testing.T) {
	piece := strings.Repeat("x", 1023) + "\n"
	read := make(chan struct{})
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
		for i := range 64 {
			_, _ = io.WriteString(w, piece)
			http.NewResponseController(w).Flush()
			if strings.HasSuffix(r.URL.Path, "/log") && i < 63 {
				select {
				case <-read:
				case <-r.Context().Done():
					return
				}
			}
		}
	}))
	upstream.StartTLS()
	t.Cleanup(upstream.Close)
	front, client := streamProxy(t, upstream, nil)
	var writes, flushes atomic.Int64
	inner := front.Config.Handler
	front.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inner.ServeHTTP(countingWriter{w, &writes, &flushes}, r)
	})

	for _, tc := range []struct {
		path       string
		lockstep   bool
		wantWrites int64
		wantFlush  bool
	}{
		{"/api/v1/namespaces/default/configmaps", false, 2, false},   // list: 64 KiB in two full reads
		{"/api/v1/namespaces/default/configmaps/a", false, 2, false}, // get
		{"/api/v1/namespaces/default/pods/p/log", true, 64, true},    // a stream: each piece as it comes
	} {
		t.Run(tc.path, func(t *testing.T) {
			writes.Store(0)
			flushes.Store(0)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, front.URL+tc.path, nil)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			var got int
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					if err != io.EOF {
						t.Fatalf("after %d lines: %v", got, err)
					}
					break
				}
				if line != piece {
					t.Fatalf("line %d is %d bytes, not the piece sent", got, len(line))
				}
				got++
				if tc.lockstep && got < 64 {
					read <- struct{}{}
				}
			}
			if got != 64 {
				t.Fatalf("got %d of 64 pieces", got)
			}
			if n := writes.Load(); n != tc.wantWrites {
				t.Errorf("the answer reached the client in %d writes, want %d", n, tc.wantWrites)
			}
			// The stream is flushed piece by piece (else it would stall);
			// the list's writes are not flushed each.
			if n := flushes.Load(); (n >= tc.wantWrites) != tc.wantFlush {
				t.Errorf("%d flushes of %d writes; want a flush after each: %v", n, writes.Load(), tc.wantFlush)
			}
		})
	}
}
