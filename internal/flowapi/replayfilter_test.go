package flowapi

import (
	"context"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/filter"
)

// fakeFilterer holds a replay filter as kproxy's proxy does: parsed with
// a request's own terms only, the one in force kept when one is refused.
type fakeFilterer struct {
	expr string
	off  bool // the replay is off
}

type conflictErr struct{}

func (conflictErr) Error() string  { return "the replay is off" }
func (conflictErr) Conflict() bool { return true }

func (f *fakeFilterer) ReplayFilter() string { return f.expr }
func (f *fakeFilterer) SetReplayFilter(s string) (string, error) {
	if f.off {
		return "", conflictErr{}
	}
	e, err := filter.ParseRequestOnly(s)
	if err != nil {
		return "", err
	}
	f.expr = e.String()
	return f.expr, nil
}

// TestReplayFilterEndpoint: GET reads the filter in force, PUT changes it
// and answers it normalised; a filter refused is a 400 naming it (with
// the caret of a syntax error) and the one in force stays; no filterer is
// a 501, the replay off a 409.
func TestReplayFilterEndpoint(t *testing.T) {
	ctx := context.Background()
	rf := &fakeFilterer{}
	srv := serveAPI(t, NewBuffer(1), HandlerOptions{ReplayFilter: rf})
	c, err := NewClient(srv.URL, ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.ReplayFilter(ctx); err != nil || got != "" {
		t.Fatalf("ReplayFilter = %q, %v; want every request replayed", got, err)
	}
	if got, err := c.SetReplayFilter(ctx, "~n  payments   ~v create"); err != nil || got != "~n payments & ~v create" {
		t.Fatalf("SetReplayFilter = %q, %v; want it normalised", got, err)
	}
	for _, tc := range []struct {
		expr, want string
	}{
		{"~c 403", "~c needs the apiserver's answer"},
		{"~n (", "invalid replay filter: ~n wants a namespace"},
	} {
		if _, err := c.SetReplayFilter(ctx, tc.expr); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("SetReplayFilter(%q) = %v, want an error with %q", tc.expr, err, tc.want)
		}
	}
	if got, _ := c.ReplayFilter(ctx); got != "~n payments & ~v create" {
		t.Errorf("after refused filters, %q in force, want the last accepted", got)
	}
	if got, err := c.SetReplayFilter(ctx, ""); err != nil || got != "" {
		t.Errorf(`SetReplayFilter("") = %q, %v; want every request replayed again`, got, err)
	}

	off := serveAPI(t, NewBuffer(1), HandlerOptions{ReplayFilter: &fakeFilterer{off: true}})
	none := serveAPI(t, NewBuffer(1), HandlerOptions{})
	for _, tc := range []struct {
		name, method, url, body string
		code                    int
		want                    string
	}{
		{"not JSON", "PUT", srv.URL + PathReplayFilter, "~n x", 400, `the body must be a ReplayFilter: {\"filter\": \"EXPR\"}`},
		{"unknown field", "PUT", srv.URL + PathReplayFilter, `{"filtre": "~n x"}`, 400, "unknown field"},
		{"a syntax error's caret", "PUT", srv.URL + PathReplayFilter, `{"filter": "~n ("}`, 400, `"caret":"~n (\n   ^"`},
		{"replay off", "PUT", off.URL + PathReplayFilter, `{"filter": "~n x"}`, 409, "the replay is off"},
		{"no filterer", "GET", none.URL + PathReplayFilter, "", 501, "cannot read or change a replay filter"},
		{"not a POST", "POST", srv.URL + PathReplayFilter, `{"filter": ""}`, 404, "GET and PUT /api/v1/replay-filter"},
	} {
		t.Run(tc.name, func(t *testing.T) { expectAnswer(t, tc.method, tc.url, tc.body, tc.code, tc.want) })
	}
}
