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
// page of one. The handler reads the first of several limits, and a
// limit of 0 or less as none (storage pages only for a limit over 0).
// Watches are left as they are. It returns what it changed, or "".
func narrowList(info *apirequest.RequestInfo, q url.Values) string {
	if info.Verb != "list" {
		return ""
	}
	if ls, ok := q["limit"]; ok && len(ls) > 0 {
		n, err := strconv.ParseInt(ls[0], 10, 64)
		switch {
		case err != nil:
			return "" // the handler refuses it as given
		case n > 1:
			q.Set("limit", "1")
			return "limit=1 instead of " + ls[0]
		case n == 1:
			return ""
		}
	}
	what := "limit=1"
	if ls := q["limit"]; len(ls) > 0 {
		what += " instead of " + ls[0]
	}
	if rv := q.Get("resourceVersion"); rv != "" && rv != "0" && q.Get("resourceVersionMatch") == "" && q.Get("continue") == "" {
		q.Set("resourceVersionMatch", string(metav1.ResourceVersionMatchNotOlderThan))
		what += ", resourceVersionMatch=NotOlderThan"
	}
	q.Set("limit", "1")
	return what
}
