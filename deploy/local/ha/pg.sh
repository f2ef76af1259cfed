# shellcheck shell=bash
# Sourced by lab.sh: PostgreSQL 15 clusters pkgqha_a (5433) and pkgqha_b (5434), made with
# Debian's postgresql-common: one primary, one synchronous streaming standby. Which one is the
# primary is kept in $HA_DIR/pg/primary (pkgqha_a at first); after pg-promote the old primary is
# named in $HA_DIR/pg/stale until pg-rebuild-standby (or up) makes it a standby again.
#
# synchronous_standby_names lives in conf.d/pkgq-ha-sync.conf of the primary only (never in
# postgresql.auto.conf, which pg_basebackup would copy to the standby): a promoted standby has
# none, so its writes do not wait for a standby it does not have.

PG_STATE="$HA_DIR/pg"
HERE=${HERE:-$(dirname "${BASH_SOURCE[0]}")}

pg_exists() { [ -f "$(pg_confdir "$1")/postgresql.conf" ]; }
pg_ready() { pg_isready -q -h 127.0.0.1 -p "$(pg_port "$1")" -t 2 2>/dev/null; }
pg_in_recovery() { pg_sql "$(pg_port "$1")" -c 'select pg_is_in_recovery()' 2>/dev/null; }
pg_ctl() { nolock pg_ctlcluster --skip-systemctl-redirect "$PG_VERSION" "$@"; }
pg_log() { printf '/var/log/postgresql/postgresql-%s-%s.log' "$PG_VERSION" "$1"; }

pg_recorded_primary() { cat "$PG_STATE/primary" 2>/dev/null || echo pkgqha_a; }
pg_stale() { cat "$PG_STATE/stale" 2>/dev/null || true; }

pg_write_conf() {
    local name=$1 conf
    conf=$(pg_confdir "$name")
    mkdir -p "$conf/conf.d"
    cat >"$conf/conf.d/pkgq-ha.conf" <<'EOF'
# HA lab settings, written by deploy/local/ha/lab.sh (the same on both clusters).
listen_addresses = '127.0.0.1'
wal_level = replica
max_wal_senders = 10
max_replication_slots = 10
wal_keep_size = '256MB'
hot_standby = on
synchronous_commit = on
wal_log_hints = on
# A standby whose primary went away retries every second, not every 5 s.
wal_retrieve_retry_interval = '1s'
EOF
    cat >"$conf/pg_hba.conf" <<'EOF'
# HA lab, written by deploy/local/ha/lab.sh: trust on 127.0.0.1 for every user, replication too.
local   all           all                     peer
local   replication   all                     peer
host    all           all           127.0.0.1/32   trust
host    replication   all           127.0.0.1/32   trust
EOF
    chown -R postgres:postgres "$conf"
}

# synchronous_standby_names = '*' on (primary) or off (anything else); reloads a running cluster.
pg_set_sync() {
    local name=$1 want=$2 file
    file="$(pg_confdir "$name")/conf.d/pkgq-ha-sync.conf"
    if [ "$want" = on ]; then
        [ -f "$file" ] && return 0
        printf "# Only on the primary (deploy/local/ha/lab.sh): commits wait for the standby.\nsynchronous_standby_names = '*'\n" >"$file"
        chown postgres:postgres "$file"
    else
        [ -f "$file" ] || return 0
        rm -f "$file"
    fi
    if pg_ready "$name"; then pg_sql "$(pg_port "$name")" -c 'select pg_reload_conf()' >/dev/null; fi
}

pg_start() {
    local name=$1
    if ! pg_ready "$name"; then
        say "starting PostgreSQL 15/$name (port $(pg_port "$name"))"
        pg_ctl "$name" start >/dev/null 2>&1 || pg_ready "$name" \
            || die "could not start PostgreSQL 15/$name: see $(pg_log "$name")."
        wait_for 60 pg_ready "$name" || die "PostgreSQL 15/$name does not accept connections on port $(pg_port "$name"): see $(pg_log "$name")."
    fi
}

pg_create() {
    local name=$1 port
    port=$(pg_port "$name")
    port_in_use "$port" && die "port $port (PostgreSQL 15/$name of the lab) is taken by another program: see 'ss -ltnp sport = :$port'."
    say "creating PostgreSQL cluster 15/$name on port $port"
    pg_createcluster "$PG_VERSION" "$name" --port "$port" >>"$PG_STATE/create.log" 2>&1 \
        || die "pg_createcluster $PG_VERSION $name failed: see $PG_STATE/create.log."
    pg_write_conf "$name"
}

pg_create_primary() {
    local name=$1
    pg_create "$name"
    pg_set_sync "$name" off
    pg_start "$name"
    echo "$name" >"$PG_STATE/primary"
}

