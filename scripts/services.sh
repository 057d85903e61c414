#!/usr/bin/env bash
# Makes sure RabbitMQ, PostgreSQL and Redis answer on loopback, and that the
# tests can log in to PostgreSQL.
#
# With a Docker engine (and NO_DOCKER unset) it starts them with docker
# compose. Otherwise it uses the local servers:
#   - one that answers is left alone;
#   - one that is installed but down is started, with the commands CI uses;
#   - one that is missing is installed with apt-get (Debian/Ubuntu, as root).
# Without root it changes nothing: it prints the exact commands to run and
# exits 1. A service whose TEST_DATABASE_URL, TEST_AMQP_URL or TEST_REDIS_URL
# is set is left to the user. Every wait is bounded. Safe to run again; a
# no-op when all is up.
#
# PostgreSQL login: the tests connect as TEST_DATABASE_URL (default user
# postgres, no password, on 127.0.0.1). A password in that URL, PGPASSWORD or
# ~/.pgpass is used as the tests use it. Only when the login fails for want
# of a password, and only as root on a local cluster, it adds "trust" lines
# for that user from 127.0.0.1 and ::1 at the top of the cluster's
# pg_hba.conf (marked "inboxmq-test") and reloads the server.
#
# DRY_RUN=1 prints what would change the machine (apt-get, starts, the
# pg_hba.conf lines) instead of doing it.
set -euo pipefail

cd "$(dirname "$0")/.."

log() { printf 'services: %s\n' "$*" >&2; }

DRY_RUN=${DRY_RUN:-}
# act CMD...: run a command that changes the machine (or print it, dry run).
act() {
  if [ -n "$DRY_RUN" ]; then log "dry run: would run: $*"; else "$@"; fi
}

# tcp_open HOST PORT: true when something accepts connections there.
tcp_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# wait_for NAME SECONDS CMD...: retry CMD every half second, bounded.
wait_for() {
  local name=$1 secs=$2; shift 2
  if [ -n "$DRY_RUN" ]; then log "dry run: would wait up to ${secs}s for $name"; return 0; fi
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "$name did not come up within ${secs}s"
      return 1
    fi
    sleep 0.5
  done
  log "$name is up"
}

pg_ready() {
  if command -v pg_isready >/dev/null; then pg_isready -q -h 127.0.0.1 -p 5432; else tcp_open 127.0.0.1 5432; fi
}
redis_ready() {
  if command -v redis-cli >/dev/null; then [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = PONG ]; else tcp_open 127.0.0.1 6379; fi
}
rabbit_ready() { tcp_open 127.0.0.1 5672; }
rabbit_ping() {
  if command -v rabbitmq-diagnostics >/dev/null && [ "$(id -u)" = 0 ]; then
    rabbitmq-diagnostics -q ping && rabbit_ready
  else
    rabbit_ready
  fi
}

# pg_version: the newest PostgreSQL cluster version under /etc/postgresql.
pg_version() { ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1; }

# The start commands, as CI runs them (and as printed for a user without
# root).
pg_start='pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -n 1)" main start'
redis_start='mkdir -p /var/lib/redis /var/log/redis && redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log'
rabbit_start='rabbitmq-server -detached'

# start NAME CMD: start a server with a shell command line (or print it).
start() {
  log "starting $1"
  if [ -n "$DRY_RUN" ]; then log "dry run: would run: $2"; else bash -c "$2"; fi
}

# hash_plugin CMD...: enables rabbitmq_consistent_hash_exchange (ordered
# routes declare an x-consistent-hash exchange) with CMD (rabbitmq-plugins,
# or the same run in the compose container) when it is not enabled yet.
# Enabling is online: the broker is not restarted. Nothing happens when it
# is enabled already.
hash_plugin() {
  if "$@" list -e -m 2>/dev/null | grep -qx rabbitmq_consistent_hash_exchange; then return 0; fi
  log "changing the running RabbitMQ: enabling its plugin rabbitmq_consistent_hash_exchange (ordered routes and their tests need it; online, no restart; undo with: rabbitmq-plugins disable rabbitmq_consistent_hash_exchange)"
  act "$@" enable rabbitmq_consistent_hash_exchange >/dev/null
}

