# warren: two commands on a fresh machine: `make demo` and `make test`.
GO ?= go
TEST_TIMEOUT ?= 40m
FAULTS_TIMEOUT ?= 30m

.PHONY: all broker demo test faults bench vet fmt

all: vet test

## broker: make sure RabbitMQ answers on 127.0.0.1:5672 (start or install it if needed)
broker:
	@./scripts/broker.sh

## demo: declare the topology, publish ordinary and delayed messages, print requested vs actual delay
demo: broker
	$(GO) run ./examples/delays

## test: vet, then every test (race detector on) against the real broker
test: broker vet
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...

## faults: the fault suite (internal/faults): on throwaway nodes of its own, a stream of messages with
## retries, delays and poison while the broker is killed, connections are closed, a consumer process is
## killed and unparseable messages arrive; one line per case, fails on any loss or stall
faults: broker
	$(GO) vet -tags faults ./internal/faults/
	$(GO) test -tags faults -race -count=1 -timeout $(FAULTS_TIMEOUT) -v ./internal/faults/

## bench: throughput and delay accuracy, side by side with raw amqp091-go and watermill-amqp
bench: broker
	$(GO) run ./internal/bench

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l .)" || (echo "gofmt would change:"; gofmt -l .; exit 1)

fmt:
	gofmt -w .
