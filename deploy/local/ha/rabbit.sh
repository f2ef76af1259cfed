# shellcheck shell=bash
# Sourced by lab.sh: the three RabbitMQ nodes pkgqha1..3@localhost of the HA lab.
#
# Each node runs Debian's rabbitmq-server as the rabbitmq user, from its own directory
# $HA_DIR/rabbitN (config, enabled plugins, an empty rabbitmq-env.conf so that the dev node's
# /etc/rabbitmq/rabbitmq-env.conf is not read, data, logs, pid file). They share the Erlang cookie
# of /var/lib/rabbitmq with the dev node and the CLI; sharing a cookie joins nothing by itself.

rabbit_write_files() {
    local n=$1 dir
    dir=$(node_dir "$n")
    mkdir -p "$dir/data" "$dir/log" "$dir/conf.d"
    # Partition handling. Three nodes on one machine do not partition the way three machines do:
    # what the chaos tests do is SIGKILL a node and start it again. After such a kill and restart
    # the cluster can record a partition in which every node still sees a majority, so
    # pause_minority pauses no one and the cluster stays split: clients on the wrong side see
    # their publisher confirms time out instead of a closed connection. autoheal settles any
    # recorded partition: the side with the most client connections wins and the nodes of the
    # other side restart, which closes their clients' connections, so clients reconnect
    # (through haproxy) instead of hanging. Quorum queues are Raft and stay consistent whichever
    # mode is chosen; the mode only decides how the cluster recovers, and autoheal is the one that
    # always recovers without an operator here.
    cat >"$dir/rabbitmq.conf" <<EOF
# HA lab node $(node_name "$n"), written by deploy/local/ha/lab.sh up (rewritten on each up).
cluster_name = pkgq-ha
listeners.tcp.default = 127.0.0.1:$(amqp_port "$n")
management.tcp.ip = 127.0.0.1
management.tcp.port = $(mgmt_port "$n")
cluster_partition_handling = autoheal
log.file.level = info
log.console = false
EOF
    # At-least-once dead-lettering: a quorum queue's dead-letter worker sends a dead letter again
    # when the target queue has not confirmed it within this many ms. RabbitMQ's default is
    # 180000: a dead letter whose confirm was lost with a killed node then reaches
    # pkgq.dead_letters 3 minutes late. The lab uses the value deploy/rabbitmq/advanced.config
    # recommends (a copy sent again is filed once: the ingester's store dedups).
    cp "$HERE/../../rabbitmq/advanced.config" "$dir/advanced.config"
    echo '[rabbitmq_management,rabbitmq_consistent_hash_exchange].' >"$dir/enabled_plugins"
    : >"$dir/rabbitmq-env.conf"
    chown -R rabbitmq:rabbitmq "$dir"
}

rabbit_registered() { epmd -names 2>/dev/null | grep -q "^name pkgqha$1 at port "; }

# Pids of node N's beam.smp (normally one): the rabbitmq user's beam processes whose environment
# names the node, so that the dev node and other nodes are never matched.
rabbit_pids() {
    local name p
    name=$(node_name "$1")
    for p in $(pgrep -u rabbitmq -x beam.smp); do
        if tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qx "RABBITMQ_NODENAME=$name"; then echo "$p"; fi
    done
}

# A process and all its descendants (erl_child_setup, inet_gethost, port programs).
process_tree() {
    local p c
    for p in "$@"; do
        echo "$p"
        for c in $(pgrep -P "$p"); do process_tree "$c"; done
    done
}

