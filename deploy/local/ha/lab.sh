#!/usr/bin/env bash
# The local HA lab: a 3-node RabbitMQ cluster behind haproxy, and a PostgreSQL 15 primary with a
# synchronous streaming standby, all on this machine beside (never instead of) the development
# RabbitMQ (rabbit@localhost, 5672) and PostgreSQL (15/main, 5432), which it does not touch.
# Chaos tests drive it with the subcommands below. Runs as root. See README.md here.
set -eEuo pipefail
# A command that fails outside a die (set -e ends the script) says which one and where, so a
# boot that stops under load in CI is not a log that ends without a reason. Not inside a
# $(...) or a background job (a subshell): their callers check them, and a message built with
# one may meet an empty answer.
trap 'ha_lab_rc=$?; [ "$BASH_SUBSHELL" = 0 ] && echo "ha-lab: ${BASH_SOURCE[0]}:$LINENO: \"$BASH_COMMAND\" failed with status $ha_lab_rc" >&2' ERR

SCRIPT=ha-lab
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=deploy/local/common.sh
source "$HERE/../common.sh"
# shellcheck source=deploy/local/ha/lib.sh
source "$HERE/lib.sh"
# shellcheck source=deploy/local/ha/rabbit.sh
source "$HERE/rabbit.sh"
# shellcheck source=deploy/local/ha/haproxy.sh
source "$HERE/haproxy.sh"
# shellcheck source=deploy/local/ha/pg.sh
source "$HERE/pg.sh"

usage() {
    cat <<EOF
usage: $0 COMMAND
  up                       start the lab (idempotent); prints export lines, also in \$PKGQ_HA_DIR/env
  down                     stop the lab and remove all of it (idempotent)
  status                   one line per component; exit 0 only if everything is up
  env                      print the export lines of up
  rabbit-kill N [N...]     SIGKILL node pkgqhaN@localhost (N = 1..3)
  rabbit-start N [N...]    start node(s) again, wait until running in the cluster; prints seconds
  rabbit-nodes             print the numbers of the running nodes, e.g. "1 3"
  rabbit-leader Q [VHOST]  print the number of the node leading quorum queue Q (or hosting classic Q)
  pg-crash                 stop the PostgreSQL primary with -m immediate
  pg-promote               promote the standby, wait until it takes writes; prints its port
  pg-rebuild-standby       make the other cluster a synchronous standby of the primary; prints its port
  pg-primary               print the port of the running primary
State directory: $HA_DIR (PKGQ_HA_DIR).
EOF
}

check_installed() {
    command -v /usr/lib/rabbitmq/bin/rabbitmq-server >/dev/null 2>&1 \
        || die "RabbitMQ is not installed: run 'apt-get install rabbitmq-server' (deploy/local/ensure-services.sh does)."
    { command -v pg_createcluster >/dev/null 2>&1 && [ -x "/usr/lib/postgresql/$PG_VERSION/bin/postgres" ]; } \
        || die "PostgreSQL $PG_VERSION is not installed: run 'apt-get install postgresql-$PG_VERSION'."
    { id rabbitmq >/dev/null 2>&1 && id postgres >/dev/null 2>&1; } \
        || die "the rabbitmq or postgres user is missing: reinstall rabbitmq-server / postgresql."
    { command -v curl >/dev/null 2>&1 && command -v jq >/dev/null 2>&1; } \
        || die "curl or jq is missing (the lab asks its nodes over their management API): run 'apt-get install curl jq' (deploy/local/ensure-tools.sh does)."
    [ -r "$RABBIT_USER_HOME/.erlang.cookie" ] \
        || die "no Erlang cookie in $RABBIT_USER_HOME/.erlang.cookie: start the dev RabbitMQ once (deploy/local/ensure-services.sh) to create it."
}

cmd_up() {
    local start pg_job
    start=$(now)
    check_installed
    lock_lab
    make_state_dir
    # PostgreSQL comes up in the background while the RabbitMQ nodes boot.
    pg_up &
    pg_job=$!
    rabbit_up
    haproxy_up
    wait "$pg_job" || die "PostgreSQL did not come up (see the message above); '$0 status' shows what runs."
    env_lines >"$HA_DIR/env"
    say "the HA lab is up ($(elapsed "$start") s); 'eval \"\$($0 env)\"' sets these:"
    env_lines
}

cmd_down() {
    local start job
    start=$(now)
    lock_lab
    haproxy_down
    pg_down &
    job=$!
    rabbit_down
    wait "$job" || true
    if [ -d "$HA_DIR" ]; then
        if [ -e "$HA_MARKER" ]; then
            rm -rf "$HA_DIR"
        else
            say "left $HA_DIR in place: it is not a lab directory (no $HA_MARKER)"
        fi
    fi
    say "the HA lab is down ($(elapsed "$start") s)"
}

cmd_status() {
    local ok=0
    rabbit_status || ok=1
    haproxy_status || ok=1
    pg_status || ok=1
    return $ok
}

main() {
    local cmd=${1:-}
    [ $# -gt 0 ] && shift
    case "$cmd" in
        -h | --help | help) usage; return 0 ;;
        env) env_lines; return 0 ;;
        "") usage >&2; exit 2 ;;
    esac
    require_root "$cmd" "$@"
    case "$cmd" in
        up) cmd_up ;;
        down) cmd_down ;;
        status) cmd_status || exit 1 ;;  # down is an answer, not a failure to trap
        rabbit-kill) cmd_rabbit_kill "$@" ;;
        rabbit-start) cmd_rabbit_start "$@" ;;
        rabbit-nodes) cmd_rabbit_nodes ;;
        rabbit-leader) cmd_rabbit_leader "$@" ;;
        pg-crash) lock_lab; cmd_pg_crash ;;
        pg-promote) lock_lab; cmd_pg_promote ;;
        pg-rebuild-standby) lock_lab; cmd_pg_rebuild_standby ;;
        pg-primary) cmd_pg_primary ;;
        *) usage >&2; die "unknown command '$cmd'." ;;
    esac
}

main "$@"
