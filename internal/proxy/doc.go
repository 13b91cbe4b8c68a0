// Package proxy is kproxy's request path: it terminates TLS, works out who
// is calling, forwards the request to the real apiserver untouched, and, on
// the side, hands a copy to the replay (package stages) and writes the
// capture record.
//
// # Observe, never interfere
//
// What the client receives is what the apiserver answered: status, headers,
// body, streamed as it comes (FlushInterval -1, so watch events and the
// chunks of a big LIST are flushed as they arrive). Transport compression is
// off (DisableCompression) and Accept-Encoding passes through, so kproxy
// neither gunzips what the client wanted compressed nor makes the apiserver
// compress what the client did not ask for. The replay runs on a copy of
// the request in a bounded pool of workers (replaypool.go): it never
// delays the response; when the pool and its queue are full the replay is
// shed ("replay shed: kproxy is over its replay budget"), and when it is
// shed or fails the record says "unknown". Before the pool, --replay-filter
// (selectReplay) picks what is replayed at all, from what the request
// carries; a filter on a user that only the replay's authentication can
// name (a bearer token) travels with the request as its Gate, and the
// pipeline asks it once the identity stages have passed.
//
// # Identity
//
// TLS termination loses the client certificate, so kproxy forwards identity
// in the way that keeps the apiserver's view exact:
//
//   - A bearer token passes through unchanged: the apiserver authenticates
//     the real caller, and audit and APF see the real identity.
//   - A client certificate is verified here with the apiserver's own x509
//     (and front-proxy) authenticators against --client-ca-file, exactly as
//     the apiserver requests but does not require one. A verified caller is
//     forwarded with kproxy's own credentials (--upstream-kubeconfig) as
//     Impersonate-User/Group/Uid/Extra-*; the x509 authenticator runs before
//     token authenticators and the first success wins, so a verified
//     certificate outranks a token sent with it. A certificate the apiserver
//     would reject gets the apiserver's own 401, written by its own handler,
//     since the upstream never sees the certificate.
//   - Impersonate-* headers sent by a certificate caller are authorized with
//     the apiserver's impersonation filter, backed by SubjectAccessReviews
//     for the caller: kproxy never impersonates anyone it has not verified.
//   - No credentials: forwarded without credentials (anonymous).
//
// # Streams and upgrades
//
// exec, attach and port-forward upgrade the connection (SPDY/3.1, WebSocket
// v5.channel.k8s.io). Upgrades cannot ride HTTP/2, so the upstream transport
// speaks HTTP/1.1 (NextProtos pinned), with a large idle pool: an HTTP/1.1
// pool moves big responses faster than one multiplexed HTTP/2 connection.
// The pool is kept for a burst's sake, not after it: once 64 or more
// requests were in flight and few are again, kproxy closes the idle
// connections (idleconns.go) instead of holding them, their goroutines
// and the apiserver's side of them for 30 seconds.
// Watches are the exception: they go over HTTP/2 (unless they ask for an
// upgrade), many to a connection, so that thousands of mostly idle watches
// do not hold a connection each; each stream's window is kept small, so a
// client that stops reading stops its stream at the apiserver after 64 KiB.
//
// A watch over HTTP/1.1 is taken off net/http once the apiserver has
// answered (stream.go): kproxy hijacks the connection after the headers
// and writes the stream's chunks itself on a goroutine of its own, with
// another blocked on the bare connection to see the client leave. net/http
// holds, per open response, its buffers and two goroutines (the handler's,
// kept deep by the reverse proxy, and its background read, deep in
// crypto/tls): 24 KiB of stacks and 10 KiB of buffers a watch, more than
// kproxy's whole budget for one. The price: the connection closes when
// the stream ends, where net/http would have kept it for the next request.
//
// # Records
//
// Each request ends as one record (package record): request, prediction,
// actual answer, stage verdicts, latency and trace ID. The record is
// written once both the replay and the relay are over, by whichever ends
// last, so waiting for a slow replay never holds the client's response
// open.
package proxy
