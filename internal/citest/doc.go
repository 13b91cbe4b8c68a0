// Package citest runs kproxy's CI tests (package testfile) and reports
// them.
//
// # Engines
//
// A case is a request, an identity and the answer it must get. An
// [Engine] gives each case a [Verdict]: the local engine replays it in
// process through kproxy's stage pipeline over a snapshot of the cluster
// (package snapshot), with no cluster at all; the cluster engine sends it
// to a real apiserver (writes in dry run, identities by impersonation)
// and also replays it, so the report says where kproxy's prediction and
// the apiserver disagree. Engines are built by the command (they need the
// replay, which only cmd/kproxy wires); this package only runs them.
//
// # Comparing
//
// [Compare] checks only what a case expects. The storage stage's
// outcomes (404, 409) depend on the state at the time of the snapshot, so
// by default they are not compared and the report says so; with
// CompareOptions.Storage they are.
//
// # What-if
//
// A what-if run is two runs of the same suite, before and after overlays
// or changed apiserver flags; [Diff] lists exactly the cases whose verdict
// changes, before and after, with the deciding stage and explanation.
//
// # Reports
//
// A readable table, JUnit XML (one testcase per case, the explanation in
// the failure), GitHub annotations with a step summary, and JSON. Exit
// statuses: 0 every expectation held, 1 one failed, 2 bad input or an
// engine failure.
package citest
