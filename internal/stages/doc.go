// Package stages replays a request through the kube-apiserver's own stages,
// in the apiserver's order, and says which stage would decide its outcome.
//
// # Shape
//
// The apiserver builds its request path in one function,
// DefaultBuildHandlerChain, which a reader can take in at a glance. This
// package keeps that property: [New] lists the nine stages of the contract
// (authentication, impersonation, flowcontrol, authorization, decode,
// mutating-admission, validation, validating-admission, storage) in one
// slice, in the order the real server runs them. A stage is one file and one
// type behind the small [Stage] interface; adding a stage touches its file
// and one line in [New].
//
// # Verdicts
//
// Each stage returns a [Result]: an outcome (pass, reject, skip, error), an
// explanation a person can act on, and on reject the metav1.Status the real
// apiserver would answer with. The first reject decides the prediction; the
// stages after it are skipped as "not reached". A stage that fails, panics,
// runs past the replay budget, or is not modelled yet makes the prediction
// unknown: an honest "unknown" beats a confident guess.
//
// # Fidelity
//
// Stages run the apiserver's own code (k8s.io/apiserver filters and
// authenticators, the authorizers, the admission chain, the registry
// strategies) wherever it can run outside the apiserver process, and write
// by hand only what upstream lacks: explanations, nearest misses, timing.
// The replay never writes to the cluster and never changes what is
// forwarded: it sees a copy of the request.
//
// # The write path
//
// Decode, mutating-admission, validation, validating-admission and storage
// are one piece of code in the apiserver: the resource handler calling the
// registry, which calls admission around the strategy and the store. Taking
// them apart would mean re-implementing their order, so kproxy does not:
// writepath.go assembles kube-apiserver's handler for the built-in resources
// (its REST storage providers, strategies, admission chain and initializers,
// from the mirrored flags) in a GenericAPIServer that never listens, in
// front of the apiextensions server for custom resources, with a
// storage.Interface underneath that only reads the cluster (through the
// apiserver, as the object was before the request's own write). Every write
// is replayed in dry run; a decorator on each admission plugin and marks
// around the chain's two phases record what happened (handlerrun.go), and
// the five stages then report their part of that one run, each with the
// times the work really took. Where dry run changes what upstream checks
// (explicit cluster IPs and node ports), the replay says unknown.
//
// # Reads and etcd
//
// A get, list or watch runs through the same handler (decode reports its
// query options, storage the read). Under it, when kproxy has the
// apiserver's etcd flags, each resource's storage is the apiserver's own
// etcd3 store on the real etcd, wrapped read-only (etcd_access.go): its
// code decides NotFound, resourceVersions too large, continue tokens, as
// it does in the apiserver. What the apiserver's watch cache decides
// differently is handled where it matters (it parses a get's
// resourceVersion first; it may still serve a list at a compacted
// revision from a snapshot, which no outside reader can know: unknown).
// Lists are narrowed to one item with the same semantics, so the replay
// never reads a large collection again. Without etcd access the replay
// reads the latest state through the apiserver and says so. The storage
// stage also inspects the request's etcd key directly (revisions,
// encoding, encryption, latency as a span) and sizes a write's value as
// the etcd3 store would encode and encrypt it, against etcd's limits.
//
// # Collaborators
//
// Clocks and tracer providers are injected through [Config]; no stage keeps
// hidden global state. Every stage runs inside its own span, a child of the
// "replay" span, so a trace shows where the time went.
package stages
