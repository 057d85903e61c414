#!/usr/bin/env bash
# Checks the Prometheus config and alert rules and runs their unit tests
# (deploy/prometheus/alerts_test.yml), and checks the Alertmanager config
# (deploy/alertmanager/alertmanager.yml). Fails if promtool or amtool is
# missing: scripts/tools.sh (make tools) installs them, from Debian's
# "prometheus" and "prometheus-alertmanager" packages as root or with go
# install into bin/tools.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$root/deploy/prometheus"
PATH="$root/bin/tools:$PATH"

if ! command -v promtool >/dev/null 2>&1; then
	echo "test-alerts: promtool not found; run scripts/tools.sh promtool (make tools) and rerun" >&2
	exit 1
fi

if ! command -v amtool >/dev/null 2>&1; then
	echo "test-alerts: amtool not found; run scripts/tools.sh amtool (make tools) and rerun" >&2
	exit 1
fi

promtool check rules "$dir/alerts.yml"
promtool check config "$dir/prometheus.yml"
(cd "$dir" && promtool test rules alerts_test.yml)
amtool check-config "$root/deploy/alertmanager/alertmanager.yml"

# The dashboard must be valid JSON with a query per panel (the Go test in
# metrics/ checks that every series it names exists).
if command -v python3 >/dev/null 2>&1; then python3 - "$root/deploy/grafana/dashboards/inboxmq.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
panels = [p for p in d["panels"] if p.get("type") != "row"]
assert panels, "dashboard has no panels"
for p in panels:
    for t in p.get("targets", []):
        assert "inboxmq_" in t["expr"] or "rabbitmq_" in t["expr"], (p["title"], t["expr"])
print(f"dashboard: {len(panels)} panels OK")
PY
fi
echo "test-alerts: OK"