# The database and pkgq's roles, as deploy/local/ensure-services.sh makes them on the dev cluster.
pg_ensure_db() {
    local port
    port=$(pg_port "$1")
    if [ "$(pg_sql "$port" -c "select count(*) from pg_database where datname = '$PG_DB'")" != 1 ]; then
        say "creating database $PG_DB on 15/$1"
        pg_sql "$port" -c "create database $PG_DB owner postgres" >/dev/null || die "could not create database $PG_DB on port $port."
    fi
    if [ "$(pg_sql "$port" -c "select count(*) from pg_roles where rolname in ('pkgq_owner', 'pkgq_runtime')")" != 2 ]; then
        say "creating roles pkgq_owner and pkgq_runtime on 15/$1 (deploy/local/roles.sql)"
        pg_sql "$port" -v owner=pkgq_owner -v runtime=pkgq_runtime -v db="$PG_DB" -f "$HERE/../roles.sql" >/dev/null \
            || die "could not create pkgq's roles on port $port (deploy/local/roles.sql)."
        PGDATABASE_LAB=$PG_DB pg_sql "$port" -v owner=pkgq_owner -f "$HERE/../handover.sql" >/dev/null \
            || die "could not hand database $PG_DB to pkgq_owner on port $port (deploy/local/handover.sql)."
    fi
}

# Make NAME a fresh streaming standby of PRIMARY: empty its data directory, pg_basebackup -R.
pg_make_standby() {
    local name=$1 primary=$2 data
    data=$(pg_datadir "$name")
    pg_exists "$name" || pg_create "$name"
    pg_write_conf "$name"
    pg_set_sync "$name" off
    if pg_ready "$name" || [ -f "$data/postmaster.pid" ]; then pg_ctl "$name" stop -m immediate >/dev/null 2>&1 || true; fi
    say "copying 15/$primary into 15/$name (pg_basebackup)"
    install -d -o postgres -g postgres -m 700 "$data"
    runuser -u postgres -- find "$data" -mindepth 1 -delete || die "could not empty $data."
    (cd / && runuser -u postgres -- pg_basebackup -h 127.0.0.1 -p "$(pg_port "$primary")" -U postgres \
        -D "$data" -R -X stream -c fast) >>"$PG_STATE/basebackup.log" 2>&1 \
        || die "pg_basebackup from 15/$primary into 15/$name failed: see $PG_STATE/basebackup.log."
    pg_start "$name"
}

pg_streaming() {
    [ "$(pg_sql "$(pg_port "$1")" -c "select count(*) from pg_stat_replication where state = 'streaming'" 2>/dev/null)" -ge 1 ] 2>/dev/null
}

pg_sync_ok() {
    [ "$(pg_sql "$(pg_port "$1")" -c "select count(*) from pg_stat_replication where sync_state = 'sync'" 2>/dev/null)" -ge 1 ] 2>/dev/null
}

# Once the standby streams, make the primary's commits wait for it.
pg_sync_on() {
    local primary=$1
    wait_for 60 pg_streaming "$primary" \
        || die "no standby streams from 15/$primary after 60 s: see $(pg_log "$(pg_other "$primary")")."
    pg_set_sync "$primary" on
    wait_for 20 pg_sync_ok "$primary" || die "the standby of 15/$primary streams but is not synchronous after 20 s."
}

pg_up() {
    local primary standby
    primary=$(pg_recorded_primary)
    standby=$(pg_other "$primary")
    if ! pg_exists "$primary"; then
        pg_exists "$standby" && die "15/$standby exists without the primary 15/$primary: run '$0 down' then '$0 up'."
        pg_create_primary "$primary"
    fi
    pg_start "$primary"
    [ "$(pg_in_recovery "$primary")" = f ] \
        || die "15/$primary, recorded as the primary in $PG_STATE/primary, is in recovery: run '$0 down' then '$0 up'."
    pg_ensure_db "$primary"
    if ! pg_exists "$standby" || [ "$(pg_stale)" = "$standby" ] || [ ! -f "$(pg_datadir "$standby")/standby.signal" ]; then
        pg_make_standby "$standby" "$primary"
        rm -f "$PG_STATE/stale"
    else
        pg_set_sync "$standby" off
        pg_start "$standby"
    fi
    pg_sync_on "$primary"
}

pg_require() {
    if [ ! -e "$HA_MARKER" ] || ! pg_exists "$(pg_recorded_primary)"; then die "the lab is not set up: run '$0 up' first."; fi
}

cmd_pg_crash() {
    pg_require
    local primary
    primary=$(pg_recorded_primary)
    pg_ready "$primary" || die "the primary 15/$primary (port $(pg_port "$primary")) is not running: nothing to crash."
    pg_ctl "$primary" stop -m immediate >/dev/null 2>&1 \
        || die "pg_ctlcluster $PG_VERSION $primary stop -m immediate failed: see $(pg_log "$primary")."
    say "crashed the primary 15/$primary (port $(pg_port "$primary"), stop -m immediate)"
}

