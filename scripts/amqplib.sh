#!/usr/bin/env bash
# Makes sure Node.js can load amqplib (a foreign AMQP client, for the tests of internal/foreign
# that check the AMQP properties a client of another language sends and sees): installs
# amqplib@$AMQPLIB_VERSION with npm into PREFIX/node_modules (default
# ${XDG_CACHE_HOME:-~/.cache}/warren/node), once. Uses the node and npm on PATH; else installs
# the Debian packages nodejs and npm with apt-get. Prints PREFIX/node_modules, for NODE_PATH.
#
# usage: amqplib.sh [PREFIX]
set -euo pipefail

version=${AMQPLIB_VERSION:-2.3.1}
prefix=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/warren/node}

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "amqplib: neither node and npm nor apt-get to install them" >&2
    exit 1
  fi
  echo "amqplib: installing nodejs and npm with apt-get" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi

installed() {
  [ -f "$prefix/node_modules/amqplib/package.json" ] &&
    node -e 'process.exit(require(process.argv[1]).version === process.argv[2] ? 0 : 1)' \
      "$prefix/node_modules/amqplib/package.json" "$version"
}

mkdir -p "$prefix"
if ! installed; then
  # Installed beside, then moved into place: a run that fails or races with another leaves
  # no half-installed amqplib behind.
  tmp=$(mktemp -d "$prefix/.install.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  echo "amqplib: npm install amqplib@$version into $prefix" >&2
  npm install --prefix "$tmp" --no-audit --no-fund --no-save --loglevel=error "amqplib@$version" >&2
  rm -rf "$prefix/node_modules.old"
  [ -d "$prefix/node_modules" ] && mv "$prefix/node_modules" "$prefix/node_modules.old"
  mv "$tmp/node_modules" "$prefix/node_modules"
  rm -rf "$prefix/node_modules.old"
  installed
fi
echo "$prefix/node_modules"
