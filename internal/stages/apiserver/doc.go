// Package apiserver is the replay's kube-apiserver: kube-apiserver's own
// resource handler, registries, strategies and admission chain, assembled
// in process from the mirrored flags (Options) the way kube-apiserver
// assembles them, in a GenericAPIServer that never listens, in front of
// the apiextensions server for custom resources. A Server is built once;
// Server.Run runs one request through it and returns what went by (Run):
// the phases with their times, every admission plugin's call and verdict,
// the storage reads, the answer, and the stage the contract labels a
// refusal with (labelling.go). Package stages turns a Run into the five
// handler stages' verdicts.
//
// # Never writes
//
// Every write runs in dry run (dryrun.go: however the request carries its
// options). The registries' storage (snapshot_storage.go) reads the
// object as it was before the request's own write (at an exact revision
// when later writes are visible); reads of both writes and read requests
// go through the apiserver's own etcd3 store on its etcd, wrapped
// read-only (etcd.go), or through the apiserver without etcd access. A write that reaches storage is refused and makes the run
// unknown, never a prediction. What only a real allocation checks (a
// Service's cluster IPs and node ports) runs for real against in-memory
// allocators over the cluster's current allocations (services.go); what
// only a kubelet or a proxied backend answers is never dialed
// (connect.go); tokens are checked with a placeholder signer (token.go).
//
// # Watching it go by
//
// The admission chain is decorated (decorators.go): one wrapper marks the
// handler's phases (mutating admission, strategy, validating admission,
// storage), another around each plugin keeps its time, verdict and
// mutation. Compile-time interface guards keep an upstream change of the
// admission interfaces from silently dropping a decorator.
//
// # What it leaves out
//
// The replay runs on every request, on CPUs the apiserver shares, so it
// skips work whose result it drops, and only that: a read's answer is not
// encoded (unencoded.go: the object its storage read is held for the run,
// and the built-in groups' encoders write a placeholder), and go-restful's
// choice of route is remembered per request shape (routes.go). Content
// negotiation, the status, headers and every refusal still come from the
// apiserver's code on every request.
//
// # State it reads
//
// ClusterState is the replay's read-only view of the cluster: shared
// informers on the upstream and a client that can only read. ServedDocs
// are what the apiserver serves about itself (the ETags of its discovery
// roots, its index of paths, its OpenAPI index), read from it as state.
package apiserver
