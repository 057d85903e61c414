#!/usr/bin/env bash
# Starts, on one machine and without Docker, the distributed shape inboxmq is
# deployed on: a 3-node RabbitMQ cluster, a PostgreSQL primary with a streaming
# standby, and Redis primary + replica behind 3 Sentinels. Every process has its
# own ports, data folders and pid files under CLUSTER_DIR, so the shared
# servers on the default ports (RabbitMQ 5672/25672, epmd 4369, PostgreSQL
# 5432, Redis 6379) are never touched; every process is stopped by its PID.
#
# Usage: scripts/cluster.sh COMMAND
#   up                  start everything, print the URLs: a no-op when it all
#                       runs as set up; a half-started cluster, or one changed
#                       by kill-rabbit or promote-pg, is removed first
#   down                stop every process by PID, remove CLUSTER_DIR
#   status              each process with its port, PID and role
#   env                 print the URLs as shell export lines
#   kill-rabbit N       SIGKILL RabbitMQ node N (1..3)
#   start-rabbit N      start node N again and wait until it runs in the cluster
#   restart-rabbit N    once every quorum queue keeps a majority without node N,
#                       stop N gracefully, start it, wait until it rejoined
#   rabbit-leader VHOST QUEUE
#                       print the index (1..3) of the node leading a quorum queue
#   rabbitmqctl N ARGS  run rabbitmqctl ARGS against node N (this cluster's
#                       cookie and epmd), e.g. rabbitmqctl 1 cluster_status
#   promote-pg          fence the primary (fast stop), promote the standby,
#                       wait until it accepts writes
#   redis-failover      SENTINEL FAILOVER; wait until every Sentinel names the
#                       new master and the old one replicates from it
#
# Settings (environment):
#   CLUSTER_DIR        state, data, logs and pid files (default /var/tmp/inboxmq-cluster)
#   CLUSTER_PORT_BASE  every port is derived from it (default: the base of the
#                      cluster in CLUSTER_DIR, else 25700; see the layout
#                      below); two clusters need bases 50 apart
#   CLUSTER_TLS=1      also TLS listeners (amqps, PostgreSQL ssl, Redis
#                      tls-port), with a throwaway CA made by openssl
#
# Port layout, as offsets from CLUSTER_PORT_BASE:
#   +0 +1 +2    AMQP, RabbitMQ nodes 1..3
#   +3 +4 +5    AMQPS (CLUSTER_TLS=1)
#   +6          epmd of this cluster (the shared one on 4369 is not used)
#   +7 +8 +9    Erlang distribution, nodes 1..3
#   +10 +11     PostgreSQL primary, standby
#   +20 +21     Redis primary, replica
#   +22 +23     Redis primary, replica TLS (CLUSTER_TLS=1)
#   +30 +31 +32 Sentinels 1..3
#   +33 +34 +35 Sentinels 1..3 TLS (CLUSTER_TLS=1)
#   +36 +37 +38 RabbitMQ management API (HTTP, loopback), nodes 1..3
#
# With CLUSTER_TLS=1 the Redis nodes replicate over TLS, so the Sentinels name
# the masters' TLS ports: use CLUSTER_REDIS_TLS_URL then (CLUSTER_REDIS_URL
# reaches the Sentinels, but the master they name speaks TLS only).
#
# Run as root (or as a user who owns CLUSTER_DIR): PostgreSQL then runs as
# the postgres OS user, the rest as root. Missing packages are installed with
# apt-get (as root). Every wait is bounded. This is a test cluster: fsync is
# off and Redis keeps nothing on disk.
set -euo pipefail

DIR=${CLUSTER_DIR:-/var/tmp/inboxmq-cluster}
DIR=${DIR%/}
# Without CLUSTER_PORT_BASE, the base of the cluster running in CLUSTER_DIR.
BASE=${CLUSTER_PORT_BASE:-}
if [ -z "$BASE" ] && [ -f "$DIR/state" ]; then BASE=$(awk '{print $1}' "$DIR/state"); fi
BASE=${BASE:-25700}
WANT_TLS=${CLUSTER_TLS:-0}
case $WANT_TLS in 1 | true | yes | on) WANT_TLS=1 ;; *) WANT_TLS=0 ;; esac

if ! [[ $BASE =~ ^[0-9]+$ ]] || ((BASE < 1024 || BASE > 65000)); then
  echo "cluster: CLUSTER_PORT_BASE must be a number between 1024 and 65000, not '$BASE'" >&2
  exit 2
