#!/usr/bin/env bash
# Installs the command-line tools that make needs and a fresh machine may
# lack, and does nothing for a tool already there:
#
#   promtool       the alert-rule tests (scripts/test-alerts.sh): from
#                  Debian's "prometheus" package as root with apt-get,
#                  otherwise built with go install into bin/tools
#   amtool         the Alertmanager config check (scripts/test-alerts.sh):
#                  from Debian's "prometheus-alertmanager" package as root
#                  with apt-get, otherwise built with go install
#   chromium       the console's end-to-end tests (ui), headless: from
#                  Debian's "chromium" package as root with apt-get
#                  (any of chromium, chromium-browser or google-chrome on
#                  the PATH will do)
#   golangci-lint  make lint: always the pinned version below, built with
#                  go install into bin/tools (a different one on the PATH is
#                  not used)
#
# Usage: scripts/tools.sh [promtool] [amtool] [chromium] [golangci-lint]   (no argument: all)
# The Makefile puts bin/tools first on the PATH. apt-get update runs at most
# once. Exits 1, saying what to run, when a tool cannot be installed.
set -euo pipefail

cd "$(dirname "$0")/.."

# Pinned versions. golangci-lint must be built with a Go at least as new as
# the module's go directive (go.mod), or it refuses to load the packages.
GOLANGCI_LINT_VERSION=v2.15.0
# The module github.com/prometheus/prometheus tags Prometheus 3.16.0 as v0.316.0.
PROMTOOL_VERSION=v0.316.0
AMTOOL_VERSION=v0.27.0

TOOLS_BIN="$PWD/bin/tools"
export PATH="$TOOLS_BIN:$PATH"

log() { printf 'tools: %s\n' "$*" >&2; }

# go_install NAME PACKAGE@VERSION: build a tool into bin/tools.
go_install() {
  log "building $1 ($2) into bin/tools with $(go version | awk '{print $3}'); this takes a few minutes once"
  mkdir -p "$TOOLS_BIN"
  GOBIN="$TOOLS_BIN" go install "$2"
}

install_promtool() {
  if command -v promtool >/dev/null; then return 0; fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing promtool (apt-get install prometheus)"
    export DEBIAN_FRONTEND=noninteractive
    if apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null; then
      return 0
    fi
    log "apt-get could not install prometheus; trying go install"
  fi
  if command -v go >/dev/null && go_install promtool "github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_VERSION"; then
    return 0
  fi
  log "promtool is missing and could not be installed. Run one of:"
  log "  sudo apt-get install -y prometheus"
  log "  GOBIN=$TOOLS_BIN go install github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_VERSION"
  return 1
}

install_amtool() {
  if command -v amtool >/dev/null; then return 0; fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing amtool (apt-get install prometheus-alertmanager)"
    export DEBIAN_FRONTEND=noninteractive
    if apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus-alertmanager >/dev/null; then
      return 0
    fi
    log "apt-get could not install prometheus-alertmanager; trying go install"
  fi
  if command -v go >/dev/null && go_install amtool "github.com/prometheus/alertmanager/cmd/amtool@$AMTOOL_VERSION"; then
    return 0
  fi
  log "amtool is missing and could not be installed. Run one of:"
  log "  sudo apt-get install -y prometheus-alertmanager"
  log "  GOBIN=$TOOLS_BIN go install github.com/prometheus/alertmanager/cmd/amtool@$AMTOOL_VERSION"
  return 1
}

install_chromium() {
  local b
  for b in chromium chromium-browser google-chrome; do
    if command -v "$b" >/dev/null; then return 0; fi
  done
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing chromium (apt-get install chromium), for the console's end-to-end tests"
    export DEBIAN_FRONTEND=noninteractive
    if apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; then
      return 0
    fi
  fi
  log "chromium is missing and could not be installed; the console's end-to-end tests need it. Run:"
  log "  sudo apt-get install -y chromium"
  return 1
}

install_golangci_lint() {
  local bin="$TOOLS_BIN/golangci-lint"
  if [ -x "$bin" ] && [ "$("$bin" version --short 2>/dev/null)" = "${GOLANGCI_LINT_VERSION#v}" ]; then
    return 0
  fi
  rm -f "$bin"
  if go_install golangci-lint "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$GOLANGCI_LINT_VERSION"; then
    return 0
  fi
  log "golangci-lint $GOLANGCI_LINT_VERSION could not be built. Run:"
  log "  GOBIN=$TOOLS_BIN go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$GOLANGCI_LINT_VERSION"
  return 1
}

[ $# -gt 0 ] || set -- promtool amtool chromium golangci-lint
status=0
for tool in "$@"; do
  case $tool in
    promtool) install_promtool || status=1 ;;
    amtool) install_amtool || status=1 ;;
    chromium) install_chromium || status=1 ;;
    golangci-lint) install_golangci_lint || status=1 ;;
    *) log "unknown tool $tool (promtool, amtool, chromium, golangci-lint)"; status=1 ;;
  esac
done
exit "$status"
