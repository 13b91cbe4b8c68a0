package proxy

import (
	"io"
	"net/http"

	apirequest "k8s.io/apiserver/pkg/endpoints/request"
)

// A LIST answer has no length (the apiserver streams it, chunked), so
// ReverseProxy flushes each read of it to the client at once. The
// apiserver writes it in TLS records of about 4 KiB, so a 1 MB LIST
// became some 250 reads, each relayed as one TLS record and one write
// system call to the client. A list or a get is read to its end before
// the client uses it, so its reads can fill the copy buffer (32 KiB)
// first: the same bytes, in the same order, as they arrive, in an
// eighth of the writes. Nor is each such read flushed (ReverseProxy
// flushes after every write of an answer of no length): a flush ends the
// chunk with a write system call of its own, for its last two bytes, so
// each 32 KiB took four writes to the client; unflushed, the chunk's end
// goes out with the next chunk's start, in three, and net/http flushes
// the rest as the response ends. Watches, logs, proxied streams and every
// other answer of no length are still relayed and flushed read by read.

// fillsReads says whether the answer to a request may be relayed in full
// reads: a list or a get of a resource itself, answered 200 without a
// length (anything else keeps ReverseProxy's flush per read).
func fillsReads(info *apirequest.RequestInfo, resp *http.Response) bool {
	return info != nil && info.IsResourceRequest && info.Subresource == "" &&
		(info.Verb == "list" || info.Verb == "get") &&
		resp.StatusCode == http.StatusOK && resp.ContentLength < 0
}

// fullReads fills each read of an answer's body, until the body ends or
// fails.
type fullReads struct{ io.ReadCloser }

func (f fullReads) Read(p []byte) (n int, err error) {
	for n < len(p) && err == nil {
		var m int
		m, err = f.ReadCloser.Read(p[n:])
		n += m
	}
	return n, err
}
