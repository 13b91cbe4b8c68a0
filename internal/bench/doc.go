// Package bench measures what kproxy costs against the real apiserver:
// the same workloads sent directly, through kproxy (replay and tracing on,
// exporting to a real Jaeger), through `kubectl proxy` (built from the
// same Kubernetes module) and, when it is installed, through nginx as a
// pure TLS proxy (the practical floor for a hop), interleaved in one run
// and reported as medians and ratios to direct. Run it with `make bench`; `make test` does not.
package bench
