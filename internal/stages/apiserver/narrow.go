package apiserver

import (
	"net/url"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
)

// narrowList makes a list read at most one object, with the same
// resourceVersion semantics: a list's storage outcome (resourceVersion
// too large or too old, an invalid continue token) does not depend on
// its size, and the replay must not read a big collection a second
// time. A resourceVersion with a limit means an exact read (the legacy
// rule), so a list that named one without a limit gets NotOlderThan
// said explicitly; a list that pages already keeps its semantics with a
// page of one. Watches are left as they are. It returns what it
// changed, or "".
func narrowList(info *apirequest.RequestInfo, q url.Values) string {
	if info.Verb != "list" {
		return ""
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.ParseInt(l, 10, 64)
		switch {
		case err != nil || n < 0 || len(q["limit"]) > 1:
			return "" // the handler judges it as given
		case n > 1:
			q.Set("limit", "1")
			return "limit=1 instead of " + l
		case n == 1:
			return ""
		}
	}
	what := "limit=1"
	if rv := q.Get("resourceVersion"); rv != "" && rv != "0" && q.Get("resourceVersionMatch") == "" && q.Get("continue") == "" {
		q.Set("resourceVersionMatch", string(metav1.ResourceVersionMatchNotOlderThan))
		what += ", resourceVersionMatch=NotOlderThan"
	}
	q.Set("limit", "1")
	return what
}
