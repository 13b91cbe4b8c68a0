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
// unknown: an honest "unknown" beats a confident guess. So does an answer
// of the apiserver's own instant that the replay cannot meet (its load, a
// limit, a failure: moment.go), once the answer is known.
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
// # The resource handler
//
// Decode, mutating-admission, validation, validating-admission and storage
// are one piece of code in the apiserver: the resource handler calling the
// registry, which calls admission around the strategy and the store. Taking
// them apart would mean re-implementing their order, so kproxy does not:
// package apiserver is kube-apiserver's handler for the built-in resources
// and custom resources, assembled in process from the mirrored flags, over
// storage that only reads the cluster. [New] puts it in the pipeline as one
// element after the four filter stages: it runs once per request and the
// five stages report their part of that run (handler.go), each with the
// times the work really took. Reads run through the same handler (decode
// reports the query options, storage the read through the apiserver's own
// etcd3 store; a get answered 200 with its object takes the object from
// the answer, the state the request met, instead of reading it again). Requests the handler does not serve are decode's to
// answer: the apiserver's own non-resource handlers (nonresource.go),
// discovery of groups it does not serve and aggregated APIs
// (group_discovery.go).
//
// # Collaborators
//
// Clocks and tracer providers are injected through [Config]; no stage keeps
// hidden global state. Every stage that runs has its own span, a child of
// the "replay" span, so a trace shows where the time went; a stage that
// does not apply to the request (a read's admission) or is not reached has
// none, and the replay span names it (kproxy.stages.skipped).
package stages