if [ -z "${NO_DOCKER:-}" ] && command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  log "Docker engine found: docker compose up -d --wait rabbitmq postgres redis"
  docker compose up -d --wait rabbitmq postgres redis
  hash_plugin docker compose exec -T rabbitmq rabbitmq-plugins
  exit 0
fi

is_root=false
[ "$(id -u)" = 0 ] && is_root=true
has_apt=false
command -v apt-get >/dev/null && has_apt=true

# Which services are down, and which of those are not installed. A service
# whose TEST_*_URL is set is the user's: it is neither checked nor started.
down=() missing_pkgs=()
[ -n "${TEST_DATABASE_URL:-}" ] || pg_ready || down+=(pg)
[ -n "${TEST_REDIS_URL:-}" ] || redis_ready || down+=(redis)
[ -n "${TEST_AMQP_URL:-}" ] || rabbit_ready || down+=(rabbit)
for s in ${down[@]+"${down[@]}"}; do
  case $s in
    pg) [ -n "$(pg_version)" ] && command -v pg_ctlcluster >/dev/null || missing_pkgs+=(postgresql) ;;
    redis) command -v redis-server >/dev/null || missing_pkgs+=(redis-server) ;;
    rabbit) command -v rabbitmq-server >/dev/null || missing_pkgs+=(rabbitmq-server) ;;
  esac
done

if [ ${#down[@]} -gt 0 ] && ! $is_root; then
  names=${down[*]}; names=${names/pg/PostgreSQL}; names=${names/redis/Redis}; names=${names/rabbit/RabbitMQ}
  log "down: $names. Not running as root, so nothing was installed or started; run:"
  if [ ${#missing_pkgs[@]} -gt 0 ]; then
    if $has_apt; then
      printf '  sudo apt-get update && sudo apt-get install -y %s\n' "${missing_pkgs[*]}" >&2
    else
      printf '  (install %s with your package manager)\n' "${missing_pkgs[*]}" >&2
    fi
  fi
  for s in "${down[@]}"; do
    case $s in
      pg) printf '  sudo %s\n' "$pg_start" >&2 ;;
      redis) printf "  sudo sh -c '%s'\n" "$redis_start" >&2 ;;
      rabbit) printf '  sudo %s\n' "$rabbit_start" >&2 ;;
    esac
  done
  log "then run make up again; or start a Docker engine and run make up (docker compose), or point TEST_DATABASE_URL, TEST_AMQP_URL and TEST_REDIS_URL at running servers"
  exit 1
fi

if [ ${#missing_pkgs[@]} -gt 0 ]; then
  if ! $has_apt; then
    log "${missing_pkgs[*]} not installed and no apt-get here: install them with your package manager, or use Docker (make up)"
    exit 1
  fi
  log "installing ${missing_pkgs[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  act apt-get update -qq
  act apt-get install -y -qq --no-install-recommends "${missing_pkgs[@]}"
fi

# Start what is down (a package's own post-install may have started it).
rabbit_started=false
for s in ${down[@]+"${down[@]}"}; do
  case $s in
    pg) pg_ready || start PostgreSQL "$pg_start" ;;
    redis) redis_ready || start Redis "$redis_start" ;;
    rabbit) rabbit_ready || { start RabbitMQ "$rabbit_start"; rabbit_started=true; } ;;
  esac
done
[ -n "${TEST_DATABASE_URL:-}" ] || wait_for PostgreSQL 60 pg_ready
[ -n "${TEST_REDIS_URL:-}" ] || wait_for Redis 30 redis_ready
# A broker that answered on its port has booted; one just started is
# waited for until its node answers a ping too.
if $rabbit_started; then
  wait_for RabbitMQ 120 rabbit_ping
elif [ -z "${TEST_AMQP_URL:-}" ]; then
  wait_for RabbitMQ 120 rabbit_ready
fi
# The local broker's plugin (a broker of TEST_AMQP_URL is the user's).
if [ -z "${TEST_AMQP_URL:-}" ] && $is_root && command -v rabbitmq-plugins >/dev/null; then
  hash_plugin rabbitmq-plugins || log "could not enable rabbitmq_consistent_hash_exchange: ordered routes will not start"
