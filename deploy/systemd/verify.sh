#!/usr/bin/env bash
# Check the units with `systemd-analyze verify`, offline: the units are copied with ExecStart
# pointing at this checkout's pkgq (verify insists the binary exists) and the consumer
# template instantiated for one route. Any message from systemd-analyze fails the check.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
pkgq="$repo/.venv/bin/pkgq"
if ! command -v systemd-analyze >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q systemd >/dev/null
    else
        echo "systemd-analyze is missing: run 'sudo apt-get install -y systemd'" >&2
        exit 1
    fi
fi
[ -x "$pkgq" ] || { echo "$pkgq is missing: run 'make venv' first" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for unit in pkgq-relay.service pkgq-migrate.service pkgq.target; do
    sed "s|/opt/pkgq/.venv/bin/pkgq|$pkgq|" "$here/$unit" > "$work/$unit"
done
sed "s|/opt/pkgq/.venv/bin/pkgq|$pkgq|" "$here/pkgq-consumer@.service" \
    > "$work/pkgq-consumer@.service"
cp "$work/pkgq-consumer@.service" "$work/pkgq-consumer@usage_record.service"
out=$(cd "$work" && SYSTEMD_LOG_COLOR=0 systemd-analyze verify --man=no \
    pkgq-consumer@usage_record.service pkgq-relay.service pkgq-migrate.service pkgq.target 2>&1) \
    || { echo "$out" >&2; exit 1; }
# Messages about units outside pkgq (the host's own) are not ours to fix.
ours=$(printf '%s\n' "$out" | grep -E 'pkgq' || true)
if [ -n "$ours" ]; then
    echo "$ours" >&2
    exit 1
fi
echo "systemd units verified: pkgq-consumer@.service pkgq-relay.service pkgq-migrate.service pkgq.target"
