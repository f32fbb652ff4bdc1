#!/bin/bash
# rabbitmq4.sh — run a RabbitMQ 4.0.5 node (Debian trixie build, Erlang/OTP 27) on a Debian
# bookworm machine, side by side with the system RabbitMQ/Erlang, without installing
# anything system-wide. warren's `make broker4` and `make test-rabbitmq4` use it, so that the
# broker-facing tests run on 4.0 as well as on the system's 3.10 (README: "Broker versions").
# From the workplace notes on running 4.0 beside 3.10, unchanged but for the default PREFIX
# (a cache folder) and this header.
#
# usage: rabbitmq4.sh [setup|start|stop|status|env|clean] [PREFIX]
#   setup   fetch trixie .debs (apt-get download, private apt state), extract
#           them into PREFIX/root with dpkg-deb -x, patch paths. Idempotent.
#   start   (default) setup if needed, then boot the node and wait until ready
#   stop    stop the node (SIGTERM to the beam PID from our pid file, KILL after timeout)
#   status  run the prefix's rabbitmqctl status against the node
#   env     print shell exports that put the prefix's rabbitmqctl & co. on PATH
#   clean   stop, then delete the node's data/logs (keeps the install)
#
# Everything lives under PREFIX (default ~/.cache/warren/rabbitmq4; or $RMQ4_PREFIX):
#   PREFIX/apt    private apt lists/cache for trixie     PREFIX/debs  downloaded .debs
#   PREFIX/root   extracted packages (usr/lib/erlang, usr/lib/rabbitmq, trixie libc/libssl)
#   PREFIX/node   RabbitMQ SYS_PREFIX: etc/rabbitmq/*, var/lib/rabbitmq/mnesia, var/log/rabbitmq
#   PREFIX/home   HOME of the node and of the CLI (.erlang.cookie)
#   PREFIX/bin    wrappers: rabbitmqctl rabbitmq-diagnostics rabbitmq-queues rabbitmq-plugins ... erl
#
# Overridable environment (defaults in brackets):
#   RMQ4_PREFIX [~/.cache/warren/rabbitmq4]  RMQ4_NODENAME [rmq4@localhost]  RMQ4_AMQP_PORT [5680]
#   RMQ4_DIST_PORT [25680]  RMQ4_CTL_DIST_PORT_MIN [45680] (CLI uses MIN..MIN+9)
#   RMQ4_MGMT_PORT [15680] (the management plugin's HTTP API: http://guest:guest@BIND:PORT/)
#   RMQ4_BIND [127.0.0.1]   RMQ4_BOOT_TIMEOUT [120]  RMQ4_STOP_TIMEOUT [60]
#   RMQ4_FRESH [0]  (1 = wipe node data before start)
#   RMQ4_KEEP_DEBS [0] (1 = keep PREFIX/apt and PREFIX/debs after setup; default deletes them)
#   RMQ4_MIRROR [the Debian mirror this machine's own apt sources use]  RMQ4_SUITE [trixie]
#   RMQ4_KEYRING [/usr/share/keyrings/debian-archive-keyring.gpg]
set -euo pipefail

CMD=start
case "${1:-}" in setup|start|stop|status|env|clean) CMD=$1; shift;; esac
PREFIX=${1:-${RMQ4_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/warren/rabbitmq4}}
case $PREFIX in *[[:space:]]*) echo "PREFIX must not contain whitespace" >&2; exit 1;; esac
mkdir -p "$PREFIX"; PREFIX=$(cd "$PREFIX" && pwd -P)