fi
case $DIR in
  /*) ;;
  *) DIR=$PWD/$DIR ;;
esac
if [ "$DIR" = / ] || [ "${#DIR}" -lt 5 ]; then
  echo "cluster: CLUSTER_DIR '$DIR' is too short to be removed safely" >&2
  exit 2
fi

# --- ports ----------------------------------------------------------------

amqp_port() { echo $((BASE + $1 - 1)); }
amqps_port() { echo $((BASE + 2 + $1)); }
EPMD_PORT=$((BASE + 6))
dist_port() { echo $((BASE + 6 + $1)); }
PG_PRIMARY_PORT=$((BASE + 10))
PG_STANDBY_PORT=$((BASE + 11))
REDIS_PORT=$((BASE + 20))
REPLICA_PORT=$((BASE + 21))
REDIS_TLS_PORT=$((BASE + 22))
REPLICA_TLS_PORT=$((BASE + 23))
sentinel_port() { echo $((BASE + 29 + $1)); }
sentinel_tls_port() { echo $((BASE + 32 + $1)); }
mgmt_port() { echo $((BASE + 35 + $1)); }

node_name() { echo "inboxmq${BASE}-$1@localhost"; }

# --- folders --------------------------------------------------------------

R=$DIR/rabbit
PG=$DIR/pg
RD=$DIR/redis
TLS_DIR=$DIR/tls
STATE=$DIR/state
ENV_FILE=$DIR/env

RMQ_BIN=${RABBITMQ_BIN_DIR:-/usr/lib/rabbitmq/bin}
PG_BIN=${PG_BIN_DIR:-}

log() { printf 'cluster: %s\n' "$*" >&2; }
die() {
  log "$*"
  exit 1
}

is_root=false
[ "$(id -u)" = 0 ] && is_root=true

# --- waiting and processes ------------------------------------------------

# wait_for WHAT SECONDS CMD...: retry CMD every 0.2s until it succeeds, bounded.
wait_for() {
  local what=$1 secs=$2
  shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "$what: not within ${secs}s"
      return 1
    fi
    sleep 0.2
  done
}

tcp_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# ours PID: the process runs and belongs to this cluster (its working folder
# or its environment names CLUSTER_DIR), so a recycled PID is never killed.
ours() {
  local pid=$1 cwd
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [ -d "/proc/$pid" ] || return 1
  # A zombie has exited already.
  [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] || return 1
  cwd=$(readlink "/proc/$pid/cwd" 2>/dev/null) || cwd=
  case $cwd in "$DIR"/* | "$DIR") return 0 ;; esac
  tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qxF "INBOXMQ_CLUSTER_DIR=$DIR"
}

# gone PID: the process has exited (a zombie counts as exited).
gone() { ! [ -d "/proc/$1" ] || [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = Z ]; }

# pid_from FILE: the first line of a pid file (postmaster.pid too), or nothing.
pid_from() { if [ -f "$1" ]; then head -n 1 "$1" 2>/dev/null | tr -d '[:space:]'; fi; }

# alive FILE: the pid file names a running process of this cluster.
alive() {
  local pid
  pid=$(pid_from "$1")
  [ -n "$pid" ] && ours "$pid"
}

# stop_pid FILE SIGNAL SECONDS: send SIGNAL to the process of FILE, wait for
# it to exit, SIGKILL it after SECONDS.
stop_pid() {
  local file=$1 sig=$2 secs=$3 pid
  pid=$(pid_from "$file")
  [ -n "$pid" ] && ours "$pid" || return 0
  kill "-$sig" "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + secs))
  while ours "$pid"; do
    if ((SECONDS >= deadline)); then
      kill -KILL "$pid" 2>/dev/null || true
      wait_for "exit of PID $pid" 5 gone "$pid" || true
      break
    fi
    sleep 0.1
  done
}

# --- packages -------------------------------------------------------------

epmd_bin() { command -v epmd || ls /usr/lib/erlang/erts-*/bin/epmd 2>/dev/null | tail -n 1; }

pg_bin() {
  if [ -z "$PG_BIN" ]; then
    local v
    v=$(ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -n 1)
    [ -n "$v" ] && PG_BIN=/usr/lib/postgresql/$v/bin
  fi
  echo "$PG_BIN"
}

