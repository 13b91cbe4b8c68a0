// Package flowapi is the live flow API of `kproxy serve --api-listen`: an
// HTTP API over the newest capture records, for the TUI, for
// `kproxy flows --connect` and for curl.
//
// # Records only
//
// The package sees nothing but records (package record) and the filter
// language (package filter). It does not know the proxy, the replay or the
// TUI; re-running a flow is a Replayer the caller injects. That keeps the
// API, its buffer and its client usable from any process that has records,
// and keeps the request path free of the API's concerns.
//
// # The buffer is a ring, readers are cursors
//
// Buffer is a record.Sink next to the capture file. It keeps the newest N
// records in a ring and numbers every record it is given (1, 2, 3, ...).
// Write is O(1) and never waits for a reader: it stores a pointer, updates
// the id index and, only if some subscriber is waiting, closes one
// channel to wake them all.
//
// A subscriber is a position in that numbering, not a queue. It owns no
// copies of records, so a slow or stuck reader costs nothing but its
// cursor: memory is bounded by the ring whatever the readers do. When a
// reader comes back it compares its cursor with the oldest number still
// retained; the difference is exactly how many records it lost, which it
// is told as a "missed" event before it jumps forward to the oldest one
// retained. Resuming by Last-Event-ID is the same operation: the id index
// also remembers the numbers of as many evicted records as the ring
// holds, so a client that comes back a little too late still learns
// exactly how many it missed (and an id nobody remembers counts every
// record evicted so far, the most it can have missed).
//
// Records are immutable once written; the buffer hands the same pointers
// to every reader.
//
// # The HTTP API
//
//	GET  /api/v1/flows[?filter=EXPR&limit=N]        FlowList, newest N, oldest first
//	GET  /api/v1/flows/{id}                         one record, or a 404 Status
//	GET  /api/v1/flows/stream[?filter=EXPR&backlog=N&lastEventID=ID]
//	POST /api/v1/flows/{id}/replay                  the record of a re-run
//
// The stream is Server-Sent Events: each record is
// "id: <record id>\nevent: flow\ndata: <record JSON>\n\n", flushed on its
// own; "event: missed" carries {"missed":N}; ": keepalive" comments keep
// idle connections open through proxies. Errors are Kubernetes-style
// Status objects whose message names the thing at fault and the fix (a
// bad filter's position included).
//
// Records name users, paths and explanations. Who may read them is the
// caller's decision (kproxy serve allows plain HTTP on loopback only);
// the handler enforces a bearer token, compared in constant time, and/or
// a verified client certificate when asked to.
//
// # The client
//
// Client is the other end: List, Get, Replay, and Stream, which parses the
// event stream, and after a lost connection reconnects with backoff and
// resumes with Last-Event-ID, so the caller sees every record once and is
// told, as a missed count, about the ones it could not get.
package flowapi
