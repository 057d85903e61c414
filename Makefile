# inboxmq — `make help` lists the targets.
#
# `make test` and `make demo` do all set-up themselves on a fresh machine:
# they start RabbitMQ, PostgreSQL and Redis (docker compose when a Docker
# engine answers, the local servers otherwise, installed with apt-get when
# missing and run as root) and install missing tools (scripts/tools.sh,
# into bin/tools when not through apt-get).

SHELL := bash
.DEFAULT_GOAL := help

GO        ?= go
PKGS      ?= ./...
TIMEOUT   ?= 20m
BIN_DIR   ?= bin
WORKER    := $(BIN_DIR)/payment-worker
TOOLS_BIN := $(CURDIR)/bin/tools

# Tools that scripts/tools.sh builds come first.
export PATH := $(TOOLS_BIN):$(PATH)

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z0-9_\/-]+:.*##/ {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: up
up: ## Start RabbitMQ, PostgreSQL and Redis (docker compose, or the local servers)
	@scripts/services.sh

.PHONY: down
down: ## Stop the docker compose stack (local servers are left running)
	@if command -v docker >/dev/null && docker info >/dev/null 2>&1; then docker compose down; else echo "no Docker engine: local servers are left running"; fi

.PHONY: cluster
cluster: ## Start a local cluster without Docker (3 RabbitMQ nodes, PostgreSQL primary + standby, Redis + 3 Sentinels) and print its URLs; CLUSTER_TLS=1 adds TLS
	@scripts/cluster.sh up

.PHONY: cluster-down
cluster-down: ## Stop the cluster of make cluster (by PID) and remove its data
	@scripts/cluster.sh down

.PHONY: tools
tools: ## Install missing tools: promtool and amtool (apt-get as root, else go install), chromium (apt-get) and the pinned golangci-lint
	@scripts/tools.sh

.PHONY: test
test: up ## The CI command: the alert-rule tests, then every Go test with -race (go test's summary ends the output)
	@scripts/tools.sh promtool amtool chromium
	@if [ -f scripts/test-alerts.sh ]; then bash scripts/test-alerts.sh; else echo "scripts/test-alerts.sh not present: no alert-rule tests"; fi
	$(GO) test -race -count=1 -timeout $(TIMEOUT) $(PKGS)

.PHONY: test/race
test/race: up ## Run the Go tests with the race detector
	$(GO) test -race -count=1 -timeout $(TIMEOUT) $(PKGS)

.PHONY: test/short
test/short: up ## The quick loop: the Go tests without -race (-short skips only the test that starts a local cluster)
	$(GO) test -short -count=1 -timeout $(TIMEOUT) $(PKGS)

BENCH_N    ?= 20000
BENCH_RUNS ?= 5
# The cluster that make cluster starts (scripts/cluster.sh writes its URLs
# to $(CLUSTER_DIR)/env); CLUSTER_AMQP_URLS in the environment wins.
CLUSTER_DIR ?= /var/tmp/inboxmq-cluster

.PHONY: bench
bench: up ## One-run benchmark against the ceilings (cmd/inboxbench): msgs/s, latency, allocs, CPU, RSS and the ratios, per-message and group commit on classic and quorum queues; then the per-message cases at 32 handlers; then, when a cluster is up (make cluster), the quorum cases on its 3 nodes
	$(GO) run ./cmd/inboxbench -n $(BENCH_N) -runs $(BENCH_RUNS) -batch 64 -inflight 8
	$(GO) run ./cmd/inboxbench -n $(BENCH_N) -runs $(BENCH_RUNS) -workers 32 -cases b,d,f,fl,g -quorum= -latency 0
	@urls="$${CLUSTER_AMQP_URLS:-}"; \
	if [ -z "$$urls" ] && [ -f "$(CLUSTER_DIR)/env" ]; then urls=$$(. "$(CLUSTER_DIR)/env" && echo "$$CLUSTER_AMQP_URLS"); fi; \
	if [ -z "$$urls" ]; then echo "no cluster up (make cluster): the 3-node cases are left out"; exit 0; fi; \
	echo "== the per-message and group-commit cases on the 3-node cluster (its first node; quorum queues replicate to all 3)"; \
	$(GO) run ./cmd/inboxbench -amqp "$${urls%%,*}" -n $(BENCH_N) -runs $(BENCH_RUNS) -batch 64 -inflight 8 -cases b,c,d,e -latency 0
	$(GO) run ./cmd/benchexample -n $(BENCH_N) -runs $(BENCH_RUNS)