ensure_packages() {
  local want=()
  [ -x "$RMQ_BIN/rabbitmq-server" ] || want+=(rabbitmq-server)
  [ -n "$(pg_bin)" ] && [ -x "$(pg_bin)/initdb" ] || want+=(postgresql)
  command -v redis-server >/dev/null || want+=(redis-server)
  command -v redis-cli >/dev/null || want+=(redis-tools)
  if [ "$WANT_TLS" = 1 ]; then command -v openssl >/dev/null || want+=(openssl); fi
  command -v flock >/dev/null || want+=(util-linux)
  [ ${#want[@]} -gt 0 ] || return 0
  if ! $is_root || ! command -v apt-get >/dev/null; then
    die "missing: ${want[*]}; install them (apt-get install -y ${want[*]}) or run this script as root on Debian/Ubuntu"
  fi
  log "installing ${want[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${want[@]}"; }
  PG_BIN=
  if ! [ -x "$RMQ_BIN/rabbitmq-server" ] || ! [ -x "$(pg_bin)/initdb" ] || ! command -v redis-server >/dev/null; then
    die "apt-get did not install ${want[*]}"
  fi
}

# --- state ----------------------------------------------------------------

# The running cluster's settings: "base tls".
state_tls() { [ -f "$STATE" ] && awk '{print $2}' "$STATE" || echo "$WANT_TLS"; }
TLS=$WANT_TLS

pg_user() { if $is_root; then echo postgres; else id -un; fi; }
# as_pg CMD...: run a PostgreSQL command as the user that owns the data.
as_pg() {
  if $is_root; then
    runuser -u postgres -- env INBOXMQ_CLUSTER_DIR="$DIR" "$@"
  else
    env INBOXMQ_CLUSTER_DIR="$DIR" "$@"
  fi
}

psql_at() {
  local port=$1
  shift
  PGCONNECT_TIMEOUT=3 "$(pg_bin)/psql" -X -q -A -t -w -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 "$@"
}

rcli() {
  local port=$1
  shift
  timeout 10 redis-cli -h 127.0.0.1 -p "$port" "$@"
}

# --- RabbitMQ -------------------------------------------------------------

rabbit_env() {
  # The shared broker's /etc/rabbitmq/rabbitmq-env.conf (node name, epmd,
  # ERL_FLAGS) is replaced by an empty file of this cluster.
  echo "INBOXMQ_CLUSTER_DIR=$DIR"
  echo "HOME=$R/home"
  echo "RABBITMQ_CONF_ENV_FILE=$R/rabbitmq-env.conf"
  echo "RABBITMQ_ENABLED_PLUGINS_FILE=$R/enabled_plugins"
  echo "ERL_EPMD_PORT=$EPMD_PORT"
  echo "ERL_EPMD_ADDRESS=127.0.0.1"
  echo "ERL_FLAGS="
  echo "ERL_AFLAGS="
  echo "ERL_ZFLAGS="
  echo "RABBITMQ_CTL_ERL_ARGS=+S 1:1 +A 1 +sbwt none +sbwtdcpu none +sbwtdio none"
}

# ctl N ARGS...: rabbitmqctl against node N, bounded.
ctl() { rabbit_cli rabbitmqctl "$@"; }

# rabbit_cli TOOL N ARGS...: a RabbitMQ CLI tool against node N, bounded.
rabbit_cli() {
  local tool=$1 n=$2
  shift 2
  local -a e
  mapfile -t e < <(rabbit_env)
  env "${e[@]}" timeout 150 "$RMQ_BIN/$tool" -q -n "$(node_name "$n")" "$@"
}

node_dir() { echo "$R/n$1"; }
rabbit_pidfile() { echo "$(node_dir "$1")/rabbit.pid"; }

rabbit_configure() {
  mkdir -p "$R/home"
  : >"$R/rabbitmq-env.conf"
  echo '[rabbitmq_consistent_hash_exchange,rabbitmq_management].' >"$R/enabled_plugins"
  if [ ! -f "$R/home/.erlang.cookie" ]; then
    (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr 'a-f' 'A-F' >"$R/home/.erlang.cookie")
  fi
  chmod 400 "$R/home/.erlang.cookie"
  local n d
  for n in 1 2 3; do
    d=$(node_dir "$n")
    mkdir -p "$d/mnesia" "$d/log"
    {
      echo "listeners.tcp.1 = 127.0.0.1:$(amqp_port "$n")"
      echo "management.tcp.ip = 127.0.0.1"
      echo "management.tcp.port = $(mgmt_port "$n")"
      echo "loopback_users.guest = true"
      echo "cluster_name = inboxmq$BASE"
      echo "cluster_partition_handling = pause_minority"
      echo "vm_memory_high_watermark.absolute = 512MB"
      echo "disk_free_limit.absolute = 50MB"
      echo "log.file.level = info"
      echo "log.console = false"
      if [ "$TLS" = 1 ]; then
        echo "listeners.ssl.1 = 127.0.0.1:$(amqps_port "$n")"
        echo "ssl_options.cacertfile = $TLS_DIR/ca.pem"
        echo "ssl_options.certfile = $TLS_DIR/server.pem"
        echo "ssl_options.keyfile = $TLS_DIR/server.key"
        echo "ssl_options.verify = verify_none"
        echo "ssl_options.fail_if_no_peer_cert = false"
      fi
    } >"$d/rabbitmq.conf"
  done
}

rabbit_start() {
  local n=$1 d
  d=$(node_dir "$n")
  if alive "$(rabbit_pidfile "$n")"; then return 0; fi
  rm -f "$(rabbit_pidfile "$n")"
  local -a e
  mapfile -t e < <(rabbit_env)
  # rabbitmq-server from /usr/lib/rabbitmq/bin runs as the caller (the one in
  # /usr/sbin switches to the rabbitmq user and its cookie).
  (
    cd "$d"
    env "${e[@]}" \
      RABBITMQ_NODENAME="$(node_name "$n")" \
      RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
      RABBITMQ_NODE_PORT="$(amqp_port "$n")" \
      RABBITMQ_DIST_PORT="$(dist_port "$n")" \
      RABBITMQ_MNESIA_BASE="$d/mnesia" \
      RABBITMQ_LOG_BASE="$d/log" \
      RABBITMQ_PID_FILE="$(rabbit_pidfile "$n")" \
      RABBITMQ_CONFIG_FILE="$d/rabbitmq.conf" \
      RABBITMQ_ADVANCED_CONFIG_FILE="$d/advanced.config" \
      RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+S 1:1 +A 4 +sbwt none +sbwtdcpu none +sbwtdio none -kernel inet_dist_use_interface {127,0,0,1}" \
      setsid "$RMQ_BIN/rabbitmq-server" </dev/null >>"$d/log/stdout.log" 2>&1 9>&- &
    echo $! >"$d/wrapper.pid"
  )
}

# rabbit_wait N: wait until node N's application runs.
rabbit_wait() {
  local n=$1
  if ! ctl "$n" wait --timeout 80 "$(rabbit_pidfile "$n")" >/dev/null 2>&1; then
    tail -n 20 "$(node_dir "$n")/log/stdout.log" >&2 || true
    die "RabbitMQ node $n ($(node_name "$n")) did not start: see $(node_dir "$n")/log"
  fi
}

# running_nodes N: the cluster's running nodes as node N sees them, one a line.
running_nodes() {
  ctl "$1" cluster_status --formatter json 2>/dev/null |
    grep -o '"running_nodes":\[[^]]*\]' | grep -o '"[^"]*@[^"]*"' | tr -d '"'
}

# rabbit_in_cluster N: node N runs with every node whose process is alive.
rabbit_in_cluster() {
  local n=$1 m got
  got=$(running_nodes "$n") || return 1
  for m in 1 2 3; do
    if alive "$(rabbit_pidfile "$m")"; then
      grep -qxF "$(node_name "$m")" <<<"$got" || return 1
    fi
  done
}

rabbit_up() {
  local n out
  rabbit_configure
  # epmd of this cluster, in the foreground so its PID is known.
  if ! alive "$R/epmd.pid"; then
    (
      cd "$R"
      INBOXMQ_CLUSTER_DIR=$DIR setsid "$(epmd_bin)" -port "$EPMD_PORT" -address 127.0.0.1 </dev/null >>"$R/epmd.log" 2>&1 9>&- &
      echo $! >"$R/epmd.pid"
    )
    wait_for "epmd on $EPMD_PORT" 10 tcp_open 127.0.0.1 "$EPMD_PORT" || die "epmd did not start (see $R/epmd.log)"
  fi
  for n in 1 2 3; do rabbit_start "$n"; done
  local waits=()
  for n in 1 2 3; do
    rabbit_wait "$n" &
    waits+=($!)
  done
  for n in 1 2 3; do wait "${waits[n - 1]}" || die "RabbitMQ node $n did not start"; done
  # Fresh nodes (up always starts from empty folders) join node 1 one at a
  # time.
  for n in 2 3; do
    # The output (start_app logs harmless errors about the other nodes)
    # is shown only when the join fails.
    if ! out=$({ ctl "$n" stop_app && ctl "$n" join_cluster "$(node_name 1)" && ctl "$n" start_app; } 2>&1); then
      printf '%s\n' "$out" >&2
      die "node $n did not join $(node_name 1)"
    fi
  done
  wait_for "RabbitMQ cluster of 3" 30 rabbit_three || die "the RabbitMQ nodes did not form one cluster"
  log "RabbitMQ: 3 nodes in one cluster ($(node_name 1) …)"
}

rabbit_three() { [ "$(running_nodes 1 | wc -l)" = 3 ]; }

rabbit_check_index() {
  [[ ${1:-} =~ ^[123]$ ]] || die "RabbitMQ node index must be 1, 2 or 3, not '${1:-}'"
}

rabbit_kill() {
  local n=$1 pid
  pid=$(pid_from "$(rabbit_pidfile "$n")")
  if [ -z "$pid" ] || ! ours "$pid"; then
    log "node $n is not running"
    return 0
  fi
  kill -KILL "$pid"
  wait_for "exit of node $n" 10 gone "$pid" ||
    die "node $n (PID $pid) survived SIGKILL"
  stop_pid "$(node_dir "$n")/wrapper.pid" TERM 5
  rm -f "$(rabbit_pidfile "$n")"
  log "killed node $n ($(node_name "$n"), PID $pid)"
}

rabbit_start_joined() {
  local n=$1
  rabbit_start "$n"
  rabbit_wait "$n"
  local m
  for m in 1 2 3; do
    alive "$(rabbit_pidfile "$m")" || continue
    wait_for "node $n in the cluster as node $m sees it" 60 rabbit_in_cluster "$m" ||
      die "node $n did not rejoin the cluster"
  done
  log "node $n ($(node_name "$n")) runs in the cluster"
}

rabbit_stop_graceful() {
  local n=$1
  alive "$(rabbit_pidfile "$n")" || {
    log "node $n is not running"
    return 0
  }
  # As in a rolling upgrade: stop the node only when every quorum queue with
  # a member on it keeps a majority without it.
  rabbit_cli rabbitmq-upgrade "$n" await_online_quorum_plus_one -t 120 >/dev/null ||
    die "stopping node $n now would leave a quorum queue without a majority (rabbitmq-upgrade await_online_quorum_plus_one)"
  ctl "$n" stop "$(rabbit_pidfile "$n")" >/dev/null 2>&1 || true
  # Bounded: a node that does not stop in time is killed.
  stop_pid "$(rabbit_pidfile "$n")" TERM 30
  stop_pid "$(node_dir "$n")/wrapper.pid" TERM 5
  rm -f "$(rabbit_pidfile "$n")"
  log "stopped node $n ($(node_name "$n"))"
}

rabbit_leader() {
  local vhost=$1 queue=$2 n out leader
  for n in 1 2 3; do
    alive "$(rabbit_pidfile "$n")" || continue
    out=$(ctl "$n" list_queues -p "$vhost" name type leader --formatter json 2>&1) || continue
    leader=$(leader_in_json "$queue" "$out")
    [ -n "$leader" ] || die "queue '$queue' in vhost '$vhost' not found, or not a quorum queue"
    for m in 1 2 3; do
      if [ "$leader" = "$(node_name "$m")" ]; then
        echo "$m"
        return 0
      fi
    done
    die "queue '$queue' is led by $leader, not a node of this cluster"
  done
  die "no RabbitMQ node of this cluster answers"
}

# leader_in_json QUEUE JSON: the leader of QUEUE in list_queues' JSON.
leader_in_json() {
  local queue=$1
  # list_queues prints one object per queue: {"name":"q","type":"quorum","leader":"n@h"}.
  tr '\n' ' ' <<<"$2" | grep -o '{[^}]*}' | while IFS= read -r obj; do
    local name
    name=$(sed -n 's/.*"name":"\([^"]*\)".*/\1/p' <<<"$obj")
    if [ "$name" = "$queue" ]; then
      sed -n 's/.*"leader":"\([^"]*\)".*/\1/p' <<<"$obj"
      break
    fi
  done
}

# --- TLS ------------------------------------------------------------------

tls_make() {
  [ -f "$TLS_DIR/ca.pem" ] && [ -f "$TLS_DIR/server.pem" ] && return 0
  mkdir -p "$TLS_DIR"
  (
    cd "$TLS_DIR"
    umask 077
    openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
      -keyout ca.key -out ca.pem -days 30 -subj "/CN=inboxmq cluster test CA $BASE" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
      -keyout server.key -out server.csr -subj "/CN=localhost" 2>/dev/null
    printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
      "extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1" >server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem \
      -days 30 -extfile server.ext 2>/dev/null
    rm -f server.csr server.ext ca.srl
    # PostgreSQL wants its key owned by the server's user, mode 0600.
    cp server.key pg-server.key
    chmod 600 pg-server.key
    $is_root && chown postgres: pg-server.key
    chmod 644 ca.pem server.pem
    # RabbitMQ and Redis run as the caller.
    chmod 600 server.key
  ) || die "openssl could not make the test CA"
}

# --- PostgreSQL -----------------------------------------------------------

pg_conf() {
  local port=$1
  cat <<EOF
# inboxmq cluster (scripts/cluster.sh)
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$PG/run'
max_connections = 200
shared_buffers = 32MB
wal_level = replica
max_wal_senders = 10
max_replication_slots = 10
wal_keep_size = 256MB
hot_standby = on
hot_standby_feedback = on
wal_receiver_status_interval = 1s
fsync = off
full_page_writes = on
logging_collector = off
log_line_prefix = '%m [%p] '
EOF
  if [ "$TLS" = 1 ]; then
    cat <<EOF
ssl = on
ssl_cert_file = '$TLS_DIR/server.pem'
ssl_key_file = '$TLS_DIR/pg-server.key'
ssl_ca_file = '$TLS_DIR/ca.pem'
EOF
  fi
}

pg_start() {
  local data=$1 name=$2
  as_pg "$(pg_bin)/pg_ctl" -D "$data" -l "$PG/$name.log" -w -t 60 -s start >/dev/null 9>&- ||
    {
      tail -n 20 "$PG/$name.log" >&2 || true
      die "PostgreSQL $name did not start (see $PG/$name.log)"
    }
}

pg_up() {
  local bin
  bin=$(pg_bin)
  mkdir -p "$PG/run"
  $is_root && chown "$(pg_user):" "$PG" "$PG/run"
  if [ ! -f "$PG/primary/PG_VERSION" ]; then
    rm -rf "$PG/primary"
    as_pg "$bin/initdb" -D "$PG/primary" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 --no-sync >"$PG/initdb.log" 2>&1 ||
      die "initdb failed (see $PG/initdb.log)"
    pg_conf "$PG_PRIMARY_PORT" | as_pg tee -a "$PG/primary/postgresql.conf" >/dev/null
    cat <<EOF | as_pg tee "$PG/primary/pg_hba.conf" >/dev/null
# inboxmq cluster: trust for postgres on loopback only.
local   all          postgres                 trust
host    all          postgres  127.0.0.1/32   trust
host    all          postgres  ::1/128        trust
host    replication  postgres  127.0.0.1/32   trust
host    replication  postgres  ::1/128        trust
EOF
  fi
  alive "$PG/primary/postmaster.pid" || pg_start "$PG/primary" primary
  if [ ! -f "$PG/standby/PG_VERSION" ]; then
    rm -rf "$PG/standby"
    as_pg "$bin/pg_basebackup" -h 127.0.0.1 -p "$PG_PRIMARY_PORT" -U postgres -D "$PG/standby" \
      -R -X stream -C -S standby --checkpoint=fast --no-sync >"$PG/basebackup.log" 2>&1 ||
      die "pg_basebackup failed (see $PG/basebackup.log)"
    echo "port = $PG_STANDBY_PORT" | as_pg tee -a "$PG/standby/postgresql.conf" >/dev/null
  fi
  alive "$PG/standby/postmaster.pid" || pg_start "$PG/standby" standby
  wait_for "standby streaming" 30 pg_streaming || die "the standby does not stream from the primary (see $PG/standby.log)"
  log "PostgreSQL: primary on $PG_PRIMARY_PORT, streaming standby on $PG_STANDBY_PORT"
}

pg_streaming() {
  [ "$(psql_at "$PG_STANDBY_PORT" -c "SELECT status FROM pg_stat_wal_receiver")" = streaming ]
}

pg_stop() {
  local data=$1
  local pid
  pid=$(pid_from "$data/postmaster.pid")
  [ -n "$pid" ] && ours "$pid" || return 0
  as_pg "$(pg_bin)/pg_ctl" -D "$data" -m "${2:-fast}" -w -t 30 -s stop >/dev/null 2>&1 || true
  stop_pid "$data/postmaster.pid" QUIT 5
}

pg_writable() { [ "$(psql_at "$1" -c "SELECT NOT pg_is_in_recovery()")" = t ] && psql_at "$1" -c "CREATE TEMP TABLE inboxmq_cluster_probe (x int)" >/dev/null; }

pg_promote() {
  local old_port new_port old_dir new_dir
  # The roles follow the data folders: the standby's folder has standby.signal.
  if [ -f "$PG/standby/standby.signal" ]; then
    old_dir=$PG/primary new_dir=$PG/standby
  elif [ -f "$PG/primary/standby.signal" ]; then
    old_dir=$PG/standby new_dir=$PG/primary
  else
    die "no standby to promote (both servers are primaries already)"
  fi
  old_port=$(pg_port_of "$old_dir")
  new_port=$(pg_port_of "$new_dir")
  alive "$new_dir/postmaster.pid" || die "the standby (port $new_port) is not running"
  # Fence: the old primary is stopped before the standby may take writes.
  if alive "$old_dir/postmaster.pid"; then
    pg_stop "$old_dir" fast
    log "fenced the old primary on $old_port (fast stop)"
  fi
  # A fast stop sends the remaining WAL to the standby; wait until the standby
  # has it, so a committed transaction is never lost by the promotion.
  local lsn
  lsn=$(as_pg "$(pg_bin)/pg_controldata" -D "$old_dir" 2>/dev/null | sed -n 's/^Latest checkpoint location: *//p')
  if [ -n "$lsn" ]; then
    wait_for "standby has WAL up to $lsn" 20 pg_has_lsn "$new_port" "$lsn" ||
      die "the standby did not receive the old primary's last WAL ($lsn): not promoted; see $PG/*.log"
  fi
  as_pg "$(pg_bin)/pg_ctl" -D "$new_dir" -w -t 30 -s promote >/dev/null || die "pg_ctl promote failed"
  wait_for "new primary on $new_port accepts writes" 30 pg_writable "$new_port" ||
    die "the promoted server on $new_port does not accept writes"
  log "promoted the standby on $new_port; the old primary on $old_port stays stopped"
}

pg_port_of() { sed -n 's/^port = \([0-9]*\).*/\1/p' "$1/postgresql.conf" | tail -n 1; }

pg_has_lsn() {
  [ "$(psql_at "$1" -c "SELECT pg_wal_lsn_diff(pg_last_wal_receive_lsn(), '$2') >= 0 OR pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '$2') >= 0")" = t ]
}

