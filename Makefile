# kproxy: `make demo` to see it work, `make test` to check it.
# Everything builds from the Go module proxy; binaries land in .cache/bin.

SHELL       := /bin/bash
GO          ?= go
BIN_DIR     := $(CURDIR)/.cache/bin
KUBE_VERSION := v1.37.2
# The Kubernetes binaries report the version they were built from, so the
# replay's version checks see the real thing.
KUBE_LDFLAGS := -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37 \
	-X k8s.io/component-base/version.gitTreeState=clean \
	-X k8s.io/client-go/pkg/version.gitVersion=$(KUBE_VERSION) \
	-X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=37
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
TEST_FLAGS  ?= -count=1 -timeout=40m
export KPROXY_BIN_DIR := $(BIN_DIR)

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: tools
tools: $(BIN_DIR)/kube-apiserver $(BIN_DIR)/kube-scheduler $(BIN_DIR)/kube-controller-manager $(BIN_DIR)/kubectl $(BIN_DIR)/etcd $(BIN_DIR)/jaeger ## Build etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl and jaeger (cached in .cache/bin).

$(BIN_DIR)/golangci-lint: tools/golangci-lint/go.mod tools/golangci-lint/go.sum
	@echo ">> building golangci-lint (pinned in tools/golangci-lint)"
	cd tools/golangci-lint && $(GO) build -trimpath -o $@ github.com/golangci/golangci-lint/v2/cmd/golangci-lint

$(BIN_DIR)/kube-apiserver: go.mod go.sum
	@echo ">> building kube-apiserver $(KUBE_VERSION) (a cold build takes ~5 min on 2 cores)"
	$(GO) build -trimpath -ldflags '$(KUBE_LDFLAGS)' -o $@ k8s.io/kubernetes/cmd/kube-apiserver

$(BIN_DIR)/kube-scheduler: go.mod go.sum
	@echo ">> building kube-scheduler $(KUBE_VERSION) (TestSchedulerSession runs it behind kproxy)"
	$(GO) build -trimpath -ldflags '$(KUBE_LDFLAGS)' -o $@ k8s.io/kubernetes/cmd/kube-scheduler

# The controller manager links the kubelet's volume and container code,
# whose modules kproxy does not need: a module of its own, same release.
$(BIN_DIR)/kube-controller-manager: tools/kube-controller-manager/go.mod tools/kube-controller-manager/go.sum
	@echo ">> building kube-controller-manager $(KUBE_VERSION) (TestControllerSession runs it behind kproxy)"
	cd tools/kube-controller-manager && $(GO) build -trimpath -ldflags '$(KUBE_LDFLAGS)' -o $@ k8s.io/kubernetes/cmd/kube-controller-manager

$(BIN_DIR)/kubectl: go.mod go.sum
	@echo ">> building kubectl $(KUBE_VERSION)"
	$(GO) build -trimpath -ldflags '$(KUBE_LDFLAGS)' -o $@ k8s.io/kubernetes/cmd/kubectl

$(BIN_DIR)/etcd: tools/etcd/go.mod tools/etcd/go.sum
	@echo ">> building etcd"
	cd tools/etcd && $(GO) build -trimpath -o $@ go.etcd.io/etcd/server/v3

$(BIN_DIR)/jaeger: tools/jaeger/go.mod tools/jaeger/go.sum
	@echo ">> building jaeger all-in-one"
	cd tools/jaeger && $(GO) build -trimpath -o $@ github.com/jaegertracing/jaeger/cmd/jaeger

.PHONY: build
build: ## Build bin/kproxy.
	$(GO) build -trimpath -ldflags '-X main.version=$(VERSION)' -o bin/kproxy ./cmd/kproxy

.PHONY: test
test: tools ## Run every test against a real etcd, kube-apiserver and Jaeger.
	$(GO) vet ./...
	$(GO) test $(TEST_FLAGS) ./...
	$(MAKE) fuzz-brief

FUZZTIME    ?= 60s

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each (default 60s); a crasher stays under the package's testdata/fuzz/.
	GO=$(GO) FUZZTIME=$(FUZZTIME) tools/fuzz.sh

.PHONY: fuzz-brief
fuzz-brief: ## Run every fuzz target for 5s (make test does, after the seeds ran as tests).
	GO=$(GO) FUZZTIME=5s tools/fuzz.sh

SOAK        ?= 10m

.PHONY: soak
soak: tools ## A bounded soak: kproxy under mixed HTTP/2 load for SOAK (default 10m); resources back to baseline, one record per request (make test runs 20s).
	KPROXY_SOAK_DURATION=$(SOAK) $(GO) test -count=1 -timeout=24h -run '^TestSoak$$' -v ./internal/e2e/

.PHONY: bench
bench: tools ## Benchmarks: direct vs kproxy vs kubectl proxy vs nginx against the real apiserver (KPROXY_BENCH_SCALE=0.2 for a quick run).
	@.ci/install-tool nginx || echo "bench: nginx could not be installed: the tables go without their TLS-proxy peer"
	$(GO) test -run='^$$' -bench=. -benchtime=1x -count=1 -timeout=60m -v ./internal/bench/...
	$(GO) test -run='^$$' -bench=. -benchtime=2x -count=1 ./internal/tui/

.PHONY: demo
demo: tools build ## Start a local cluster and Jaeger with kproxy in front, send sample requests, open kproxy tui on them (the table without a terminal).
	./bin/kproxy demo --dir .cache/demo

.PHONY: check
check: $(BIN_DIR)/golangci-lint ## gofmt/goimports, go vet and golangci-lint (.golangci.yml); CI runs it before the tests.
	@out=$$($(BIN_DIR)/golangci-lint fmt --diff ./... 2>&1); if [ -n "$$out" ]; then echo "$$out"; echo ">> not formatted: run make fmt"; exit 1; fi
	$(GO) vet ./...
	$(BIN_DIR)/golangci-lint run ./...

.PHONY: fmt
fmt: $(BIN_DIR)/golangci-lint ## gofmt and goimports the tree.
	$(BIN_DIR)/golangci-lint fmt ./...

.PHONY: clean
clean: ## Remove built binaries (keeps the Go module cache).
	rm -rf .cache bin
