#!/usr/bin/env bash
# Makes sure a Redis answers on 127.0.0.1:6379 (or $WARREN_REDIS_PORT), for the tests of
# redisstore and the fault suite's shared CopyStore: use a running one; else start the
# installed redis-server (keeping nothing on disk); else `docker compose up -d redis` where a
# Docker engine runs; else install redis-server with apt-get and start it.
set -euo pipefail

port=${WARREN_REDIS_PORT:-6379}
answers() { (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }
wait_for() {
  for _ in $(seq 1 30); do
    answers && return 0
    sleep 1
  done
  echo "redis: nothing answers on 127.0.0.1:$port after 30s" >&2
  return 1
}
start_installed() {
  echo "redis: starting redis-server on 127.0.0.1:$port"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
    --dir "${TMPDIR:-/tmp}" >/dev/null
  wait_for
}

if answers; then
  exit 0
fi
if command -v redis-server >/dev/null 2>&1; then
  start_installed
elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  echo "redis: docker compose up -d redis"
  docker compose -f "$(dirname "$0")/../docker-compose.yml" up -d redis
  wait_for
elif command -v apt-get >/dev/null 2>&1; then
  echo "redis: installing redis-server with apt-get"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  PATH="$PATH:/usr/sbin:/usr/bin"
  # The package may have started one (on systemd machines); start ours if not.
  answers || start_installed
else
  echo "redis: no Redis on 127.0.0.1:$port, and neither redis-server, docker nor apt-get to get one" >&2
  exit 1
fi
echo "redis: Redis answers on 127.0.0.1:$port"
