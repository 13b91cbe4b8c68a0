package stages

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/stages/apiserver"
)

// TestIndexChangedSinceArrival: a conditional GET of the OpenAPI v3 index,
// replayed after the index may have changed. The answer from the index
// read now stands when the index did not change since the arrival, when
// it says 304 to a time-conditional request (so would any older index),
// or when the last version kproxy read before the arrival gets the same
// answer; otherwise it is unknown.
func TestIndexChangedSinceArrival(t *testing.T) {
	arrival := time.Date(2026, 12, 2, 11, 0, 10, 500_000_000, time.UTC)
	at := func(d time.Duration) string { return arrival.Add(d).Format(http.TimeFormat) }
	doc := func(etag, mod string) apiserver.ServedDoc {
		return apiserver.ServedDoc{Status: 200, Header: http.Header{"Etag": {etag}, "Last-Modified": {mod}}, Body: []byte(`{"paths":{}}`)}
	}
	before := apiserver.Seen{At: arrival.Add(-time.Second), ETag: `"old"`, LastModified: at(-time.Minute)}
	for _, tc := range []struct {
		name    string
		header  http.Header
		arrival time.Time
		now     apiserver.ServedDoc
		seen    *apiserver.Seen
		want    string // in the reason; "" for none
	}{
		{"changed long before the arrival", http.Header{"If-Modified-Since": {at(-2 * time.Minute)}}, arrival,
			doc(`"new"`, at(-time.Minute)), nil, ""},
		{"kproxy explain: now is what is asked", http.Header{"If-Modified-Since": {at(-2 * time.Minute)}}, time.Time{},
			doc(`"new"`, at(time.Second)), nil, ""},
		{"changed after, never read before", http.Header{"If-Modified-Since": {at(-2 * time.Minute)}}, arrival,
			doc(`"new"`, at(time.Second)), nil, "kproxy had not read it before"},
		{"changed after, a copy newer than both: 304 either way", http.Header{"If-Modified-Since": {at(time.Hour)}}, arrival,
			doc(`"new"`, at(time.Second)), nil, ""},
		{"read before, unchanged since", http.Header{"If-Modified-Since": {at(-2 * time.Minute)}}, arrival,
			doc(`"old"`, at(-time.Minute)), &before, ""},
		{"changed after; the copy is older than both versions: 200 either way", http.Header{"If-Modified-Since": {at(-2 * time.Minute)}}, arrival,
			doc(`"new"`, at(time.Second)), &before, ""},
		{"changed after; the copy was current before (304), not after (200)", http.Header{"If-Modified-Since": {at(-time.Minute)}}, arrival,
			doc(`"new"`, at(time.Second)), &before, "the two versions get different answers"},
		{"changed after; an ETag matches one version only", http.Header{"If-None-Match": {`"elsewhere"`}}, arrival,
			doc(`"new"`, at(time.Second)), &before, "the two versions get different answers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hr, _ := http.NewRequest("GET", "https://apiserver/openapi/v3", nil)
			hr.Header = tc.header
			req := &Request{HTTP: hr, Arrival: tc.arrival}
			mod, err := http.ParseTime(tc.now.Header.Get("Last-Modified"))
			if err != nil {
				t.Fatal(err)
			}
			code := serveDocument(context.Background(), req, tc.now.Header.Get("Etag"), mod, tc.now.Body).Code
			var seen apiserver.Seen
			if tc.seen != nil {
				seen = *tc.seen
			}
			got := openAPIV3Index.changedSinceArrival(context.Background(), req, tc.now, tc.now.Body, mod, code, seen, tc.seen != nil)
			switch {
			case tc.want == "" && got != "":
				t.Errorf("unknown (%s), want the answer read now (%d)", got, code)
			case tc.want != "" && !strings.Contains(got, tc.want):
				t.Errorf("reason %q, want one saying %q", got, tc.want)
			}
		})
	}
}