pg_writable() {
    [ "$(pg_in_recovery "$1")" = f ] \
        && timeout 5 env PGOPTIONS='-c statement_timeout=4000' psql -h 127.0.0.1 -p "$(pg_port "$1")" -U postgres -d "$PG_DB" \
            -qAtX -c 'select txid_current()' >/dev/null 2>&1
}

cmd_pg_promote() {
    pg_require
    local old new start
    start=$(now)
    old=$(pg_recorded_primary)
    new=$(pg_other "$old")
    pg_ready "$new" || die "the standby 15/$new (port $(pg_port "$new")) is not running: nothing to promote ('$0 up' restarts it)."
    [ "$(pg_in_recovery "$new")" = t ] || die "15/$new is not a standby: nothing to promote ('$0 pg-primary' shows the primary)."
    if pg_ready "$old"; then
        # Never two primaries: the multi-host DSN would keep writing to the first one listed.
        say "the primary 15/$old still runs: stopping it (immediate) before promoting 15/$new"
        pg_ctl "$old" stop -m immediate >/dev/null 2>&1 || die "could not stop 15/$old: see $(pg_log "$old")."
    fi
    pg_set_sync "$new" off
    pg_ctl "$new" promote >/dev/null 2>&1 || die "pg_ctlcluster $PG_VERSION $new promote failed: see $(pg_log "$new")."
    echo "$new" >"$PG_STATE/primary"
    echo "$old" >"$PG_STATE/stale"
    wait_for 30 pg_writable "$new" || die "15/$new was promoted but takes no writes after 30 s: see $(pg_log "$new")."
    say "promoted 15/$new (port $(pg_port "$new")) in $(elapsed "$start") s; 15/$old is stale until '$0 pg-rebuild-standby'"
    pg_port "$new"
}

cmd_pg_rebuild_standby() {
    pg_require
    local primary standby start
    start=$(now)
    primary=$(pg_recorded_primary)
    standby=$(pg_other "$primary")
    { pg_ready "$primary" && [ "$(pg_in_recovery "$primary")" = f ]; } \
        || die "the primary 15/$primary (port $(pg_port "$primary")) is not running as a primary: run '$0 pg-promote' or '$0 up' first."
    pg_make_standby "$standby" "$primary"
    rm -f "$PG_STATE/stale"
    pg_sync_on "$primary"
    say "15/$standby (port $(pg_port "$standby")) is a synchronous standby of 15/$primary again, in $(elapsed "$start") s"
    pg_port "$standby"
}

cmd_pg_primary() {
    local name found=()
    for name in "${PG_CLUSTERS[@]}"; do
        pg_ready "$name" && [ "$(pg_in_recovery "$name")" = f ] && found+=("$name")
    done
    case ${#found[@]} in
        1) pg_port "${found[0]}" ;;
        0) die "no lab PostgreSQL primary is running (the recorded one is 15/$(pg_recorded_primary)): run '$0 pg-promote' or '$0 up'." ;;
        *) die "both lab clusters run as primaries (5433 and 5434): run '$0 pg-rebuild-standby' to make 15/$(pg_other "$(pg_recorded_primary)") a standby again." ;;
    esac
}

pg_down() {
    local name
    for name in "${PG_CLUSTERS[@]}"; do
        if pg_exists "$name"; then
            say "dropping PostgreSQL cluster 15/$name"
            pg_dropcluster --stop "$PG_VERSION" "$name" >/dev/null 2>&1 || pg_ctl "$name" stop -m immediate >/dev/null 2>&1 || true
            pg_dropcluster "$PG_VERSION" "$name" >/dev/null 2>&1 || true
        fi
        # pg_dropcluster leaves conf.d/ (and anything it does not know) behind.
        rm -rf "$(pg_confdir "$name")" "$(pg_datadir "$name")" "$(pg_log "$name")"*
    done
}

pg_status() {
    local name ok=0 port state role repl recorded
    recorded=$(pg_recorded_primary)
    for name in "${PG_CLUSTERS[@]}"; do
        port=$(pg_port "$name")
        if ! pg_exists "$name"; then
            echo "postgres 15/$name port $port: missing"
            ok=1
            continue
        fi
        state=$(pg_lsclusters -h "$PG_VERSION" "$name" 2>/dev/null | awk '{print $4}')
        if ! pg_ready "$name"; then
            echo "postgres 15/$name port $port: ${state:-down}$([ "$name" = "$recorded" ] && echo ' (the recorded primary)')"
            ok=1
            continue
        fi
        case "$(pg_in_recovery "$name")" in
            f)
                repl=$(pg_sql "$port" -c "select coalesce(string_agg(application_name || ' ' || state || ' ' || sync_state, ', '), 'none') from pg_stat_replication")
                role="primary, standbys: $repl"
                [ "$name" = "$recorded" ] && pg_sync_ok "$name" || ok=1
                ;;
            t)
                role="standby"
                [ "$name" != "$recorded" ] || ok=1
                ;;
            *)
                role="not answering queries"
                ok=1
                ;;
        esac
        echo "postgres 15/$name port $port: $state, $role"
    done
    return $ok
}