# --- Redis ----------------------------------------------------------------

redis_tls_conf() {
  [ "$TLS" = 1 ] || return 0
  cat <<EOF
tls-port $1
tls-cert-file $TLS_DIR/server.pem
tls-key-file $TLS_DIR/server.key
tls-ca-cert-file $TLS_DIR/ca.pem
tls-auth-clients no
tls-replication yes
EOF
}

# The port the Sentinels and replicas reach the data nodes on.
redis_link_port() { if [ "$TLS" = 1 ]; then echo "$2"; else echo "$1"; fi; }

redis_data_conf() {
  local name=$1 port=$2 tls_port=$3
  cat <<EOF
bind 127.0.0.1
port $port
protected-mode no
daemonize yes
pidfile $RD/$name.pid
logfile $RD/$name.log
dir $RD/$name
save ""
appendonly no
repl-diskless-sync yes
repl-diskless-sync-delay 0
repl-diskless-load on-empty-db
EOF
  redis_tls_conf "$tls_port"
}

redis_up() {
  mkdir -p "$RD/primary" "$RD/replica"
  local mport
  mport=$(redis_link_port "$REDIS_PORT" "$REDIS_TLS_PORT")
  if ! alive "$RD/primary.pid"; then
    redis_data_conf primary "$REDIS_PORT" "$REDIS_TLS_PORT" >"$RD/primary.conf"
    (cd "$RD/primary" && INBOXMQ_CLUSTER_DIR=$DIR redis-server "$RD/primary.conf" 9>&-) || die "redis primary did not start"
  fi
  if ! alive "$RD/replica.pid"; then
    {
      redis_data_conf replica "$REPLICA_PORT" "$REPLICA_TLS_PORT"
      echo "replicaof 127.0.0.1 $mport"
    } >"$RD/replica.conf"
    (cd "$RD/replica" && INBOXMQ_CLUSTER_DIR=$DIR redis-server "$RD/replica.conf" 9>&-) || die "redis replica did not start"
  fi
  wait_for "redis primary" 15 redis_ping "$REDIS_PORT" || die "redis primary does not answer (see $RD/primary.log)"
  wait_for "redis replica in sync" 20 redis_synced "$REPLICA_PORT" || die "redis replica does not sync (see $RD/replica.log)"
  local s sp
  for s in 1 2 3; do
    sp=$(sentinel_port "$s")
    alive "$RD/sentinel$s.pid" && continue
    mkdir -p "$RD/sentinel$s"
    {
      echo "bind 127.0.0.1"
      echo "port $sp"
      echo "protected-mode no"
      echo "daemonize yes"
      echo "pidfile $RD/sentinel$s.pid"
      echo "logfile $RD/sentinel$s.log"
      echo "dir $RD/sentinel$s"
      redis_tls_conf "$(sentinel_tls_port "$s")"
      echo "sentinel monitor mymaster 127.0.0.1 $mport 2"
      echo "sentinel down-after-milliseconds mymaster 2000"
      echo "sentinel failover-timeout mymaster 10000"
      echo "sentinel parallel-syncs mymaster 1"
      echo "sentinel known-replica mymaster 127.0.0.1 $(redis_link_port "$REPLICA_PORT" "$REPLICA_TLS_PORT")"
    } >"$RD/sentinel$s.conf"
    (cd "$RD/sentinel$s" && INBOXMQ_CLUSTER_DIR=$DIR redis-server "$RD/sentinel$s.conf" --sentinel 9>&-) ||
      die "sentinel $s did not start"
  done
  for s in 1 2 3; do
    wait_for "sentinel $s sees the replica and the other sentinels" 30 sentinel_ready "$(sentinel_port "$s")" ||
      die "sentinel $s is not ready (see $RD/sentinel$s.log)"
  done
  log "Redis: primary on $REDIS_PORT, replica on $REPLICA_PORT, Sentinels on $(sentinel_port 1)-$(sentinel_port 3) (master mymaster)"
}