NODENAME=${RMQ4_NODENAME:-rmq4@localhost}
AMQP_PORT=${RMQ4_AMQP_PORT:-5680}
DIST_PORT=${RMQ4_DIST_PORT:-25680}
CTL_MIN=${RMQ4_CTL_DIST_PORT_MIN:-45680}
MGMT_PORT=${RMQ4_MGMT_PORT:-15680}
BIND=${RMQ4_BIND:-127.0.0.1}
BOOT_TIMEOUT=${RMQ4_BOOT_TIMEOUT:-120}
STOP_TIMEOUT=${RMQ4_STOP_TIMEOUT:-60}
# The mirror: the one this machine's own apt sources name for Debian (deb822 or one-line form).
system_mirror() {
  local u
  u=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\/debian\)[[:space:]]*$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
  [ -n "$u" ] || u=$(sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]*\/debian\)[[:space:]].*/\2/p' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -n1)
  echo "$u"
}
MIRROR=${RMQ4_MIRROR:-$(system_mirror)}
[ -n "$MIRROR" ] || { echo "no Debian mirror found in the apt sources; set RMQ4_MIRROR" >&2; exit 1; }
SUITE=${RMQ4_SUITE:-trixie}
KEYRING=${RMQ4_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}

# rabbitmq-server + the erlang-* it depends on (all trixie, OTP 27.3.4.1), plus the
# trixie shared libs the OTP 27 binaries need that bookworm is too old for:
#   libc6 (beam.smp & co. need GLIBC_2.38: __isoc23_strtol, fmod...; bookworm has 2.36),
#   libssl3t64 (crypto.so needs OPENSSL_3.4.0; bookworm has 3.0), libzstd1 (libssl3t64 wants >=1.5.5),
#   patchelf (to point the binaries at the trixie loader; run through that loader itself).
# Everything else (libtinfo6, zlib1g, libstdc++6, libgcc-s1, libsystemd0) comes from bookworm.
PKGS="rabbitmq-server erlang-base erlang-asn1 erlang-crypto erlang-eldap erlang-inets
 erlang-mnesia erlang-os-mon erlang-parsetools erlang-public-key erlang-runtime-tools
 erlang-ssl erlang-syntax-tools erlang-tools erlang-xmerl libc6 libssl3t64 libzstd1 patchelf"

ROOT=$PREFIX/root
LIBDIR=$ROOT/usr/lib/x86_64-linux-gnu
LDSO=$LIBDIR/ld-linux-x86-64.so.2
EROOT=$ROOT/usr/lib/erlang
RBIN=$ROOT/usr/lib/rabbitmq/bin
NODE=$PREFIX/node
ETC=$NODE/etc/rabbitmq
LOGDIR=$NODE/var/log/rabbitmq
PIDFILE=$NODE/rmq4.pid          # beam.smp PID, written by RabbitMQ itself
WRAPPIDFILE=$NODE/wrapper.pid   # PID of the rabbitmq-server sh wrapper we spawn
STAMP=$ROOT/.rmq4-ready