# Start node N in the background unless it is already registered with epmd (running or booting).
rabbit_launch() {
    local n=$1 dir name port
    dir=$(node_dir "$n")
    name=$(node_name "$n")
    rabbit_registered "$n" && return 0
    for port in "$(amqp_port "$n")" "$(mgmt_port "$n")" "$(dist_port "$n")"; do
        port_in_use "$port" && die "port $port (for $name) is taken by another program: see 'ss -ltnp sport = :$port' and stop it, or run '$0 down' if it is a leftover of the lab."
    done
    rabbit_write_files "$n"
    say "starting $name (AMQP $(amqp_port "$n"), management $(mgmt_port "$n"))"
    # The /usr/sbin wrapper resets the environment, so run the real script as the rabbitmq user.
    (cd "$RABBIT_USER_HOME" && nolock runuser -u rabbitmq -- env -i \
        HOME="$RABBIT_USER_HOME" PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 LC_ALL=C.UTF-8 \
        RABBITMQ_NODENAME="$name" \
        RABBITMQ_NODE_PORT="$(amqp_port "$n")" \
        RABBITMQ_DIST_PORT="$(dist_port "$n")" \
        RABBITMQ_MNESIA_BASE="$dir/data" \
        RABBITMQ_LOG_BASE="$dir/log" \
        RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
        RABBITMQ_CONFIG_FILES="$dir/conf.d" \
        RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config" \
        RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
        RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf" \
        RABBITMQ_PID_FILE="$dir/pid" \
        ERL_EPMD_ADDRESS=127.0.0.1 \
        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS='-kernel inet_dist_use_interface {127,0,0,1}' \
        /usr/lib/rabbitmq/bin/rabbitmq-server -detached) >>"$dir/log/launch.log" 2>&1 \
        || die "could not start $name: see $dir/log/launch.log and $dir/log/$name.log."
}

# Wait until node N has booted (rabbit_running), at most $2 seconds; fail at once if it exits.
rabbit_await() {
    local n=$1 limit=$2 name dir start
    name=$(node_name "$n")
    dir=$(node_dir "$n")
    start=$SECONDS
    # Registered first (a quick epmd check), then booted: its management API answers and its
    # AMQP port listens.
    wait_for "$limit" rabbit_registered "$n" \
        || die "$name did not register with epmd within $limit s: see $dir/log/$name.log and $dir/log/launch.log."
    local left=$((limit - (SECONDS - start)))
    [ "$left" -gt 5 ] || left=5
    wait_for "$left" rabbit_booted_or_gone "$n" \
        || die "$name did not finish booting within $limit s (a node that was not the last one stopped waits for its peers): see $dir/log/$name.log."
    rabbit_registered "$n" || die "$name exited while booting: see $dir/log/$name.log."
}

# Whether node N runs (rabbit_running), or has left epmd (its VM exited: no use waiting).
rabbit_booted_or_gone() { rabbit_running "$1" || ! rabbit_registered "$1"; }

# Node N's own view, two lines: the cluster members, the running members (as node numbers).
# Nothing, and status 1, when the node's management API does not answer within
# CTL_TIMEOUT s (15): the node is down, still booting, or its rabbit app is stopped or paused
# (the management listener runs only while the rabbit app does). `running` there is
# rabbit_nodes:all_running()'s; disable_stats keeps the call on node N alone (no peer's stats).
# curl and jq cost a few milliseconds, where each rabbitmqctl call is an Erlang VM of its own
# and about a CPU second (13 calls, 11.3 CPU s, in one run of the chaos tests before).
rabbit_view() {
    local out all run
    rabbit_registered "$1" || return 1
    out=$(curl -fsS --max-time "${CTL_TIMEOUT:-15}" -u guest:guest \
        "http://127.0.0.1:$(mgmt_port "$1")/api/nodes?columns=name,running&disable_stats=true" 2>/dev/null \
        | jq -r '(map(.name) | join(" ")), (map(select(.running) | .name) | join(" "))' 2>/dev/null) \
        || return 1
    { read -r all; read -r run; } <<<"$out"
    printf '%s\n%s\n' "$(node_numbers "$all")" "$(node_numbers "$run")"
}

# rabbit_view, asked up to 5 times a second apart while it fails.
rabbit_view_again() {
    local try
    for try in 1 2 3 4 5; do
        rabbit_view "$1" && return 0
        [ "$try" -eq 5 ] || sleep 1
    done
    return 1
}

# "pkgqha3@localhost pkgqha1@localhost" -> "1 3"
node_numbers() { grep -o 'pkgqha[0-9]@localhost' <<<"$1" | cut -c7 | sort -n | paste -sd' ' -; }

# Whether node N's rabbit app runs and takes AMQP connections (false while booting, stopped or
# paused). RabbitMQ 3.10 starts its plugins, the management API among them, before its AMQP
# listener, hence the port.
rabbit_running() { rabbit_view "$1" >/dev/null && port_in_use "$(amqp_port "$1")"; }

# Join nodes $2... to node $1's cluster. Each must run and be alone in its own cluster.
# stop_app takes ~5 s (the management agent's stop), so the nodes stop and start in parallel;
# only join_cluster itself, quick with the app stopped, goes one node at a time.
rabbit_join() {
    local seed=$1 n name own jobs=()
    shift
    for n in "$@"; do
        own=$(rabbit_view_again "$n" | sed -n 1p) \
            || die "could not ask $(node_name "$n") which cluster it is in: see $(node_dir "$n")/log/$(node_name "$n").log."
        [ "$own" = "$n" ] \
            || die "$(node_name "$n") is clustered with nodes '$own', not with $(node_name "$seed"): run '$0 down' and '$0 up' to rebuild the lab."
        say "joining $(node_name "$n") to the cluster of $(node_name "$seed")"
    done
    for n in "$@"; do
        name=$(node_name "$n")
        { ctl -q -n "$name" stop_app && ctl -q -n "$name" reset; } >>"$(node_dir "$n")/log/join.log" 2>&1 &
        jobs+=($!)
    done
    for n in "${jobs[@]}"; do wait "$n" || die "could not stop and reset a node to join it: see $HA_DIR/rabbit*/log/join.log."; done
    for n in "$@"; do
        ctl -q -n "$(node_name "$n")" join_cluster "$(node_name "$seed")" >>"$(node_dir "$n")/log/join.log" 2>&1 \
            || die "could not join $(node_name "$n") to $(node_name "$seed"): see $(node_dir "$n")/log/join.log and $(node_dir "$n")/log/$(node_name "$n").log."
    done
    jobs=()
    for n in "$@"; do
        ctl -q -n "$(node_name "$n")" start_app >>"$(node_dir "$n")/log/join.log" 2>&1 &
        jobs+=($!)
    done
    for n in "${jobs[@]}"; do wait "$n" || die "a node did not start after joining: see $HA_DIR/rabbit*/log/join.log."; done
}

# Bring the three nodes up and clustered; quick when they already are.
rabbit_up() {
    local n pids=() members
    if [ "$(rabbit_view 1 | tr '\n' /)" = "1 2 3/1 2 3/" ]; then return 0; fi
    for n in "${RABBIT_NODES[@]}"; do rabbit_launch "$n"; done
    # Booting in parallel: all three wait here together.
    for n in "${RABBIT_NODES[@]}"; do rabbit_await "$n" "$HA_TIMEOUT" & pids+=($!); done
    for n in "${pids[@]}"; do wait "$n" || exit 1; done
    # A node that has just booted can be slow to answer while the machine is busy (the suite's
    # parallel part starts beside this): asked again, a few times, before giving up.
    members=$(rabbit_view_again 1 | sed -n 1p)
    local outside=()
    for n in 2 3; do
        grep -qw "$n" <<<"$members" || outside+=("$n")
    done
    [ ${#outside[@]} -eq 0 ] || rabbit_join 1 "${outside[@]}"
    wait_for 60 rabbit_all_running \
        || die "the cluster did not show all three nodes running within 60 s ($(rabbit_view 1 | tr '\n' '/')): see $HA_DIR/rabbit*/log/."
}

rabbit_all_running() { [ "$(rabbit_view 1 | sed -n 2p)" = "1 2 3" ]; }

rabbit_check_n() {
    case "${1:-}" in 1 | 2 | 3) ;; *) die "usage: $0 ${2:-rabbit-...} N [N...] where N is 1, 2 or 3 (got '${1:-}')." ;; esac
}

cmd_rabbit_kill() {
    [ $# -gt 0 ] || die "usage: $0 rabbit-kill N [N...] (N = 1, 2 or 3)"
    local n pids all
    for n in "$@"; do rabbit_check_n "$n" rabbit-kill; done
    for n in "$@"; do
        pids=$(rabbit_pids "$n")
        [ -n "$pids" ] || die "$(node_name "$n") is not running: nothing to kill (start it with '$0 rabbit-start $n')."
        # shellcheck disable=SC2086 # pids are words
        all=$(process_tree $pids)
        # shellcheck disable=SC2086
        kill -KILL $all 2>/dev/null || true
        say "killed $(node_name "$n") (pids $(paste -sd' ' - <<<"$all"))"
    done
    for n in "$@"; do
        wait_for 10 not rabbit_registered "$n" \
            || die "$(node_name "$n") is still registered with epmd 10 s after SIGKILL: see 'epmd -names'."
    done
}

not() { ! "$@"; }

cmd_rabbit_start() {
    [ $# -gt 0 ] || die "usage: $0 rabbit-start N [N...] (N = 1, 2 or 3)"
    local n start pids=()
    for n in "$@"; do rabbit_check_n "$n" rabbit-start; done
    [ -e "$HA_MARKER" ] || die "the lab is not set up ($HA_DIR): run '$0 up' first."
    start=$(now)
    for n in "$@"; do rabbit_launch "$n"; done
    for n in "$@"; do rabbit_await "$n" "$HA_TIMEOUT" & pids+=($!); done
    for n in "${pids[@]}"; do wait "$n" || exit 1; done
    # Back in the cluster: its running peers include every other lab node that is running.
    for n in "$@"; do
        wait_for 60 rabbit_rejoined "$n" \
            || die "$(node_name "$n") runs but does not see the other running nodes as running ($(rabbit_view "$n" | tr '\n' '/')): see $(node_dir "$n")/log/."
    done
    # haproxy marks a server up after two good checks (0.5 s apart).
    if haproxy_pid >/dev/null; then
        for n in "$@"; do
            wait_for 10 haproxy_sees_up "$n" || say "warning: haproxy does not see $(node_name "$n") up after 10 s ($(haproxy_node_state "$n"))"
        done
    fi
    say "$(printf 'pkgqha%s@localhost ' "$@")running and clustered"
    elapsed "$start"
    echo
}

rabbit_rejoined() {
    local n=$1 m running
    running=$(rabbit_view "$n" | sed -n 2p)
    grep -qw "$n" <<<"$running" || return 1
    for m in "${RABBIT_NODES[@]}"; do
        [ "$m" = "$n" ] && continue
        rabbit_registered "$m" && ! grep -qw "$m" <<<"$running" && return 1
    done
    return 0
}

cmd_rabbit_nodes() {
    local n out=() tmp
    tmp=$(mktemp -d)
    local jobs=()
    for n in "${RABBIT_NODES[@]}"; do
        (if rabbit_running "$n"; then touch "$tmp/$n"; fi) &
        jobs+=($!)
    done
    for n in "${jobs[@]}"; do wait "$n"; done
    for n in "${RABBIT_NODES[@]}"; do [ -e "$tmp/$n" ] && out+=("$n"); done
    rm -rf "$tmp"
    echo "${out[*]}"
}

# Erlang string literal of $1 (the CLI hands the expression over as Unicode).
erl_string() {
    local s=${1//\\/\\\\}
    printf '"%s"' "${s//\"/\\\"}"
}

cmd_rabbit_leader() {
    local queue=${1:-} vhost=${2:-/} n live='' out
    [ -n "$queue" ] || die "usage: $0 rabbit-leader QUEUE [VHOST]"
    for n in "${RABBIT_NODES[@]}"; do
        if rabbit_running "$n"; then live=$n; break; fi
    done
    [ -n "$live" ] || die "no lab node is running: run '$0 up' or '$0 rabbit-start N'."
    out=$(CTL_TIMEOUT=15 ctl -q -n "$(node_name "$live")" eval "
        R = rabbit_misc:r(unicode:characters_to_binary($(erl_string "$vhost")), queue,
                          unicode:characters_to_binary($(erl_string "$queue"))),
        case rabbit_amqqueue:lookup(R) of
            {ok, Q} -> case amqqueue:get_pid(Q) of
                           {_, Node} when is_atom(Node) -> Node;
                           Pid when is_pid(Pid) -> node(Pid);
                           _ -> no_leader
                       end;
            _ -> not_found
        end." 2>&1) || die "could not ask $(node_name "$live") about queue '$queue': $out"
    case "$out" in
        pkgqha[123]@localhost)
            rabbit_registered "${out:6:1}" \
                || die "queue '$queue' has no live leader: its last leader $out is down (a new one may not be elected yet, or no majority is left)."
            echo "${out:6:1}"
            ;;
        not_found) die "no queue '$queue' in vhost '$vhost'." ;;
        *) die "queue '$queue' in vhost '$vhost' has no live leader or host ($out)." ;;
    esac
}

# Stop every lab node: SIGTERM (the Erlang VM's init:stop, a graceful stop of the node's
# applications, without a CLI VM of its own), then SIGKILL whatever is left after HA_STOP_GRACE
# seconds (lib.sh: PKGQ_HA_STOP_GRACE, 20; counted in whole seconds, as wait_for counts). The
# pids are taken before the signal: an exiting VM's environment can no longer be read, so
# rabbit_pids stops naming it while it still holds its ports.
rabbit_down() {
    local n pids all=() grace=$HA_STOP_GRACE
    for n in "${RABBIT_NODES[@]}"; do
        pids=$(rabbit_pids "$n")
        if [ -n "$pids" ]; then
            say "stopping $(node_name "$n")"
            # shellcheck disable=SC2086 # pids are words
            mapfile -t -O "${#all[@]}" all < <(process_tree $pids)
            # shellcheck disable=SC2086
            kill -TERM $pids 2>/dev/null || true
        fi
    done
    [ ${#all[@]} -eq 0 ] && return 0
    if ! wait_for "$grace" rabbit_none_alive "${all[@]}"; then
        say "SIGKILL to what is left of the lab's nodes (pids $(rabbit_alive_pids "${all[@]}"), $grace s after SIGTERM)"
        # shellcheck disable=SC2046 # pids are words
        kill -KILL $(rabbit_alive_pids "${all[@]}") 2>/dev/null || true
        wait_for 5 rabbit_none_alive "${all[@]}" || say "warning: pids $(rabbit_alive_pids "${all[@]}") outlived SIGKILL"
    fi
    for n in "${RABBIT_NODES[@]}"; do
        wait_for 10 not rabbit_registered "$n" || say "warning: $(node_name "$n") is still registered with epmd"
    done
}

# The pids of $@ that still run as the rabbitmq user (a zombie, or a pid the kernel gave to
# another user's process since, does not count); rabbit_none_alive: whether none does. Named
# apart from haproxy.sh's alive, which lab.sh sources after this file.
rabbit_alive_pids() {
    local p out=()
    for p in "$@"; do
        [ "$(stat -c %U "/proc/$p" 2>/dev/null)" = rabbitmq ] || continue
        [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" = Z ] && continue
        out+=("$p")
    done
    echo "${out[*]}"
}
rabbit_none_alive() { [ -z "$(rabbit_alive_pids "$@")" ]; }

rabbit_status() {
    local n ok=0 view members running label
    for n in "${RABBIT_NODES[@]}"; do
        label="rabbit $(node_name "$n") amqp=$(amqp_port "$n") management=$(mgmt_port "$n")"
        if view=$(rabbit_view "$n"); then
            members=$(sed -n 1p <<<"$view")
            running=$(sed -n 2p <<<"$view")
            echo "$label: running; cluster members: $members; running members: $running"
            [ "$running" = "1 2 3" ] || ok=1
        elif rabbit_registered "$n"; then
            echo "$label: not running (the VM is up; the rabbit app is booting, stopped or paused, or its management API did not answer)"
            ok=1
        else
            echo "$label: down"
            ok=1
        fi
    done
    return $ok
}
