# warren: two commands on a fresh machine: `make demo` and `make test`.
GO ?= go
TEST_TIMEOUT ?= 40m
FAULTS_TIMEOUT ?= 30m
# Broker tests wait on the broker, not the CPU: each test binary runs up to TEST_PARALLEL of its
# parallel tests at once (go test's default is GOMAXPROCS), and TEST_PACKAGES binaries run at
# once (go test's default is GOMAXPROCS too). On 2 cores, 4 binaries at once took make test
# from 3 min 58 s to 2 min 40 s; the broker needs its file handle limit raised for it (make
# broker does: with 1024, RabbitMQ 3.10 stopped accepting connections in the middle of a run).
TEST_PARALLEL ?= 8
TEST_PACKAGES ?= 4

.PHONY: all broker broker4 redis postgres chromium demo demos demo-ui screenshots unit lint test test-rabbitmq4 faults cluster bench bench-cpu vet fmt

all: lint test

## broker: make sure RabbitMQ answers on 127.0.0.1:5672 (start or install it if needed), its management
## API on 127.0.0.1:15672 (the plugin enabled online if need be)
broker:
	@./scripts/broker.sh

## redis: make sure Redis answers on 127.0.0.1:6379 (start or install it if needed): the tests of
## middleware/redisstore and the fault suite's shared CopyStore use it
redis:
	@./scripts/redis.sh

## postgres: make sure PostgreSQL answers on 127.0.0.1:5432 and lets postgres/postgres in (start or
## install it if needed): the tests of outbox use it
postgres:
	@./scripts/postgres.sh

## chromium: make sure Chromium is installed (apt-get install chromium if need be), for the browser
## tests of the dashboard (ui)
chromium:
	@./scripts/chromium.sh

## broker4: make sure a RabbitMQ 4.0.5 node answers on 127.0.0.1:5680, beside the system's broker, its
## management API on 127.0.0.1:15680 (scripts/rabbitmq4.sh: Debian trixie's packages unpacked into
## ~/.cache/warren/rabbitmq4)
broker4:
	@./scripts/rabbitmq4.sh start

## demo: declare the topology, publish ordinary and delayed messages, print requested vs actual delay
demo: broker
	$(GO) run ./examples/delays

## demo-ui: a backlog of 20,000 poison messages and the dashboard on http://127.0.0.1:8080/warren/
## (examples/dashboard; user admin, its password printed)
demo-ui: broker
	$(GO) run ./examples/dashboard

## screenshots: save the dashboard's main pages into docs/img (scripts/screenshots.sh)
screenshots: broker chromium
	@./scripts/screenshots.sh

## demos: build every demo of examples/, run each one that ends by itself (the consumer beside the
## publish demo) and check its output (examples/examples_test.go; the output is shown)
demos: broker
	$(GO) test -count=1 -v -run TestDemos ./examples/

## unit: the unit tests alone (go test -short: no broker, Redis or time limits; the tests of warren's
## logic on the in-memory broker), in under 30 s; without the race detector, which doubles it (make test
## runs every test under it)
unit:
	$(GO) test -short -count=1 -p $(TEST_PACKAGES) -parallel $(TEST_PARALLEL) ./...

## lint: golangci-lint (.golangci.yml: vet, staticcheck, errcheck, revive, ...) on the root module
## and on tools/, built from the module proxy into .bin/ the first time (a few minutes), at the
## version pinned here
GOLANGCI_LINT_VERSION ?= v2.15.0
GOLANGCI_LINT := $(CURDIR)/.bin/golangci-lint-$(GOLANGCI_LINT_VERSION)
lint: $(GOLANGCI_LINT)
	$(GOLANGCI_LINT) run ./...
	cd tools && $(GOLANGCI_LINT) run --config ../.golangci.yml ./...

$(GOLANGCI_LINT):
	GOBIN=$(CURDIR)/.bin $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(CURDIR)/.bin/golangci-lint $@

## test: vet, then every test (race detector on) against the real broker
test: broker redis postgres chromium vet
	$(GO) test -race -count=1 -p $(TEST_PACKAGES) -parallel $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT) ./...