# bench/scale: the rows already in the table at each measured size. The
# default reaches 100 M rows: 28 min on the 2-core VM
# (docs/scaling.md, "The full run"); SCALE_SIZES=0,10000000 takes about 10.
# The run measures the two tables side by side where both fit its disk
# budget, one at a time where only one does (100 M rows here), and stops
# short of a size where neither does, saying which. SCALE_FLAGS passes more
# flags (go run ./cmd/inboxscale -h), e.g. SCALE_FLAGS='-disk-budget 0.6'.
SCALE_SIZES ?= 0,10000000,100000000
SCALE_FLAGS ?=

.PHONY: bench/scale
bench/scale: up ## The inbox table at scale (cmd/inboxscale, not part of bench): claims/s and p99 at SCALE_SIZES rows (default up to 100 M, about 30 min; SCALE_SIZES=0,10000000 about 5), today's table and the partitioned one; retention over a simulated week; sizes. Its own database, dropped at the end
	$(GO) run ./cmd/inboxscale -sizes $(SCALE_SIZES) $(SCALE_FLAGS)

.PHONY: bench/go
bench/go: up ## Run the packages' go test benchmarks (no tests)
	$(GO) test -run '^$$' -bench . -benchmem -count=1 -timeout $(TIMEOUT) $(PKGS)

.PHONY: build
build: ## Build the payment-worker example and its load tool (cmd/inboxload) into bin/
	$(GO) build -o $(WORKER) ./examples/payment-worker
	$(GO) build -o $(BIN_DIR)/inboxload ./cmd/inboxload

.PHONY: demo
demo: ## One command: services, build, migrate, run a worker, publish a burst with duplicates, check the effects
	@scripts/demo.sh

.PHONY: lint
lint: ## Run gofmt, go vet and golangci-lint (the pinned version, installed if missing); fails on any finding
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet $(PKGS)
	@scripts/tools.sh golangci-lint
	$(TOOLS_BIN)/golangci-lint run $(PKGS)

.PHONY: tidy
tidy: ## go mod tidy (do not run while others edit go.mod)
	$(GO) mod tidy

.PHONY: db/reset
db/reset: up ## Drop and recreate the test database (inboxmq_test)
	$(GO) run ./scripts/dbreset

.PHONY: verify
verify: ## Check that go.mod/go.sum are tidy, then lint (gofmt, vet, golangci-lint), then that docs/guarantees.md cites real tests
	@$(GO) mod tidy -diff || { echo "go.mod/go.sum are not tidy: run make tidy"; exit 1; }
	$(GO) mod verify
	@$(MAKE) --no-print-directory lint
	@scripts/check-guarantees.sh

.PHONY: chaos
CHAOS_ARGS ?= -orders 500 -workers 4 -duration 60s
# -restart-redis runs the workers on a Redis server of the run's own (a
# free port, stopped by its PID) and restarts that one as a fault; the
# local Redis is never restarted. CHAOS_REDIS= leaves that fault out.
CHAOS_REDIS ?= -restart-redis
# -restart-postgres runs them on a PostgreSQL server of the run's own
# (internal/pgserver, stopped by its PID) and restarts that one as a
# fault; the local PostgreSQL is never restarted. CHAOS_PG= leaves it out.
CHAOS_PG ?= -restart-postgres

chaos: up ## Full-size fault-injection run against payment-worker processes; restarts only a Redis and a PostgreSQL server of its own (CHAOS_ARGS="-seed 42 …" to tune)
	$(GO) run ./cmd/inboxchaos $(CHAOS_ARGS) $(CHAOS_REDIS) $(CHAOS_PG)

.PHONY: clean
clean: ## Remove build output (the tools in bin/tools stay)
	find $(BIN_DIR) -mindepth 1 -maxdepth 1 ! -name tools -exec rm -rf {} + 2>/dev/null || true
