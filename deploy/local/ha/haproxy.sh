# shellcheck shell=bash
# Sourced by lab.sh: haproxy in front of the three nodes, as a daemon of its own (not the
# Debian service, which stays as it is): 127.0.0.1:5680 for AMQP, 127.0.0.1:15680 for the
# management API; its statistics (CSV: http://127.0.0.1:15690/;csv) on 127.0.0.1:15690.

HAPROXY_CFG="$HA_DIR/haproxy/haproxy.cfg"
HAPROXY_PID="$HA_DIR/haproxy/haproxy.pid"
LB_STATS_PORT=15690

haproxy_config() {
    local n
    cat <<EOF
# HA lab load balancer, written by deploy/local/ha/lab.sh up.
global
    daemon
    user haproxy
    group haproxy
    pidfile $HAPROXY_PID
    maxconn 4096
    stats socket $HA_DIR/haproxy/admin.sock mode 600 level admin

defaults
    mode tcp
    timeout connect 2s
    # Longer than AMQP heartbeats (60 s by default), so idle connections are not cut.
    timeout client 3m
    timeout server 3m
    timeout check 1s
    # A connection sent to a node that just died (not yet marked down) is retried on another.
    retries 3
    option redispatch
    # Checked every 0.5 s: down after 2 failures, up after 2 successes; the clients of a server
    # marked down are disconnected at once instead of waiting for their heartbeats to time out.
    default-server inter 500 fall 2 rise 2 on-marked-down shutdown-sessions

frontend amqp
    bind 127.0.0.1:$LB_AMQP_PORT
    default_backend rabbit_amqp

# Connections are long-lived: leastconn spreads them better than roundrobin after a node returns.
backend rabbit_amqp
    balance leastconn
    option tcp-check
EOF
    for n in "${RABBIT_NODES[@]}"; do
        echo "    server pkgqha$n 127.0.0.1:$(amqp_port "$n") check"
    done
    cat <<EOF

listen stats
    mode http
    bind 127.0.0.1:$LB_STATS_PORT
    timeout client 10s
    stats enable
    stats uri /

frontend management
    bind 127.0.0.1:$LB_MGMT_PORT
    default_backend rabbit_management

backend rabbit_management
    balance roundrobin
    option tcp-check
EOF
    for n in "${RABBIT_NODES[@]}"; do
        echo "    server pkgqha$n 127.0.0.1:$(mgmt_port "$n") check"
    done
}

# The pid of the lab's haproxy (master of the daemon), if it runs.
haproxy_pid() {
    local p
    [ -s "$HAPROXY_PID" ] || return 1
    for p in $(<"$HAPROXY_PID"); do
        if [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = /usr/sbin/haproxy ] \
            && tr '\0' '\n' 2>/dev/null <"/proc/$p/cmdline" | grep -qxF "$HAPROXY_CFG"; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

# Every haproxy process started from the lab's config file (a pid file can be stale).
haproxy_all_pids() {
    local p
    for p in $(pgrep -x haproxy); do
        if tr '\0' '\n' 2>/dev/null <"/proc/$p/cmdline" | grep -qxF "$HAPROXY_CFG"; then echo "$p"; fi
    done
}

haproxy_install() {
    command -v haproxy >/dev/null 2>&1 && return 0
    say "installing haproxy from Debian's packages"
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null 2>&1 \
        || { DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 \
            && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null 2>&1; }; } \
        || die "haproxy is not installed and apt-get failed: run 'apt-get update && apt-get install haproxy', then '$0 up' again."
}

haproxy_up() {
    local new old pid
    haproxy_install
    new=$(haproxy_config)
    old=$(cat "$HAPROXY_CFG" 2>/dev/null || true)
    if pid=$(haproxy_pid) && [ "$new" = "$old" ]; then return 0; fi
    printf '%s\n' "$new" >"$HAPROXY_CFG.new"
    haproxy -c -q -f "$HAPROXY_CFG.new" >/dev/null 2>"$HA_DIR/haproxy/check.log" \
        || die "the generated haproxy config does not pass 'haproxy -c': see $HA_DIR/haproxy/check.log and $HAPROXY_CFG.new."
    mv "$HAPROXY_CFG.new" "$HAPROXY_CFG"
    if [ -n "${pid:-}" ]; then
        say "reloading haproxy (its config changed)"
        nolock haproxy -f "$HAPROXY_CFG" -p "$HAPROXY_PID" -sf "$pid" 2>>"$HA_DIR/haproxy/start.log" \
            || die "haproxy did not reload: see $HA_DIR/haproxy/start.log."
        return 0
    fi
    local port
    for port in "$LB_AMQP_PORT" "$LB_MGMT_PORT" "$LB_STATS_PORT"; do
        port_in_use "$port" && die "port $port (haproxy of the lab) is taken by another program: see 'ss -ltnp sport = :$port' and stop it."
    done
    say "starting haproxy (AMQP 127.0.0.1:$LB_AMQP_PORT, management 127.0.0.1:$LB_MGMT_PORT, stats 127.0.0.1:$LB_STATS_PORT)"
    nolock haproxy -f "$HAPROXY_CFG" -p "$HAPROXY_PID" 2>>"$HA_DIR/haproxy/start.log" \
        || die "haproxy did not start: see $HA_DIR/haproxy/start.log."
    wait_for 10 haproxy_pid >/dev/null || die "haproxy started but wrote no pid file ($HAPROXY_PID): see $HA_DIR/haproxy/start.log."
}

alive() {
    local p
    for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done
    return 1
}

haproxy_down() {
    local pids
    pids=$(haproxy_all_pids)
    [ -n "$pids" ] || return 0
    say "stopping haproxy"
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    # shellcheck disable=SC2086
    wait_for 5 not alive $pids || kill -KILL $pids 2>/dev/null || true
}

# haproxy's health-check state of node N's AMQP and management servers: "UP UP", "DOWN UP"...
haproxy_node_state() {
    curl -fsS --max-time 2 "http://127.0.0.1:$LB_STATS_PORT/;csv" 2>/dev/null \
        | awk -F, -v s="pkgqha$1" '($1 == "rabbit_amqp" || $1 == "rabbit_management") && $2 == s { printf "%s%s", sep, $18; sep = " " }'
}

haproxy_sees_up() { [ "$(haproxy_node_state "$1")" = "UP UP" ]; }

haproxy_status() {
    local pid n states=()
    if pid=$(haproxy_pid); then
        for n in "${RABBIT_NODES[@]}"; do states+=("$n: $(haproxy_node_state "$n")"); done
        echo "haproxy pid $pid: running (AMQP 127.0.0.1:$LB_AMQP_PORT, management 127.0.0.1:$LB_MGMT_PORT, stats 127.0.0.1:$LB_STATS_PORT); checks of amqp+management: $(printf '%s; ' "${states[@]}" | sed 's/; $//')"
    else
        echo "haproxy: down"
        return 1
    fi
}
