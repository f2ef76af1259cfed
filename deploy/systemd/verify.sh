#!/usr/bin/env bash
# Check the units with `systemd-analyze verify`, offline: the units are copied with ExecStart
# pointing at this checkout's pkgq (verify insists the binary exists) and the consumer
# template instantiated for one route. Any message from systemd-analyze fails the check.
# Then pkgq.target must want a unit that runs the dead-letter ingester: the consumer units run
# named routes, which do not include it, and without it broker dead letters are never filed.
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
units=(pkgq-relay.service pkgq-dlq-ingest.service pkgq-migrate.service pkgq-web.service pkgq.target)
for unit in "${units[@]}"; do
    sed "s|/opt/pkgq/.venv/bin/pkgq|$pkgq|" "$here/$unit" > "$work/$unit"
done
sed "s|/opt/pkgq/.venv/bin/pkgq|$pkgq|" "$here/pkgq-consumer@.service" \
    > "$work/pkgq-consumer@.service"
cp "$work/pkgq-consumer@.service" "$work/pkgq-consumer@usage_record.service"
out=$(cd "$work" && SYSTEMD_LOG_COLOR=0 systemd-analyze verify --man=no \
    pkgq-consumer@usage_record.service "${units[@]}" 2>&1) \
    || { echo "$out" >&2; exit 1; }
# Messages about units outside pkgq (the host's own) are not ours to fix.
ours=$(printf '%s\n' "$out" | grep -E 'pkgq' || true)
if [ -n "$ours" ]; then
    echo "$ours" >&2
    exit 1
fi

# Whether `pkgq ARGS` runs the ingester: `dlq ingest`, `run --ingest`, or `run` without routes.
runs_ingester() {
    local args a skip=0 routes=0 flag=""
    read -r -a args <<<"$1"
    case "${args[0]:-}" in
    dlq) [ "${args[1]:-}" = ingest ] ;;
    run)
        for a in "${args[@]:1}"; do
            if [ "$skip" = 1 ]; then skip=0; continue; fi
            case "$a" in
            --ingest) flag=yes ;;
            --no-ingest) flag=no ;;
            --replica | --concurrency) skip=1 ;;
            -*) ;;
            *) routes=1 ;;
            esac
        done
        [ "$flag" = yes ] || { [ -z "$flag" ] && [ "$routes" = 0 ]; }
        ;;
    *) return 1 ;;
    esac
}

# The units pkgq.target (in directory $1) wants whose ExecStart runs the ingester.
ingester_units() {
    local unit line
    for unit in $(sed -n 's/^Wants=//p' "$1/pkgq.target"); do
        [ -f "$1/$unit" ] || continue
        while read -r line; do
            runs_ingester "${line#*/pkgq }" && echo "$unit"
        done < <(sed -n 's/^ExecStart=[-@:+!]*//p' "$1/$unit")
    done
    return 0
}

ingesters=$(ingester_units "$here")
if [ -z "$ingesters" ]; then
    echo "no unit wanted by pkgq.target runs the dead-letter ingester (pkgq dlq ingest):" \
        "broker dead letters would never be filed" >&2
    exit 1
fi
# Self-test: the same check must fail on a target that does not want the ingester's unit.
mkdir "$work/without"
cp "$here"/*.service "$work/without/"
sed "/^Wants=/s/ *pkgq-dlq-ingest.service//" "$here/pkgq.target" >"$work/without/pkgq.target"
if [ -n "$(ingester_units "$work/without")" ]; then
    echo "verify.sh self-test: the ingester check passed a target without the ingester" >&2
    exit 1
fi
for args in "run" "run --ingest usage_record" "run --replica 0/2" "dlq ingest"; do
    runs_ingester "$args" || { echo "verify.sh self-test: missed 'pkgq $args'" >&2; exit 1; }
done
for args in "run %i" "run --no-ingest" "relay" "dlq list"; do
    ! runs_ingester "$args" || { echo "verify.sh self-test: 'pkgq $args' taken" >&2; exit 1; }
done
echo "systemd units verified: pkgq-consumer@.service ${units[*]}; the ingester runs in $ingesters"
