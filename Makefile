# mcsannotations: `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
ROOT := $(abspath .)
BIN := $(ROOT)/bin
CACHE := $(ROOT)/.cache

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

# Version and commit stamped into both binaries (-version) and the images'
# labels. Static binaries (no cgo): the images hold nothing but the binary,
# CA certificates and /etc/passwd. `make build` and the host's image share
# one build: same flags, same output.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
SOURCE ?= https://github.com/mcsannotations/mcsannotations
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
GOBUILD = CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)'

.PHONY: build
build: ## Build bin/coredns (stock CoreDNS plus mcsannotations, before kubernetes), bin/mcs-annotator, bin/mcsctl, bin/mcs-snapshot-dir
	cd coredns-build && $(GOBUILD) -o $(BIN)/coredns .
	$(GOBUILD) -o $(BIN)/mcs-annotator ./cmd/mcs-annotator
	$(GOBUILD) -o $(BIN)/mcsctl ./cmd/mcsctl
	$(GOBUILD) -o $(BIN)/mcs-snapshot-dir ./cmd/mcs-snapshot-dir

# --- images (tools/image: go-containerregistry, no Docker, no base image) ----
# One OCI archive per image in bin/images/, each an index of IMAGE_ARCHS.
# The host's architecture reuses `make build`'s binaries; each other one is
# cross-compiled into bin/linux_<arch>/.
REGISTRY ?= localhost/mcsannotations
IMAGE_TAG ?= $(VERSION)
IMAGE_ARCHS ?= amd64 arm64
HOST_ARCH := $(shell $(GO) env GOARCH)
CA_BUNDLE ?= /etc/ssl/certs/ca-certificates.crt
archbin = $(if $(filter $(1),$(HOST_ARCH)),$(BIN),$(BIN)/linux_$(1))
IMAGE_FLAGS = -out $(BIN)/images -registry $(REGISTRY) -tag $(IMAGE_TAG) -version $(VERSION) -commit $(COMMIT) \
	-source $(SOURCE) -ca-bundle $(CA_BUNDLE) $(foreach a,$(IMAGE_ARCHS),-platform linux/$(a)=$(call archbin,$(a)))

.PHONY: image push image-test
image: build ## OCI archives of our CoreDNS and the annotator (linux/amd64 and arm64) in bin/images/
	@test -r $(CA_BUNDLE) || { echo "no $(CA_BUNDLE): apt-get install ca-certificates" >&2; exit 1; }
	$(foreach a,$(filter-out $(HOST_ARCH),$(IMAGE_ARCHS)),\
		cd $(ROOT)/coredns-build && GOOS=linux GOARCH=$(a) $(GOBUILD) -o $(BIN)/linux_$(a)/coredns . && \
		cd $(ROOT) && GOOS=linux GOARCH=$(a) $(GOBUILD) -o $(BIN)/linux_$(a)/mcs-annotator ./cmd/mcs-annotator && \
		GOOS=linux GOARCH=$(a) $(GOBUILD) -o $(BIN)/linux_$(a)/mcs-snapshot-dir ./cmd/mcs-snapshot-dir &&) true
	cd tools/image && $(GO) run . build $(IMAGE_FLAGS)