redis_ping() { [ "$(rcli "$1" ping 2>/dev/null)" = PONG ]; }
redis_synced() { rcli "$1" info replication 2>/dev/null | tr -d '\r' | grep -qx 'master_link_status:up'; }

# sentinel_field PORT FIELD: a field of SENTINEL MASTER mymaster.
sentinel_field() {
  rcli "$1" sentinel master mymaster 2>/dev/null | tr -d '\r' | awk -v f="$2" 'prev == f {print; exit} {prev = $0}'
}

sentinel_ready() {
  local flags
  flags=$(sentinel_field "$1" flags)
  [ "$flags" = master ] &&
    [ "$(sentinel_field "$1" num-slaves)" -ge 1 ] &&
    [ "$(sentinel_field "$1" num-other-sentinels)" -ge 2 ] &&
    rcli "$1" sentinel replicas mymaster 2>/dev/null | tr -d '\r' | awk 'prev == "flags" {print} {prev = $0}' | grep -qx slave
}

sentinel_master() { rcli "$1" sentinel get-master-addr-by-name mymaster 2>/dev/null | tr -d '\r' | paste -sd: -; }

# sentinels_agree ADDR: every Sentinel names ADDR as the master.
sentinels_agree() {
  local s
  for s in 1 2 3; do
    [ "$(sentinel_master "$(sentinel_port "$s")")" = "$1" ] || return 1
  done
}

