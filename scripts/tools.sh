#!/usr/bin/env bash
# Installs the command-line tools the tests need and a fresh machine may lack:
# promtool (Debian package prometheus) for the alert-rule tests. It installs
# only as root through apt-get, runs apt-get update at most once, and does
# nothing when the tools are present.
set -euo pipefail

log() { printf 'tools: %s\n' "$*" >&2; }

missing=()
command -v promtool >/dev/null || missing+=(prometheus)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  log "missing ${missing[*]}; install them (e.g. apt-get install ${missing[*]}) and re-run"
  exit 0
fi
log "installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
