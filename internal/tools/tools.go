//go:build tools

// Package tools pins the Kubernetes binaries the tests and the demo run, so
// they are built from exactly the code the replay links (v1.37.2).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
