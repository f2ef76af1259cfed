#!/usr/bin/env bash
# Check deploy/observability: promtool (Debian's `prometheus` package, installed by
# deploy/local/ensure-tools.sh when missing) checks the alert rules and runs their unit tests
# (pkgq-alerts.test.yml); the dashboard must be valid JSON. The PrometheusRule's groups are kept
# identical to the rules file by tests/unit/test_observability_files.py, and the metric names
# both use are checked against a real process by tests/e2e/test_observability_metrics.py.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
"$here/../local/ensure-tools.sh"
cd "$here"
promtool check rules pkgq-alerts.rules.yml >&2
promtool test rules pkgq-alerts.test.yml >&2
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' pkgq-dashboard.json \
    || { echo "pkgq-dashboard.json is not valid JSON" >&2; exit 1; }
echo "observability verified: rules checked and unit-tested by $(promtool --version 2>&1 | head -1)"
