#!/usr/bin/env bash
# Makes sure PostgreSQL answers on 127.0.0.1:5432 (or $WARREN_POSTGRES_PORT) and lets the user
# postgres, password postgres, in over TCP (the tests' default WARREN_POSTGRES_URL, and
# docker-compose.yml's): use a running server; else start an installed cluster
# (pg_ctlcluster); else `docker compose up -d postgres` where a Docker engine runs; else install
# Debian's postgresql with apt-get, start it and set that password.
set -euo pipefail

port=${WARREN_POSTGRES_PORT:-5432}
answers() { (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }
wait_for() {
  for _ in $(seq 1 60); do
    answers && return 0
    sleep 1
  done
  echo "postgres: nothing answers on 127.0.0.1:$port after 60s" >&2
  return 1
}
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
PATH="$PATH:/usr/sbin:/usr/bin"
start_clusters() {
  command -v pg_lsclusters >/dev/null 2>&1 || return 1
  local started=1
  while read -r ver name _; do
    echo "postgres: starting cluster $ver/$name"
    $sudo pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start || true
    started=0
  done < <(pg_lsclusters -h | awk '$4 != "online"')
  return $started
}
# password sets the password of the user postgres, so that a server installed with Debian's
# defaults (scram-sha-256 on 127.0.0.1) lets the tests in.
password() {
  local sql="ALTER USER postgres PASSWORD 'postgres'"
  if [ -z "$sudo" ]; then
    su postgres -c "psql -q -c \"$sql\"" >/dev/null
  else
    sudo -u postgres psql -q -c "$sql" >/dev/null
  fi
}

if answers; then
  exit 0
fi
if start_clusters; then
  wait_for
elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  echo "postgres: docker compose up -d postgres"
  docker compose -f "$(dirname "$0")/../docker-compose.yml" up -d postgres
  wait_for
elif command -v apt-get >/dev/null 2>&1; then
  echo "postgres: installing postgresql with apt-get"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  # The package may have started it (on systemd machines); start it if not.
  answers || start_clusters || true
  wait_for
  password
else
  echo "postgres: no PostgreSQL on 127.0.0.1:$port, and neither pg_ctlcluster, docker nor apt-get to get one" >&2
  exit 1
fi
echo "postgres: PostgreSQL answers on 127.0.0.1:$port"