# data_port_of LINKPORT: the plain port of the data node reached on LINKPORT.
data_port_of() {
  case $1 in
    "$REDIS_PORT" | "$REDIS_TLS_PORT") echo "$REDIS_PORT" ;;
    "$REPLICA_PORT" | "$REPLICA_TLS_PORT") echo "$REPLICA_PORT" ;;
    *) return 1 ;;
  esac
}

master_changed() { local m; m=$(sentinel_master "$1") && [ -n "$m" ] && [ "$m" != "$2" ]; }

redis_is_master() { rcli "$1" info replication 2>/dev/null | tr -d '\r' | grep -qx 'role:master'; }

redis_failover() {
  local s1 old new out
  s1=$(sentinel_port 1)
  old=$(sentinel_master "$s1")
  [ -n "$old" ] || die "sentinel 1 (port $s1) does not answer"
  # Right after a failover the Sentinels learn within about 10s that the old
  # master is a replica now; until then they refuse another one (NOGOODSLAVE).
  local deadline=$((SECONDS + 40))
  while :; do
    out=$(rcli "$s1" sentinel failover mymaster 2>&1 | tr -d '\r')
    [ "$out" = OK ] && break
    ((SECONDS < deadline)) || die "SENTINEL FAILOVER refused: $out"
    sleep 0.5
  done
  wait_for "a new master" 30 master_changed "$s1" "$old" ||
    die "sentinel 1 still names $old as master"
  new=$(sentinel_master "$s1")
  wait_for "every sentinel names $new" 30 sentinels_agree "$new" || die "the sentinels do not agree on $new"
  local newp oldp
  newp=$(data_port_of "${new##*:}") || die "the new master $new is no node of this cluster"
  oldp=$(data_port_of "${old##*:}") || true
  wait_for "$new acts as master" 30 redis_is_master "$newp" || die "$new does not act as master"
  if [ -n "$oldp" ] && alive "$RD/$(redis_name_of "$oldp").pid"; then
    wait_for "the old master replicates from $new" 30 redis_synced "$oldp" ||
      die "the old master ($old) does not replicate from the new one"
  fi
  log "Redis failover: master $old -> $new"
}

