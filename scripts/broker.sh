#!/usr/bin/env bash
# Makes sure a RabbitMQ broker answers on 127.0.0.1:5672 (or $WARREN_AMQP_PORT):
# use a running one; else start the installed rabbitmq-server; else `docker compose up -d`
# where a Docker engine runs; else install rabbitmq-server with apt-get and start it.
set -euo pipefail

port=${WARREN_AMQP_PORT:-5672}
answers() { (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }
wait_for() {
  for _ in $(seq 1 120); do
    answers && return 0
    sleep 1
  done
  echo "broker: nothing answers on 127.0.0.1:$port after 120s" >&2
  return 1
}
start_installed() {
  echo "broker: starting rabbitmq-server"
  rabbitmq-server -detached >/dev/null 2>&1 || true
  timeout 120 rabbitmqctl await_startup >/dev/null 2>&1 || true
  wait_for
}

if answers; then
  exit 0
fi
if command -v rabbitmq-server >/dev/null 2>&1; then
  start_installed
elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  echo "broker: docker compose up -d rabbitmq"
  docker compose -f "$(dirname "$0")/../docker-compose.yml" up -d rabbitmq
  wait_for
elif command -v apt-get >/dev/null 2>&1; then
  echo "broker: installing rabbitmq-server with apt-get"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null
  PATH="$PATH:/usr/sbin:/usr/lib/rabbitmq/bin"
  start_installed
else
  echo "broker: no RabbitMQ on 127.0.0.1:$port, and neither rabbitmq-server, docker nor apt-get to get one" >&2
  exit 1
fi
echo "broker: RabbitMQ answers on 127.0.0.1:$port"
