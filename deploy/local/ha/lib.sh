# shellcheck shell=bash
# Sourced by lab.sh: the lab's names, ports and directories, and small helpers.
# Everything of the lab lives apart from the development services (RabbitMQ rabbit@localhost on
# 5672/15672/25672, PostgreSQL 15/main on 5432): other node names, other ports, other clusters.

HA_DIR=${PKGQ_HA_DIR:-/var/tmp/pkgq-ha}
HA_DIR=${HA_DIR%/}
case "$HA_DIR" in
    *[[:space:]]*) die "PKGQ_HA_DIR must not contain spaces (it goes into config files): '$HA_DIR'." ;;
    /?*) ;;
    *) die "PKGQ_HA_DIR must be an absolute path other than /: '${PKGQ_HA_DIR:-}'." ;;
esac
HA_MARKER="$HA_DIR/.pkgq-ha-lab"   # down removes HA_DIR only when this file is in it
HA_TIMEOUT=${PKGQ_HA_TIMEOUT:-180} # seconds a node or a cluster may take to come up
HA_STOP_GRACE=${PKGQ_HA_STOP_GRACE:-20} # seconds a node has to stop after SIGTERM, then SIGKILL
case "$HA_STOP_GRACE" in
    '' | *[!0-9]*) die "PKGQ_HA_STOP_GRACE must be a whole number of seconds: '$HA_STOP_GRACE'." ;;
esac

RABBIT_NODES=(1 2 3)
RABBIT_USER_HOME=/var/lib/rabbitmq # holds the Erlang cookie the lab nodes share with the CLI
LB_AMQP_PORT=5680
LB_MGMT_PORT=15680

PG_VERSION=15
# shellcheck disable=SC2034 # used by pg.sh
PG_CLUSTERS=(pkgqha_a pkgqha_b)
PG_DB=pkgq

node_name() { printf 'pkgqha%s@localhost' "$1"; }
amqp_port() { printf '%s' $((5680 + $1)); }
mgmt_port() { printf '%s' $((15680 + $1)); }
dist_port() { printf '%s' $((25680 + $1)); }
node_dir() { printf '%s/rabbit%s' "$HA_DIR" "$1"; }

pg_port() { case "$1" in pkgqha_a) echo 5433 ;; pkgqha_b) echo 5434 ;; *) die "no such lab cluster: $1" ;; esac; }
pg_other() { case "$1" in pkgqha_a) echo pkgqha_b ;; *) echo pkgqha_a ;; esac; }
pg_datadir() { printf '/var/lib/postgresql/%s/%s' "$PG_VERSION" "$1"; }
pg_confdir() { printf '/etc/postgresql/%s/%s' "$PG_VERSION" "$1"; }

# rabbitmqctl as the rabbitmq user (whose HOME holds the Erlang cookie). Not the /usr/sbin
# wrapper: as root it hands the arguments to `su -c` re-quoted, and sh re-reads them ($, \, `).
ctl() {
    (cd "$RABBIT_USER_HOME" && timeout "${CTL_TIMEOUT:-60}" \
        runuser -u rabbitmq -- /usr/lib/rabbitmq/bin/rabbitmqctl "$@")
}

# psql as the postgres superuser over TCP (trust on 127.0.0.1 in the lab's pg_hba.conf).
pg_sql() {
    local port=$1
    shift
    PGCONNECT_TIMEOUT=3 psql -h 127.0.0.1 -p "$port" -U postgres -d "${PGDATABASE_LAB:-postgres}" \
        -v ON_ERROR_STOP=1 -qAtX "$@"
}

require_root() {
    [ "$(id -u)" -eq 0 ] || die "the HA lab starts processes as the rabbitmq and postgres users: run it as root (sudo $0 $*)."
}

# The first of $@ listening on 127.0.0.1 (TCP), or nothing.
port_in_use() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }

# Wait until "$@" succeeds, for at most $1 seconds, trying every 0.2 s.
wait_for() {
    local limit=$1 start
    shift
    start=$SECONDS
    until "$@"; do
        [ $((SECONDS - start)) -lt "$limit" ] || return 1
        sleep 0.2
    done
}

# Seconds since the epoch with a fraction, for timings.
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# Serialises the commands that change the lab (up, down, pg-*): a second one waits its turn.
lock_lab() {
    exec 9>"$HA_DIR.lock" || die "cannot open the lock file $HA_DIR.lock"
    flock -w "$HA_TIMEOUT" 9 || die "another lab.sh up/down/pg-* is still running (lock $HA_DIR.lock held for $HA_TIMEOUT s)."
}

# Run a command that leaves a daemon behind without the lock's descriptor, or the daemon would
# hold the lock for as long as it runs.
nolock() { "$@" 9>&-; }

make_state_dir() {
    if [ -d "$HA_DIR" ] && [ ! -e "$HA_MARKER" ] && [ -n "$(ls -A "$HA_DIR")" ]; then
        die "$HA_DIR exists and is not an HA lab directory: set PKGQ_HA_DIR to an empty or new directory."
    fi
    mkdir -p "$HA_DIR" || die "cannot create $HA_DIR: set PKGQ_HA_DIR to a directory root can create."
    touch "$HA_MARKER"
    chown rabbitmq:rabbitmq "$HA_DIR"
    chmod 755 "$HA_DIR"
    runuser -u rabbitmq -- test -w "$HA_DIR" \
        || die "the rabbitmq user cannot write to $HA_DIR (a parent directory is closed to it?): set PKGQ_HA_DIR to a directory under /var/tmp."
    mkdir -p "$HA_DIR/pg" "$HA_DIR/haproxy"
}

env_lines() {
    local nodes=() n
    for n in "${RABBIT_NODES[@]}"; do nodes+=("amqp://guest:guest@127.0.0.1:$(amqp_port "$n")/"); done
    local IFS=,
    cat <<EOF
export PKGQ_HA_AMQP_LB=amqp://guest:guest@127.0.0.1:$LB_AMQP_PORT/
export PKGQ_HA_AMQP_NODES=${nodes[*]}
export PKGQ_HA_MANAGEMENT=http://guest:guest@127.0.0.1:$LB_MGMT_PORT/
export PKGQ_HA_POSTGRES_DSN=postgresql://postgres@127.0.0.1:$(pg_port pkgqha_a),127.0.0.1:$(pg_port pkgqha_b)/$PG_DB?target_session_attrs=read-write
export PKGQ_HA_DIR=$HA_DIR
EOF
}