log() { echo "[rabbitmq4 +${SECONDS}s] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

setup() {
  [ -f "$STAMP" ] && return 0
  [ "$(dpkg --print-architecture)" = amd64 ] || die "only amd64 is handled"
  local t0=$SECONDS
  local APTD=$PREFIX/apt
  mkdir -p "$APTD/lists/partial" "$APTD/cache/archives/partial" "$PREFIX/debs"
  echo "deb [signed-by=$KEYRING] $MIRROR $SUITE main" > "$APTD/sources.list"
  local A=(-o Dir::Etc::sourcelist="$APTD/sources.list" -o Dir::Etc::sourceparts=-
           -o Dir::State::Lists="$APTD/lists" -o Dir::Cache="$APTD/cache"
           -o APT::Sandbox::User=root -q)
  log "apt-get update ($SUITE, private state in $APTD)"
  apt-get "${A[@]}" update >/dev/null
  log "apt-get download: $(echo $PKGS)"
  rm -f "$PREFIX"/debs/*.deb
  (cd "$PREFIX/debs" && apt-get "${A[@]}" download $PKGS >/dev/null)
  log "extracting into $ROOT"
  rm -rf "$ROOT" "$ROOT.tmp"; mkdir -p "$ROOT.tmp"
  local d; for d in "$PREFIX"/debs/*.deb; do dpkg-deb -x "$d" "$ROOT.tmp"; done
  mv "$ROOT.tmp" "$ROOT"
  [ -x "$LDSO" ] || die "no $LDSO after extraction"

  # 1) ELF fixups: every executable under usr/lib/erlang gets the trixie loader as
  #    PT_INTERP; every ELF (exe, NIF, driver) gets DT_RPATH=$LIBDIR so it binds the
  #    trixie libc/libm/libcrypto/libzstd first and falls back to bookworm for the rest.
  #    (LD_LIBRARY_PATH can't work: bookworm's ld.so can't load a newer libc, and
  #    beam.smp execs erl_child_setup/inet_gethost/epmd/memsup itself.)
  log "patching ELF interpreter/rpath"
  PE() { "$LDSO" --library-path "$LIBDIR" "$ROOT/usr/bin/patchelf" "$@"; }
  local f n=0
  while IFS= read -r -d '' f; do
    [ "$(head -c4 "$f" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ] || continue
    if PE --print-interpreter "$f" >/dev/null 2>&1; then
      PE --set-interpreter "$LDSO" --force-rpath --set-rpath "$LIBDIR" "$f"
    else
      PE --force-rpath --set-rpath "$LIBDIR" "$f"
    fi
    n=$((n+1))
  done < <(find "$EROOT" "$ROOT/usr/lib/rabbitmq" -type f \( -perm -u+x -o -name '*.so' -o -name '*.so.*' \) -print0)
  for f in libssl.so.3 libcrypto.so.3; do PE --force-rpath --set-rpath "$LIBDIR" "$LIBDIR/$f"; done
  log "patched $n ELF files"

  # 2) hard-coded /usr/lib/erlang in the erl/start scripts (ROOTDIR=) and releases/RELEASES
  while IFS= read -r -d '' f; do
    sed -i "s#/usr/lib/erlang#$EROOT#g" "$f"
  done < <(grep -rlZ --binary-files=without-match /usr/lib/erlang "$EROOT/bin" "$EROOT"/erts-*/bin "$EROOT/releases")

  # 3) RabbitMQ scripts find RABBITMQ_HOME relative to themselves and call `erl`/`escript`
  #    via PATH (our wrappers prepend $EROOT/bin). Their only absolute default is
  #    SYS_PREFIX (-> /etc/rabbitmq, /var/lib/rabbitmq, /var/log/rabbitmq): point it at $NODE.
  sed -i "s#^SYS_PREFIX=\$#SYS_PREFIX=$NODE#" "$ROOT/usr/lib/rabbitmq/lib/rabbitmq_server-"*/sbin/rabbitmq-defaults
  grep -q "^SYS_PREFIX=$NODE\$" "$ROOT/usr/lib/rabbitmq/lib/rabbitmq_server-"*/sbin/rabbitmq-defaults || die "SYS_PREFIX patch failed"

  # 4) wrappers
  mkdir -p "$PREFIX/bin"
  local w
  for w in rabbitmqctl rabbitmq-diagnostics rabbitmq-queues rabbitmq-plugins rabbitmq-upgrade rabbitmq-streams rabbitmq-server; do
    cat > "$PREFIX/bin/$w" <<EOF
#!/bin/sh
# generated by rabbitmq4.sh: RabbitMQ 4.0.5 CLI from $ROOT
for v in \$(env | sed -n 's/^\\(RABBITMQ_[A-Za-z0-9_]*\\|ERL_[A-Za-z0-9_]*\\)=.*/\\1/p'); do unset "\$v"; done
export HOME="$PREFIX/home" PATH="$EROOT/bin:\$PATH"
exec "$RBIN/$w" "\$@"
EOF
    chmod +x "$PREFIX/bin/$w"
  done
  ln -sf "$EROOT/bin/erl" "$PREFIX/bin/erl"; ln -sf "$EROOT/bin/escript" "$PREFIX/bin/escript"

  "$EROOT/bin/erl" -noshell -eval 'ok = application:start(crypto), halt().' \
    || die "Erlang 27 from $ROOT does not start (see above)"
  touch "$STAMP"
  # the apt lists (~28 MB) and .debs (~40 MB) are only needed to (re)build root/
  [ "${RMQ4_KEEP_DEBS:-0}" = 1 ] || rm -rf "$APTD" "$PREFIX/debs"
  log "setup done in $((SECONDS-t0))s ($(du -sh "$ROOT" | cut -f1) in $ROOT)"
}

