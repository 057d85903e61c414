#!/usr/bin/env bash
# Makes sure RabbitMQ, PostgreSQL and Redis answer on loopback.
#
# With a Docker engine (and NO_DOCKER unset) it starts them with docker
# compose; otherwise it starts the locally installed servers that are down,
# with the same commands CI uses. Every wait is bounded. Safe to run again.
set -euo pipefail

cd "$(dirname "$0")/.."

log() { printf 'services: %s\n' "$*" >&2; }

# tcp_open HOST PORT: true when something accepts connections there.
tcp_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# wait_for NAME SECONDS CMD...: retry CMD every half second, bounded.
wait_for() {
  local name=$1 secs=$2; shift 2
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

if [ -z "${NO_DOCKER:-}" ] && command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  log "Docker engine found: docker compose up -d --wait rabbitmq postgres redis"
  docker compose up -d --wait rabbitmq postgres redis
  exit 0
fi

if ! pg_ready; then
  log "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
fi
wait_for PostgreSQL 60 pg_ready

if ! redis_ready; then
  log "starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi
wait_for Redis 30 redis_ready

if ! rabbit_ready; then
  log "starting RabbitMQ"
  rabbitmq-server -detached
fi
rabbit_ping() {
  if command -v rabbitmq-diagnostics >/dev/null && [ "$(id -u)" = 0 ]; then
    rabbitmq-diagnostics -q ping && rabbit_ready
  else
    rabbit_ready
  fi
}
wait_for RabbitMQ 120 rabbit_ping