push: ## Push bin/images/*.oci.tar to REGISTRY (make push REGISTRY=registry.example/team; docker/podman credentials)
	cd tools/image && $(GO) run . push -registry $(REGISTRY) -tag $(IMAGE_TAG) $(BIN)/images/*.oci.tar
image-test: image ## Read the archives back: entrypoint, user, platforms, labels, -version of the binaries inside
	cd tools/image && MCS_IMAGES=$(BIN)/images MCS_IMAGE_VERSION=$(VERSION) MCS_IMAGE_COMMIT=$(COMMIT) \
		MCS_IMAGE_SOURCE=$(SOURCE) MCS_IMAGE_REF=$(REGISTRY)/NAME:$(IMAGE_TAG) $(GO) test -count=1 ./...

.PHONY: unit
unit: ## Unit tests of the product module, the benchmark program's report and coredns-build (with -race); no e2e
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v '/test/') ./test/bench/
	cd coredns-build && $(GO) test -count=1 ./...

.PHONY: test
test: unit fuzz e2e soak-short bench-smoke image-test ## All tests: unit, fuzz (short), end-to-end, the soak's short form, the benchmark program's smoke run, the images

# Each fuzz target runs FUZZTIME (a soak runs them longer: make fuzz FUZZTIME=10m).
FUZZTIME ?= 10s
FUZZ_TARGETS := ./annotation:FuzzParseExports ./annotation:FuzzParseImports ./annotation:FuzzParseEndpoint ./annotation:FuzzParseHeartbeat ./annotation:FuzzParsePodList ./internal/snapshot:FuzzDecodePod \
	./internal/table:FuzzLookup ./plugin/mcsannotations:FuzzServeDNS
# A fault loop against real kube-apiservers for SOAK_DURATION (test/soak),
# then each fuzz target for SOAK_FUZZTIME. Not part of `make test`, which
# runs soak-short (about 75 s), the short form. soak.json and soak.md go to
# SOAK_OUT; the short form's to SOAK_OUT/short, so that a make test does not
# replace the summary of the last make soak, which make bench includes.
SOAK_DURATION ?= 10m
SOAK_FUZZTIME ?= 2m
SOAK_OUT ?= $(ROOT)/soak-results
SOAK_TIMEOUT ?= 2h # go test's bound on the whole run: raise it with a SOAK_DURATION over about 1h45m
.PHONY: soak soak-short
soak: build tools ## Fault loop (API server kill/hang, peer flaps, CoreDNS restarts/reloads, snapshot damage, churn) for SOAK_DURATION (10m) with DNS probing, then the fuzz targets for SOAK_FUZZTIME (2m each)
	env $$($(ROOT)/tools/install.sh env) MCS_E2E_COREDNS=$(BIN)/coredns MCS_E2E_ANNOTATOR=$(BIN)/mcs-annotator SOAK_DURATION=$(SOAK_DURATION) SOAK_OUT=$(SOAK_OUT) \
		$(GO) test -count=1 -timeout $(SOAK_TIMEOUT) -v -run '^TestSoak$$' ./test/soak/
	$(MAKE) fuzz FUZZTIME=$(SOAK_FUZZTIME)
soak-short: build tools ## The soak's short form (75 s of faults), as make test could run it
	env $$($(ROOT)/tools/install.sh env) MCS_E2E_COREDNS=$(BIN)/coredns MCS_E2E_ANNOTATOR=$(BIN)/mcs-annotator SOAK_DURATION=75s SOAK_OUT=$(SOAK_OUT)/short \
		$(GO) test -count=1 -timeout 10m -v -run '^TestSoak$$' ./test/soak/

.PHONY: fuzz
fuzz: ## Each fuzz target for FUZZTIME (10s): annotation parsers, snapshot records, lookups, ServeDNS with any message
# Go 1.26's fuzz coordinator can end a duration-bounded run with a bare
# "context deadline exceeded" as -fuzztime expires (golang/go#75804, fixed in
# Go 1.27): such a run, which wrote no failing input, is run once more; any
# other failure fails at once.
	@set -e; for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; \
		for try in 1 2; do \
			echo "fuzz $$pkg $$fn ($(FUZZTIME))"; \
			out=$$(mktemp); rc=0; $(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) $$pkg >$$out 2>&1 || rc=$$?; cat $$out; \
			if [ $$rc -eq 0 ]; then rm -f $$out; break; fi; \
			if [ $$try -eq 1 ] && grep -q 'context deadline exceeded' $$out && ! grep -q 'Failing input written' $$out; then \
				echo "fuzz $$fn: the coordinator's deadline race (golang/go#75804), nothing found: once more"; rm -f $$out; continue; fi; \
			rm -f $$out; exit 1; \
		done; done

# --- tools, e2e and demo (real etcd + kube-apiserver, no Docker) -------------
# (owned by the e2e harness work: see test/README.md)
.PHONY: tools e2e demo
tools: ## Build etcd and kube-apiserver into .cache/tools; install dig, dnsperf and valgrind
	$(ROOT)/tools/install.sh
e2e: build tools ## End-to-end tests against real kube-apiservers and bin/coredns
	env $$($(ROOT)/tools/install.sh env) MCS_E2E_COREDNS=$(BIN)/coredns MCS_E2E_ANNOTATOR=$(BIN)/mcs-annotator \
		$(GO) test -count=1 -timeout 30m -v $(if $(E2E_RUN),-run '$(E2E_RUN)') ./test/harness/ ./test/e2e/
demo: build tools ## Two local clusters, sample workloads, the MCS controller and our CoreDNS in each, a cut link
	@env $$($(ROOT)/tools/install.sh env) MCS_E2E_COREDNS=$(BIN)/coredns $(GO) run ./test/demo $(DEMO_FLAGS)

# --- benchmarks (issue 6; test/bench) ------------------------------------------
# make bench-relay writes relay.json and relay.md to RELAY_OUT; make bench
# includes the last relay.md there in BENCHMARKS.md, as it does soak.md.
RELAY_OUT ?= $(ROOT)/bench/relay
.PHONY: bench bench-smoke bench-render bench-relay bench-relay-smoke
bench: build tools ## Ours vs hosts and in-tree multicluster, probes, offline figures; bench/raw/<time>/results.json and BENCHMARKS.md (~25 min); BENCH_OLD_COREDNS=path/to/old/coredns also measures that build in the same run, side by side: heap per endpoint and cold start from a snapshot, propagation and resync in turns, QPS beside hosts; includes the last make soak's summary
	env $$($(ROOT)/tools/install.sh env) MCS_E2E_COREDNS=$(BIN)/coredns $(GO) run ./test/bench $(if $(BENCH_OLD_COREDNS),-compare-coredns $(BENCH_OLD_COREDNS)) $(if $(wildcard $(SOAK_OUT)/soak.md),-soak $(SOAK_OUT)/soak.md) $(if $(wildcard $(RELAY_OUT)/relay.md),-relay-report $(RELAY_OUT)/relay.md) $(BENCH_FLAGS)
bench-render: ## Render BENCHMARKS.md again from a run's results: make bench-render RESULTS=bench/raw/<time>/results.json
	$(GO) run ./test/bench -render $(RESULTS) -out $(ROOT)/BENCHMARKS.md
bench-relay: build tools ## Relay hubs at scale: RELAY_FLAGS (default 1,000 origins on 4 kube-apiservers, 10 services x 3 endpoints) through two hubs to one edge; relay.json and relay.md in RELAY_OUT (bench/relay), included by the next make bench
	env $$($(ROOT)/tools/install.sh env) MCS_E2E_COREDNS=$(BIN)/coredns MCS_E2E_ANNOTATOR=$(BIN)/mcs-annotator $(GO) run ./test/bench -relay -relay-out $(RELAY_OUT) $(RELAY_FLAGS)
bench-relay-smoke: build tools ## The relay benchmark at tiny sizes (4 origins; report in bench/raw/relay-smoke/)
	env $$($(ROOT)/tools/install.sh env) MCS_E2E_COREDNS=$(BIN)/coredns MCS_E2E_ANNOTATOR=$(BIN)/mcs-annotator $(GO) run ./test/bench -relay-smoke
bench-smoke: build tools ## The benchmark program end to end at tiny sizes (about 2 min; report in bench/raw/smoke/)
	env $$($(ROOT)/tools/install.sh env) MCS_E2E_COREDNS=$(BIN)/coredns $(GO) run ./test/bench -smoke

# --- monitoring (manifests/monitoring; test/monitoring is a module of its own) --
.PHONY: monitoring-test
monitoring-test: build tools ## Parse the alert rules and dashboard with Prometheus's parser; check them against a live scrape
	cd test/monitoring && env $$($(ROOT)/tools/install.sh env) MCS_E2E_COREDNS=$(BIN)/coredns MCS_E2E_ANNOTATOR=$(BIN)/mcs-annotator \
		$(GO) test -count=1 -timeout 15m -v ./...

# --- real nodes (test/node): kubelet, containerd, kube-proxy, no Docker ---------
# Needs root. tools/install.sh node builds kubelet, kube-proxy,
# kube-controller-manager, kube-scheduler and kubectl (the API server's
# version) and installs containerd, runc, the CNI plugins and iptables.
# The product images are built with the overlays' tag (v0.1.0) for the
# host's architecture only, and side-loaded into each node.
NODE_IMAGES := $(BIN)/images/node
NODE_TAG := v0.1.0
.PHONY: node-images node-prereqs e2e-node up
node-images: ## The real-node tests' images (workload: HTTP echo and DNS client; pause) in bin/images/node/
	cd test/node && CGO_ENABLED=0 $(GO) build -o $(BIN)/node/workload ./workload && \
		CGO_ENABLED=0 $(GO) build -o $(BIN)/node/pause ./pause
	cd tools/image && $(GO) run . build -test-images -out $(NODE_IMAGES) -registry localhost/mcsannotations -tag node \
		-version $(VERSION) -commit $(COMMIT) -source $(SOURCE) -ca-bundle $(CA_BUNDLE) -platform linux/$(HOST_ARCH)=$(BIN)/node
node-prereqs:
	$(ROOT)/tools/install.sh node
	$(MAKE) image IMAGE_TAG=$(NODE_TAG) IMAGE_ARCHS=$(HOST_ARCH)
	$(MAKE) node-images
NODE_ENV = env $$($(ROOT)/tools/install.sh env) MCS_E2E_IMAGES=$(BIN)/images
e2e-node: node-prereqs ## Real single-node clusters (root; test/node): our images under a kubelet, Pods resolving through kube-dns, ClusterSetIPs carrying traffic
	cd test/node && $(NODE_ENV) $(GO) test -count=1 -timeout 30m -v $(if $(NODE_RUN),-run '$(NODE_RUN)') ./
up: node-prereqs ## Two real single-node clusters (root) with the product and sample workloads: prints the kubeconfigs, stays up until Ctrl-C
	cd test/node && $(NODE_ENV) $(GO) run ./up
