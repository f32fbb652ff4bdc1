#!/usr/bin/env bash
# Makes sure a RabbitMQ broker answers on 127.0.0.1:5672 (or $WARREN_AMQP_PORT), with its
# management plugin's HTTP API on 127.0.0.1:15672 (enabled online if it is not):
# use a running one (restarted, unless WARREN_BROKER_NO_RESTART=1, with a higher open-file
# limit if it has the common default of 1024, or if it can no longer dead-letter); else start
# the installed rabbitmq-server; else `docker compose up -d` where a Docker engine runs; else
# install rabbitmq-server with apt-get and start it.
set -euo pipefail

port=${WARREN_AMQP_PORT:-5672}
answers() { (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }
management_answers() { (exec 3<>"/dev/tcp/127.0.0.1/15672") 2>/dev/null; }
# ensure_management enables the management plugin (warren status --management, and the tests
# of it) on the running broker, online, if nothing answers on 15672.
ensure_management() {
  management_answers && return 0
  command -v rabbitmq-plugins >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/usr/lib/rabbitmq/bin"
  if command -v rabbitmq-plugins >/dev/null 2>&1; then # else a container's, which has it
    echo "broker: enabling the management plugin (http://127.0.0.1:15672/)"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo timeout 120 rabbitmq-plugins enable rabbitmq_management >/dev/null
  fi
  for _ in $(seq 1 60); do
    management_answers && return 0
    sleep 1
  done
  echo "broker: the management plugin does not answer on 127.0.0.1:15672 after 60s" >&2
  return 1
}
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
  # RabbitMQ 3.x counts the files of quorum queues (warren's default; 3 per queue on 3.10)
  # against its file handle limit, and a new connection waits for a free handle: with the
  # common default of 1024 open files it stops accepting connections at about 300 queues.
  ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
  # Debian's rabbitmq-server runs the broker through `su rabbitmq`, whose pam_limits resets
  # the soft limit to 1024 unless limits.d says otherwise (and ignores a value above the hard
  # limit it may set: use the one this shell has).
  limits=/etc/security/limits.d/rabbitmq-warren.conf
  if [ "$(id -u)" -eq 0 ] && [ -d /etc/security/limits.d ] && [ ! -e "$limits" ]; then
    n=$(ulimit -Hn)
    if [ "$n" = unlimited ] || [ "$n" -gt 65536 ]; then n=65536; fi
    echo "broker: writing $limits (rabbitmq nofile $n)"
    printf 'rabbitmq soft nofile %s\nrabbitmq hard nofile %s\n' "$n" "$n" > "$limits"
  fi
  rabbitmq-server -detached >/dev/null 2>&1 || true
  timeout 120 rabbitmqctl await_startup >/dev/null 2>&1 || true
  wait_for
}

# handle_limit prints the running broker's file handle limit, or nothing if it cannot tell.
handle_limit() {
  command -v rabbitmqctl >/dev/null 2>&1 || return 0
  timeout 30 rabbitmqctl eval 'file_handle_cache:ulimit().' 2>/dev/null | grep -E '^[0-9]+$' || true
}

# dead_lettering_down says whether the running broker's supervisor of quorum queue dead-letter
# workers is gone: on RabbitMQ 3.10 it gives up after two worker crashes within 5 s (a
# malformed x-death, or a queue deleted before its worker started, which a loaded test run can
# do), and from then on the node dead-letters nothing until it restarts (docs/dead-lettering.md).
dead_lettering_down() {
  command -v rabbitmqctl >/dev/null 2>&1 || return 1
  [ "$(timeout 30 rabbitmqctl eval 'whereis(rabbit_fifo_dlx_sup).' 2>/dev/null)" = undefined ]
}

if answers; then
  # A broker started with the common default of 1024 open files stops accepting connections
  # at about 300 quorum queues (warren's default): restart the installed one with more.
  limit=$(handle_limit)
  why=""
  if [ -n "$limit" ] && [ "$limit" -lt 16384 ]; then
    why="its file handle limit is $limit, too low for quorum queues"
  elif dead_lettering_down; then
    why="its dead-letter worker supervisor is gone (it dead-letters nothing)"
  fi
  if [ -n "$why" ] && [ "${WARREN_BROKER_NO_RESTART:-0}" != 1 ]; then
    echo "broker: $why: restarting it"
    timeout 60 rabbitmqctl stop >/dev/null 2>&1 || true
    for _ in $(seq 1 60); do answers || break; sleep 1; done
    start_installed
    echo "broker: file handle limit now $(handle_limit)"
  fi
  ensure_management
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
ensure_management
echo "broker: RabbitMQ answers on 127.0.0.1:$port"