redis_name_of() { if [ "$1" = "$REDIS_PORT" ]; then echo primary; else echo replica; fi; }

# --- the whole cluster ----------------------------------------------------

# pid files of every process, with how to stop each.
all_pidfiles() {
  local n s
  for n in 1 2 3; do rabbit_pidfile "$n"; done
  echo "$R/epmd.pid"
  echo "$PG/primary/postmaster.pid"
  echo "$PG/standby/postmaster.pid"
  echo "$RD/primary.pid"
  echo "$RD/replica.pid"
  for s in 1 2 3; do echo "$RD/sentinel$s.pid"; done
}

all_running() {
  [ -f "$STATE" ] || return 1
  [ "$(cat "$STATE")" = "$BASE $WANT_TLS" ] || return 1
  # A promoted standby is a changed cluster: both servers must run as set up.
  [ -f "$PG/standby/standby.signal" ] || return 1
  local f
  while IFS= read -r f; do alive "$f" || return 1; done < <(all_pidfiles)
}

any_running() {
  local f
  while IFS= read -r f; do alive "$f" && return 0; done < <(all_pidfiles)
  return 1
}

cluster_down() {
  local n s
  for n in 1 2 3; do
    # Data is removed: no graceful shutdown needed.
    stop_pid "$(rabbit_pidfile "$n")" KILL 5
    stop_pid "$(node_dir "$n")/wrapper.pid" TERM 5
  done
  stop_pid "$R/epmd.pid" TERM 5
  for d in primary standby; do
    if alive "$PG/$d/postmaster.pid"; then
      as_pg "$(pg_bin)/pg_ctl" -D "$PG/$d" -m immediate -w -t 10 -s stop >/dev/null 2>&1 || true
      stop_pid "$PG/$d/postmaster.pid" QUIT 5
    fi
  done
  for s in 1 2 3; do stop_pid "$RD/sentinel$s.pid" KILL 5; done
  stop_pid "$RD/replica.pid" KILL 5
  stop_pid "$RD/primary.pid" KILL 5
  if any_running; then die "some processes of $DIR still run; not removing it"; fi
  rm -rf "$DIR"
}