write_config() {
  mkdir -p "$ETC" "$LOGDIR" "$NODE/var/lib/rabbitmq/mnesia" "$PREFIX/home"
  chmod 700 "$PREFIX/home"
  if [ ! -s "$PREFIX/home/.erlang.cookie" ]; then
    (umask 077; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr a-f A-F > "$PREFIX/home/.erlang.cookie")
  fi
  chmod 400 "$PREFIX/home/.erlang.cookie"
  cat > "$ETC/rabbitmq-env.conf" <<EOF
# generated by rabbitmq4.sh (sourced by the server and by the CLI tools)
NODENAME=$NODENAME
NODE_PORT=$AMQP_PORT
DIST_PORT=$DIST_PORT
PID_FILE=$PIDFILE
CTL_DIST_PORT_MIN=$CTL_MIN
CTL_DIST_PORT_MAX=$((CTL_MIN+9))
SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {${BIND//./,}}"
EOF
  cat > "$ETC/rabbitmq.conf" <<EOF
# generated by rabbitmq4.sh
listeners.tcp.default = $BIND:$AMQP_PORT
loopback_users = none
management.tcp.ip = $BIND
management.tcp.port = $MGMT_PORT
EOF
  echo '[rabbitmq_management].' > "$ETC/enabled_plugins"
}

# ensure_management enables the management plugin on the running node, online (no restart),
# listening on $BIND:$MGMT_PORT, if nothing answers there: a node booted before the plugin
# was in its configuration gets the listener set first (persistent, so that loading the
# plugin keeps it rather than take the default port 15672, the system broker's).
ensure_management() {
  port_open "$BIND" "$MGMT_PORT" && return 0
  log "enabling the management plugin on $NODENAME (http://$BIND:$MGMT_PORT/), online"
  # What `rabbitmq-plugins enable` does online (it cannot find the plugins here: the wrappers
  # clear the RABBITMQ_* variables): write the node's enabled plugins file, then have the node
  # start what it lists.
  "$PREFIX/bin/rabbitmqctl" -q -n "$NODENAME" eval "
    ok = application:set_env(rabbitmq_management, tcp_config, [{port, $MGMT_PORT}, {ip, \"$BIND\"}], [{persistent, true}]),
    {ok, File} = application:get_env(rabbit, enabled_plugins_file),
    ok = file:write_file(File, <<\"[rabbitmq_management].\\n\">>),
    rabbit_plugins:ensure(File)." >/dev/null
  local t0=$SECONDS
  until port_open "$BIND" "$MGMT_PORT"; do
    [ $((SECONDS-t0)) -ge "$BOOT_TIMEOUT" ] && die "the management plugin does not answer on $BIND:$MGMT_PORT after ${BOOT_TIMEOUT}s"
    sleep 0.5
  done
}

# true if PID is alive and its command line / exe mentions our prefix (guards against PID reuse)
ours() {
  local pid=$1
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF "$PREFIX/" && return 0
  readlink "/proc/$pid/exe" 2>/dev/null | grep -qF "$PREFIX/"
}

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

start() {
  setup
  [ "${RMQ4_FRESH:-0}" = 1 ] && rm -rf "$NODE"
  if ours "$(cat "$PIDFILE" 2>/dev/null)" && [[ "$(readlink "/proc/$(cat "$PIDFILE")/cwd")" == *" (deleted)" ]]; then
    log "restarting the running node: its working directory was deleted (its management API fails)"
    stop
  fi
  if ours "$(cat "$PIDFILE" 2>/dev/null)"; then
    log "already running (beam pid $(cat "$PIDFILE"))"
    ensure_management
    return 0
  fi
  port_open "$BIND" "$AMQP_PORT" && die "$BIND:$AMQP_PORT is already in use"
  port_open 127.0.0.1 "$DIST_PORT" && die "dist port $DIST_PORT is already in use"
  port_open "$BIND" "$MGMT_PORT" && die "management port $MGMT_PORT is already in use"
  write_config
  rm -f "$PIDFILE"
  local t0=$SECONDS
  log "starting $NODENAME (AMQP $BIND:$AMQP_PORT, dist $DIST_PORT), logs in $LOGDIR"
  # own session so that nothing of ours gets the caller's terminal signals; started in the
  # node's own directory, since the node reads its working directory all along: started in a
  # checkout that is later deleted, its management API answered 500 to every call from then on
  cd "$NODE"
  setsid "$PREFIX/bin/rabbitmq-server" > "$LOGDIR/stdout.log" 2>&1 < /dev/null &
  echo $! > "$WRAPPIDFILE"
  local wpid=$!
  while ! port_open "$BIND" "$AMQP_PORT"; do
    if ! kill -0 "$wpid" 2>/dev/null; then
      tail -n 30 "$LOGDIR/stdout.log" >&2; die "rabbitmq-server exited during boot"
    fi
    [ $((SECONDS-t0)) -ge "$BOOT_TIMEOUT" ] && { tail -n 30 "$LOGDIR/stdout.log" >&2; die "not up after ${BOOT_TIMEOUT}s"; }
    sleep 0.5
  done
  "$PREFIX/bin/rabbitmqctl" -q await_startup --timeout "$BOOT_TIMEOUT" >/dev/null
  ensure_management
  log "up in $((SECONDS-t0))s: beam pid $(cat "$PIDFILE"), wrapper pid $wpid"
  log "CLI: $PREFIX/bin/rabbitmqctl -n $NODENAME status   |   amqp://guest:guest@$BIND:$AMQP_PORT/   |   http://guest:guest@$BIND:$MGMT_PORT/"
}

stop() {
  local bpid wpid t0=$SECONDS
  bpid=$(cat "$PIDFILE" 2>/dev/null || true); wpid=$(cat "$WRAPPIDFILE" 2>/dev/null || true)
  if ours "$bpid"; then
    log "stopping beam pid $bpid (SIGTERM = graceful shutdown)"
    kill -TERM "$bpid"
    while ours "$bpid" && [ $((SECONDS-t0)) -lt "$STOP_TIMEOUT" ]; do sleep 0.5; done
    ours "$bpid" && { log "still alive after ${STOP_TIMEOUT}s: SIGKILL $bpid"; kill -KILL "$bpid"; }
  else
    log "node not running (no live beam pid in $PIDFILE)"
  fi
  # the sh wrapper exits by itself once beam is gone; make sure
  for _ in 1 2 3 4 5 6 7 8 9 10; do ours "$wpid" || break; sleep 0.2; done
  ours "$wpid" && kill -TERM "$wpid"
  rm -f "$PIDFILE" "$WRAPPIDFILE"
  # an epmd started from *our* prefix (only happens when no epmd ran before) is removed
  # when it has no registered names left; a system epmd is never touched.
  local p our_epmd
  our_epmd=$(readlink -f "$EROOT/bin/epmd")
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/exe" 2>/dev/null)" = "$our_epmd" ] || continue
    if "$EROOT/bin/epmd" -names 2>/dev/null | grep -q '^name '; then
      log "leaving our epmd (pid ${p#/proc/}) running: other nodes registered"
    else
      log "stopping our epmd pid ${p#/proc/}"; kill -TERM "${p#/proc/}"
    fi
  done
}

case $CMD in
  setup)  setup ;;
  start)  start ;;
  stop)   stop ;;
  status) exec "$PREFIX/bin/rabbitmqctl" -n "$NODENAME" status ;;
  env)    echo "export PATH=\"$PREFIX/bin:\$PATH\"  # rabbitmqctl & co. talk to $NODENAME" ;;
  clean)  stop; rm -rf "$NODE" ;;
esac
