package apiserver

import (
	"net/url"
	"testing"

	apirequest "k8s.io/apiserver/pkg/endpoints/request"
)

func TestNarrowList(t *testing.T) {
	cases := []struct {
		verb, query, want, changed string
	}{
		{"list", "", "limit=1", "limit=1"},
		{"list", "resourceVersion=0", "limit=1&resourceVersion=0", "limit=1"},
		// A resourceVersion with a limit would mean Exact: say NotOlderThan.
		{"list", "resourceVersion=42", "limit=1&resourceVersion=42&resourceVersionMatch=NotOlderThan", "limit=1, resourceVersionMatch=NotOlderThan"},
		{"list", "resourceVersion=42&resourceVersionMatch=Exact", "limit=1&resourceVersion=42&resourceVersionMatch=Exact", "limit=1"},
		{"list", "limit=500", "limit=1", "limit=1 instead of 500"},
		{"list", "limit=500&resourceVersion=42", "limit=1&resourceVersion=42", "limit=1 instead of 500"},
		{"list", "limit=500&continue=abc", "continue=abc&limit=1", "limit=1 instead of 500"},
		{"list", "limit=1", "limit=1", ""},
		{"list", "limit=0", "limit=1", "limit=1 instead of 0"},
		{"list", "limit=abc", "limit=abc", ""},
		{"list", "limit=", "limit=", ""},
		// A negative limit is none: the whole collection (probe S read
		// 33 MB of etcd for it).
		{"list", "limit=-3", "limit=1", "limit=1 instead of -3"},
		{"list", "limit=-1&resourceVersion=42", "limit=1&resourceVersion=42&resourceVersionMatch=NotOlderThan", "limit=1 instead of -1, resourceVersionMatch=NotOlderThan"},
		// The handler reads the first of several limits.
		{"list", "limit=500&limit=abc", "limit=1", "limit=1 instead of 500"},
		{"list", "limit=-1&limit=7", "limit=1", "limit=1 instead of -1"},
		{"list", "limit=1&limit=7", "limit=1&limit=7", ""},
		{"list", "limit=abc&limit=7", "limit=abc&limit=7", ""},
		{"watch", "resourceVersion=42", "resourceVersion=42", ""},
		{"get", "resourceVersion=42", "resourceVersion=42", ""},
	}
	for _, c := range cases {
		t.Run(c.verb+"?"+c.query, func(t *testing.T) {
			q, err := url.ParseQuery(c.query)
			if err != nil {
				t.Fatal(err)
			}
			changed := narrowList(&apirequest.RequestInfo{Verb: c.verb}, q)
			if got := q.Encode(); got != c.want || changed != c.changed {
				t.Errorf("narrowList(%s %q) = %q, %q; want %q, %q", c.verb, c.query, got, changed, c.want, c.changed)
			}
		})
	}
}
