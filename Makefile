# mcsannotations: `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
ROOT := $(abspath .)
BIN := $(ROOT)/bin
CACHE := $(ROOT)/.cache

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

.PHONY: build
build: ## Build bin/coredns (stock CoreDNS plus mcsannotations, before kubernetes) and bin/mcs-annotator
	cd coredns-build && $(GO) build -o $(BIN)/coredns .
	$(GO) build -o $(BIN)/mcs-annotator ./cmd/mcs-annotator
	$(GO) build -o $(BIN)/mcsctl ./cmd/mcsctl

.PHONY: unit
unit: ## Unit tests of the product module and coredns-build (with -race); no e2e
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v '/test/')
	cd coredns-build && $(GO) test -count=1 ./...

.PHONY: test
test: unit fuzz e2e bench-smoke ## All tests: unit, fuzz (short), end-to-end and the benchmark program's smoke run

# Each fuzz target runs FUZZTIME (a soak runs them longer: make fuzz FUZZTIME=10m).
FUZZTIME ?= 10s
FUZZ_TARGETS := ./annotation:FuzzParseExports ./annotation:FuzzParseImports ./internal/table:FuzzDecodePod \
	./internal/table:FuzzLookup ./plugin/mcsannotations:FuzzServeDNS
.PHONY: fuzz
fuzz: ## Each fuzz target for FUZZTIME (10s): annotation parsers, snapshot records, lookups, ServeDNS with any message
	@set -e; for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "fuzz $$pkg $$fn ($(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) $$pkg; done

# --- tools, e2e and demo (real etcd + kube-apiserver, no Docker) -------------
# (owned by the e2e harness work: see test/README.md)
.PHONY: tools e2e demo
tools: ## Build etcd and kube-apiserver into .cache/tools; install dig, dnsperf and valgrind
	$(ROOT)/tools/install.sh
e2e: build tools ## End-to-end tests against real kube-apiservers and bin/coredns
	env $$($(ROOT)/tools/install.sh env) MCS_E2E_COREDNS=$(BIN)/coredns MCS_E2E_ANNOTATOR=$(BIN)/mcs-annotator \
		$(GO) test -count=1 -timeout 30m -v $(if $(E2E_RUN),-run '$(E2E_RUN)') ./test/harness/ ./test/e2e/
demo: build tools ## Two local clusters, sample workloads, our CoreDNS, a cut link
	@env $$($(ROOT)/tools/install.sh env) MCS_E2E_COREDNS=$(BIN)/coredns $(GO) run ./cmd/mcs-demo $(DEMO_FLAGS)

# --- benchmarks (issue 6; cmd/mcs-bench) ---------------------------------------
.PHONY: bench bench-smoke bench-render
bench: build tools ## Ours vs hosts and in-tree multicluster, offline figures; bench/raw/<time>/results.json and BENCHMARKS.md (~20 min)
	env $$($(ROOT)/tools/install.sh env) MCS_E2E_COREDNS=$(BIN)/coredns $(GO) run ./cmd/mcs-bench $(BENCH_FLAGS)
bench-render: ## Render BENCHMARKS.md again from a run's results: make bench-render RESULTS=bench/raw/<time>/results.json
	$(GO) run ./cmd/mcs-bench -render $(RESULTS) -out $(ROOT)/BENCHMARKS.md
bench-smoke: build tools ## The benchmark program end to end at tiny sizes (about 2 min; report in bench/raw/smoke/)
	env $$($(ROOT)/tools/install.sh env) MCS_E2E_COREDNS=$(BIN)/coredns $(GO) run ./cmd/mcs-bench -smoke

# --- monitoring (manifests/monitoring; test/monitoring is a module of its own) --
.PHONY: monitoring-test
monitoring-test: build tools ## Parse the alert rules and dashboard with Prometheus's parser; check them against a live scrape
	cd test/monitoring && env $$($(ROOT)/tools/install.sh env) MCS_E2E_COREDNS=$(BIN)/coredns MCS_E2E_ANNOTATOR=$(BIN)/mcs-annotator \
		$(GO) test -count=1 -timeout 15m -v ./...