fi
if [ -n "$DRY_RUN" ] && [ ${#down[@]} -gt 0 ]; then
  log "dry run: PostgreSQL login not checked (servers were down)"
  exit 0
fi

# --- PostgreSQL login as the tests do it ---------------------------------

db_url=${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/inboxmq_test?sslmode=disable}
# The URL's user and host (defaults as libpq's: the OS user, local socket).
rest=${db_url#*://}
rest=${rest%%/*}
if [[ $rest == *@* ]]; then userinfo=${rest%@*}; hostport=${rest##*@}; else userinfo=; hostport=$rest; fi
db_user=${userinfo%%:*}
db_user=${db_user:-${PGUSER:-$(id -un)}}
db_host=${hostport%:*}
db_host=${db_host#[}
db_host=${db_host%]}

# pg_login: prints nothing and succeeds when the tests' user can log in;
# otherwise prints psql's error. A missing test database is fine (the tests
# create it on first use).
pg_login() {
  local out
  if out=$(LC_ALL=C PGCONNECT_TIMEOUT=5 psql -w -X -q -d "$db_url" -c 'SELECT 1' 2>&1 >/dev/null); then return 0; fi
  if [[ $out == *"database \""*"\" does not exist"* ]]; then return 0; fi
  printf '%s\n' "$out"
  return 1
}

if ! command -v psql >/dev/null; then
  log "psql not found: PostgreSQL login not checked"
  exit 0
fi
if err=$(pg_login); then
  exit 0
fi
case $err in
  *"password authentication failed"* | *"no password supplied"*) ;;
  *)
    log "PostgreSQL refused the tests' login: $err"
    exit 1
    ;;
esac

shown_url=$db_url
if [[ $userinfo == *:* ]]; then shown_url=${db_url/"$userinfo@"/"$db_user:xxxxx@"}; fi
if [[ $userinfo == *:* ]] || [ -n "${PGPASSWORD:-}" ]; then
  log "PostgreSQL refused the password given for $db_user (TEST_DATABASE_URL $shown_url or PGPASSWORD): $err"
  exit 1
fi
log "PostgreSQL asks $db_user for a password on $db_host; the tests connect as $shown_url without one"
log "give it in TEST_DATABASE_URL (postgres://$db_user:PASSWORD@$hostport/inboxmq_test?sslmode=disable) or in PGPASSWORD or ~/.pgpass (the tests honour them)"
hba=
if [ -n "$(pg_version)" ]; then hba=/etc/postgresql/$(pg_version)/main/pg_hba.conf; fi
# Only a URL naming a loopback host, on a local cluster, gets the trust lines.
[[ $db_url == *://* ]] || exit 1
case $db_host in 127.0.0.1 | localhost | ::1) ;; *) exit 1 ;; esac
if [ ! -f "$hba" ]; then exit 1; fi
lines="host all $db_user 127.0.0.1/32 trust  # inboxmq-test: added by scripts/services.sh
host all $db_user ::1/128 trust  # inboxmq-test: added by scripts/services.sh"
if ! $is_root; then
  log "or let the tests in without one: run sudo scripts/services.sh, which adds to the top of $hba"
  printf '%s\n' "$lines" >&2
  log "and reloads the server (pg_ctlcluster --skip-systemctl-redirect $(pg_version) main reload)"
  exit 1
fi
if grep -q 'inboxmq-test' "$hba"; then
  log "$hba already has the inboxmq-test trust lines, yet the login fails: check the lines above them and the server's log"
  exit 1
fi
log "as root on a local cluster: adding trust for $db_user from 127.0.0.1 and ::1 to the top of $hba (lines marked inboxmq-test)"
if [ -n "$DRY_RUN" ]; then
  log "dry run: would prepend to $hba:"
  printf '%s\n' "$lines" >&2
  log "dry run: would run: pg_ctlcluster --skip-systemctl-redirect $(pg_version) main reload"
  exit 0
fi
tmp=$(mktemp)
{ printf '%s\n' "$lines"; cat "$hba"; } >"$tmp"
cat "$tmp" >"$hba" # keeps the file's owner and mode
rm -f "$tmp"
pg_ctlcluster --skip-systemctl-redirect "$(pg_version)" main reload
# A reload is asynchronous: wait, bounded, until the login works.
wait_for "PostgreSQL (login as $db_user)" 10 pg_login