## test-rabbitmq4: every test again, against RabbitMQ 4.0.5 (the throwaway nodes that the fault
## tests start run the system's version)
test-rabbitmq4: broker4 redis postgres chromium vet
	WARREN_AMQP_URL=amqp://guest:guest@127.0.0.1:5680/ WARREN_MANAGEMENT_URL=http://guest:guest@127.0.0.1:15680/ $(GO) test -race -count=1 -p $(TEST_PACKAGES) -parallel $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT) ./...

## faults: the fault suite (tools/faults): on throwaway nodes of its own, a stream of messages with
## retries, delays and poison while the broker is killed, connections are closed, a consumer process is
## killed and unparseable messages arrive; a queue ordered by key under consumer and broker kills (fails
## on a key's messages handled out of order too); one line per case, fails on any loss or stall. Then the
## crash tests of the packages (files with the build tag faults alone): a node of their own restarted,
## killed or lost from a 3-node cluster under one component.
CRASH_TEST_FILES = $(shell grep -rl --include='*_test.go' '^//go:build faults$$' . | grep -v '^./tools/')
CRASH_TESTS = $(shell sed -n 's/^func \(Test[A-Za-z0-9_]*\)(t \*testing.T).*/\1/p' $(CRASH_TEST_FILES) | paste -sd'|')
faults: broker redis postgres
	$(GO) vet -tags faults ./...
	cd tools && $(GO) vet -tags faults ./...
	cd tools && $(GO) test -tags faults -race -count=1 -timeout $(FAULTS_TIMEOUT) -v ./faults/
	$(GO) test -tags faults -race -count=1 -p $(TEST_PACKAGES) -parallel $(TEST_PARALLEL) -timeout $(FAULTS_TIMEOUT) \
		-run '^($(CRASH_TESTS))$$' $(sort $(dir $(CRASH_TEST_FILES)))

## cluster: the cluster cases of the fault suite (tools/faults, build tag cluster): on a 3-node
## cluster of throwaway RabbitMQ 4.0.5 nodes (scripts/rabbitmq4.sh's unpacked install), the stream
## flows from a publisher on one node to routers on another while the work queue's leader, the
## routers' node or the publisher's node is killed (five cases: the publisher's node leading the
## delay levels or the work queue, the routers' node leading the levels or nothing); one line per
## case, fails on any loss, a failed Publish or a pause over 2 s (5 s if the node led the delay
## levels). CLUSTER_RABBITMQ=system runs them on the system's RabbitMQ instead (3.10.8 loses
## confirmed delayed messages when the publisher's node dies: see the README).
CLUSTER_RABBITMQ ?= 4.0
RMQ4_PREFIX ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/warren/rabbitmq4
cluster: redis
	cd tools && $(GO) vet -tags cluster ./faults/
ifeq ($(CLUSTER_RABBITMQ),system)
	cd tools && $(GO) test -tags cluster -race -count=1 -timeout $(FAULTS_TIMEOUT) -v ./faults/
else
	./scripts/rabbitmq4.sh setup "$(RMQ4_PREFIX)"
	cd tools && PATH="$(RMQ4_PREFIX)/root/usr/lib/erlang/bin:$$PATH" WARREN_RABBITMQ_BIN="$(RMQ4_PREFIX)/root/usr/lib/rabbitmq/bin" \
		$(GO) test -tags cluster -race -count=1 -timeout $(FAULTS_TIMEOUT) -v ./faults/
endif

## bench: throughput and delay accuracy, side by side with raw amqp091-go and watermill-amqp
## (tools/bench)
bench: broker redis postgres
	cd tools && $(GO) run ./bench

## bench-cpu: instructions, allocations and bytes per message, counted by valgrind's callgrind in
## the client process, side by side with raw amqp091-go and watermill-amqp (tools/bench -cpu)
bench-cpu: broker redis
	@command -v valgrind >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind)
	cd tools && $(GO) run ./bench -cpu

## vet: go vet on the root module, and on tools/ with each build tag of its fault suite (so that
## make test, which runs none of tools/, still compiles all of it); then gofmt on both
vet:
	$(GO) vet ./...
	cd tools && $(GO) vet ./... && $(GO) vet -tags faults ./... && $(GO) vet -tags cluster ./...
	@test -z "$$(gofmt -l .)" || (echo "gofmt would change:"; gofmt -l .; exit 1)

fmt:
	gofmt -w .
