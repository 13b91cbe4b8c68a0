// Package e2e holds kproxy's end-to-end tests: a real etcd, kube-apiserver
// and Jaeger (package localcluster), kproxy wired exactly as `kproxy serve`
// wires it (package serve), and clients that send the same requests
// directly and through kproxy and compare what comes back.
package e2e
