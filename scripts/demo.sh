#!/usr/bin/env bash
# `make demo`: the payment-worker end to end, from a fresh machine.
#
#  1. services: docker compose when a Docker engine answers, else the local
#     RabbitMQ/PostgreSQL/Redis (started if down);
#  2. build the worker and the load tool (cmd/inboxload), migrate (twice: it
#     is idempotent);
#  3. start the worker in the background, wait for /readyz;
#  4. publish a burst with inboxload: ORDERS orders, each 1–3 times with
#     different message ids, plus INVALID invalid messages, with confirms;
#  5. wait until everything is processed (inboxload report), stop the worker
#     with SIGTERM;
#  6. print published / unique orders / payments / ledger / duplicates /
#     dead-lettered, and fail unless payments = unique orders = ledger rows;
#  7. print where to see metrics, traces and alerts: the compose stack's
#     Grafana, Jaeger, Prometheus and Alertmanager when they answer
#     (`docker compose up -d --wait`). With the stack's collector up and
#     no OTEL_* set, this run's worker sends its traces there too.
#
# Run it as often as you like: every run uses fresh order ids and purges the
# queue and its DLQ first.
set -euo pipefail

cd "$(dirname "$0")/.."

ORDERS=${ORDERS:-500}
MAX_COPIES=${MAX_COPIES:-3}
INVALID=${INVALID:-5}
export METRICS_ADDR=${METRICS_ADDR:-127.0.0.1:9464}
export PAYMENT_QUEUE=${PAYMENT_QUEUE:-payments.requested}

log() { printf '\n== demo: %s\n' "$*" >&2; }

log "services"
scripts/services.sh

# up URL: true if URL answers 2xx within a second.
up() {
  if command -v curl >/dev/null; then
    curl -fsS -m 1 -o /dev/null "$1" 2>/dev/null
  else
    local hp=${1#http://}
    hp=${hp%%/*}
    (exec 3<>"/dev/tcp/${hp%:*}/${hp##*:}") 2>/dev/null
  fi
}

# The compose stack's collector (published on loopback) takes this run's
# traces, unless the environment already says where they go.
if [ -z "${OTEL_EXPORTER_OTLP_ENDPOINT:-}${OTEL_EXPORTER_OTLP_TRACES_ENDPOINT:-}${OTEL_TRACES_EXPORTER:-}" ] &&
  (exec 3<>/dev/tcp/127.0.0.1/4318) 2>/dev/null; then
  export OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318
  export OTEL_SERVICE_NAME=${OTEL_SERVICE_NAME:-payment-worker-demo}
  log "traces: the compose stack's collector is up; exporting to $OTEL_EXPORTER_OTLP_ENDPOINT as $OTEL_SERVICE_NAME"
fi

# where prints where to see metrics, traces and alerts.
where() {
  local state
  log "where to look"
  printf '  %-13s %-12s %s\n' "Worker" "[this run]" "http://$METRICS_ADDR/metrics  (until it stops)" >&2
  for svc in "Grafana|http://127.0.0.1:3000/api/health|http://127.0.0.1:3000/d/inboxmq  (exemplars on the latency panels open their trace)" \
    "Prometheus|http://127.0.0.1:9090/-/ready|http://127.0.0.1:9090/alerts  (rules, firing alerts)" \
    "Jaeger|http://127.0.0.1:16686/|http://127.0.0.1:16686/search?service=${OTEL_SERVICE_NAME:-payment-worker}" \
    "Alertmanager|http://127.0.0.1:9093/-/ready|http://127.0.0.1:9093/#/alerts  (notifications: docker compose logs alert-logger)"; do
    IFS='|' read -r name probe link <<<"$svc"
    if up "$probe"; then state=up; else state="not running"; fi
    printf '  %-13s %-12s %s\n' "$name" "[$state]" "$link" >&2
  done
  up http://127.0.0.1:9090/-/ready || printf '  start the stack with: docker compose up -d --wait  (Grafana login admin/admin)\n' >&2
}

mkdir -p bin
BIN=bin/payment-worker
LOAD=bin/inboxload
log "build $BIN and $LOAD"
go build -o "$BIN" ./examples/payment-worker
go build -o "$LOAD" ./cmd/inboxload

log "migrate (twice: safe to repeat)"
"$BIN" migrate
"$BIN" migrate

WORKER_LOG=bin/demo-worker.log
log "start the worker (JSON logs in $WORKER_LOG)"
"$BIN" run 2>"$WORKER_LOG" &
pid=$!
cleanup() { kill -TERM "$pid" 2>/dev/null || true; }
trap cleanup EXIT

ready() {
  if command -v curl >/dev/null; then
    curl -fsS "http://$METRICS_ADDR/readyz" >/dev/null 2>&1
  else
    (exec 3<>"/dev/tcp/${METRICS_ADDR%:*}/${METRICS_ADDR##*:}") 2>/dev/null
  fi
}
deadline=$((SECONDS + 60))
until ready; do
  if ! kill -0 "$pid" 2>/dev/null; then
    log "the worker exited early; last log lines:"
    tail -n 20 "$WORKER_LOG" >&2
    exit 1
  fi
  if ((SECONDS >= deadline)); then
    log "the worker was not ready within 60s; last log lines:"
    tail -n 20 "$WORKER_LOG" >&2
    exit 1
  fi
  sleep 0.2
done

SUMMARY=bin/demo-summary.json
log "publish $ORDERS orders (1–$MAX_COPIES copies each) + $INVALID invalid, with confirms"
"$LOAD" publish --purge --orders "$ORDERS" --max-copies "$MAX_COPIES" --invalid "$INVALID" --summary "$SUMMARY"

log "wait for the queue to drain, then count the effects"
set +e
"$LOAD" report --summary "$SUMMARY" --metrics-url "http://$METRICS_ADDR/metrics" --wait 3m
rc=$?
set -e

where

log "stop the worker with SIGTERM"
trap - EXIT
kill -TERM "$pid"
stop_deadline=$((SECONDS + 30))
while kill -0 "$pid" 2>/dev/null; do
  if ((SECONDS >= stop_deadline)); then
    log "the worker did not stop within 30s"
    kill -KILL "$pid" 2>/dev/null || true
    exit 1
  fi
  sleep 0.2
done
if wait "$pid"; then
  log "worker exited 0"
else
  code=$?
  log "worker exited $code"
  [ "$rc" -ne 0 ] || rc=$code
fi
exit "$rc"