check_ports_free() {
  local p busy=()
  for p in $(seq "$BASE" $((BASE + 38))); do
    if tcp_open 127.0.0.1 "$p"; then busy+=("$p"); fi
  done
  [ ${#busy[@]} -eq 0 ] ||
    die "ports ${busy[*]} are in use by processes not of $DIR: choose another CLUSTER_PORT_BASE (ports base..base+38)"
}

env_lines() {
  local tls n amqp=() amqps=() nodes=() mgmt=()
  tls=$(state_tls)
  for n in 1 2 3; do
    amqp+=("amqp://guest:guest@127.0.0.1:$(amqp_port "$n")/")
    nodes+=("$(node_name "$n")")
    mgmt+=("http://guest:guest@127.0.0.1:$(mgmt_port "$n")")
    [ "$tls" = 1 ] && amqps+=("amqps://guest:guest@127.0.0.1:$(amqps_port "$n")/")
  done
  join() {
    local IFS=,
    echo "$*"
  }
  local pgq="postgres://postgres@127.0.0.1"
  echo "export CLUSTER_DIR='$DIR'"
  echo "export CLUSTER_PORT_BASE='$BASE'"
  echo "export CLUSTER_AMQP_URLS='$(join "${amqp[@]}")'"
  echo "export CLUSTER_AMQPS_URLS='$(join ${amqps[@]+"${amqps[@]}"})'"
  echo "export CLUSTER_RABBIT_NODES='$(join "${nodes[@]}")'"
  echo "export CLUSTER_MANAGEMENT_URLS='$(join "${mgmt[@]}")'"
  echo "export CLUSTER_DATABASE_URL='$pgq:$PG_PRIMARY_PORT,127.0.0.1:$PG_STANDBY_PORT/postgres?sslmode=disable&target_session_attrs=read-write'"
  echo "export CLUSTER_PG_PRIMARY_URL='$pgq:$PG_PRIMARY_PORT/postgres?sslmode=disable'"
  echo "export CLUSTER_PG_STANDBY_URL='$pgq:$PG_STANDBY_PORT/postgres?sslmode=disable'"
  if [ "$tls" = 1 ]; then
    echo "export CLUSTER_DATABASE_TLS_URL='postgres://postgres@127.0.0.1:$PG_PRIMARY_PORT,127.0.0.1:$PG_STANDBY_PORT/postgres?sslmode=verify-full&sslrootcert=$TLS_DIR/ca.pem&target_session_attrs=read-write'"
  else
    echo "export CLUSTER_DATABASE_TLS_URL=''"
  fi
  echo "export CLUSTER_REDIS_URL='redis+sentinel://127.0.0.1:$(sentinel_port 1),127.0.0.1:$(sentinel_port 2),127.0.0.1:$(sentinel_port 3)/mymaster'"
  if [ "$tls" = 1 ]; then
    echo "export CLUSTER_REDIS_TLS_URL='rediss+sentinel://127.0.0.1:$(sentinel_tls_port 1),127.0.0.1:$(sentinel_tls_port 2),127.0.0.1:$(sentinel_tls_port 3)/mymaster'"
    echo "export CLUSTER_CA_FILE='$TLS_DIR/ca.pem'"
  else
    echo "export CLUSTER_REDIS_TLS_URL=''"
    echo "export CLUSTER_CA_FILE=''"
  fi
  echo "export CLUSTER_REDIS_PRIMARY_URL='redis://127.0.0.1:$REDIS_PORT/0'"
}

cluster_up() {
  if all_running; then
    log "already running in $DIR (port base $BASE)"
    env_lines | tee "$ENV_FILE"
    return 0
  fi
  ensure_packages
  if [ -d "$DIR" ]; then
    log "removing the previous, incomplete or different cluster in $DIR"
    cluster_down
  fi
  check_ports_free
  local t0=$SECONDS
  mkdir -p "$DIR"
  chmod 755 "$DIR"
  TLS=$WANT_TLS
  [ "$TLS" = 1 ] && tls_make
  # RabbitMQ boots slowest: it starts first, PostgreSQL and Redis meanwhile.
  rabbit_up >"$DIR/rabbit-up.log" 2>&1 &
  local rabbit_job=$!
  pg_up
  redis_up
  if ! wait "$rabbit_job"; then
    cat "$DIR/rabbit-up.log" >&2
    die "RabbitMQ did not come up"
  fi
  cat "$DIR/rabbit-up.log" >&2
  echo "$BASE $TLS" >"$STATE"
  log "up in $((SECONDS - t0))s (port base $BASE, TLS $([ "$TLS" = 1 ] && echo on || echo off), folder $DIR)"
  log "the URLs below are in $ENV_FILE too; load them with: . $ENV_FILE"
  env_lines | tee "$ENV_FILE"
}

status_line() {
  local what=$1 port=$2 pidfile=$3 role=${4:-} pid state=down
  pid=$(pid_from "$pidfile")
  if [ -n "$pid" ] && ours "$pid"; then state=up; else pid=-; fi
  printf '%-22s %-6s %-8s %-5s %s\n' "$what" "$port" "$pid" "$state" "$role"
}

cluster_status() {
  if [ ! -d "$DIR" ]; then
    echo "no cluster in $DIR"
    return 0
  fi
  TLS=$(state_tls)
  printf '%-22s %-6s %-8s %-5s %s\n' PROCESS PORT PID STATE ROLE
  local n role s
  for n in 1 2 3; do
    role=
    if alive "$(rabbit_pidfile "$n")"; then
      role="running nodes: $(running_nodes "$n" 2>/dev/null | wc -l)"
    fi
    status_line "rabbit $(node_name "$n")" "$(amqp_port "$n")" "$(rabbit_pidfile "$n")" "$role"
  done
  status_line epmd "$EPMD_PORT" "$R/epmd.pid"
  for d in primary standby; do
    local port
    port=$(pg_port_of "$PG/$d" 2>/dev/null) || port=
    role=
    if alive "$PG/$d/postmaster.pid"; then
      case $(psql_at "$port" -c "SELECT pg_is_in_recovery()" 2>/dev/null) in
        t) role=standby ;; f) role=primary ;; *) role='?' ;;
      esac
    fi
    status_line "postgres $d" "${port:--}" "$PG/$d/postmaster.pid" "$role"
  done
  for d in primary replica; do
    local port=$REDIS_PORT
    [ "$d" = replica ] && port=$REPLICA_PORT
    role=$(rcli "$port" info replication 2>/dev/null | tr -d '\r' | sed -n 's/^role://p' || true)
    status_line "redis $d" "$port" "$RD/$d.pid" "$role"
  done
  for s in 1 2 3; do
    role=$(sentinel_master "$(sentinel_port "$s")" || true)
    status_line "sentinel $s" "$(sentinel_port "$s")" "$RD/sentinel$s.pid" "${role:+master $role}"
  done
}

# Commands that change the cluster hold a lock beside CLUSTER_DIR, bounded.
lock() {
  mkdir -p "$(dirname "$DIR")"
  exec 9>"$DIR.lock"
  flock -w 300 9 || die "another scripts/cluster.sh holds $DIR.lock"
}

need_cluster() {
  [ -f "$STATE" ] || die "no cluster in $DIR: run scripts/cluster.sh up (CLUSTER_DIR and CLUSTER_PORT_BASE as for up)"
  TLS=$(state_tls)
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
  up)
    lock
    cluster_up
    ;;
  down)
    lock
    if [ -d "$DIR" ]; then
      cluster_down
      log "stopped and removed $DIR"
    else
      log "no cluster in $DIR"
    fi
    ;;
  status) cluster_status ;;
  env)
    need_cluster
    env_lines
    ;;
  kill-rabbit)
    rabbit_check_index "${1:-}"
    lock
    need_cluster
    rabbit_kill "$1"
    ;;
  start-rabbit)
    rabbit_check_index "${1:-}"
    lock
    need_cluster
    rabbit_start_joined "$1"
    ;;
  restart-rabbit)
    rabbit_check_index "${1:-}"
    lock
    need_cluster
    rabbit_stop_graceful "$1"
    rabbit_start_joined "$1"
    ;;
  rabbitmqctl)
    rabbit_check_index "${1:-}"
    need_cluster
    n=$1
    shift
    ctl "$n" "$@"
    ;;
  rabbit-leader)
    [ $# -eq 2 ] || die "usage: scripts/cluster.sh rabbit-leader VHOST QUEUE"
    need_cluster
    rabbit_leader "$1" "$2"
    ;;
  promote-pg)
    lock
    need_cluster
    pg_promote
    ;;
  redis-failover)
    lock
    need_cluster
    redis_failover
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
