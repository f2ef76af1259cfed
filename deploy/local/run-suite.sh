#!/usr/bin/env bash
# The whole suite, as `make test` runs it: the services and the migrations, then, all at once,
# - the isolated tests in parallel (pytest-xdist; each test has its own database and exchange
#   prefix);
# - beside them, in a process group of their own, the chaos tests (marker `chaos`), which
#   touch nothing but the HA lab (deploy/local/ha) and its own nodes: they start once the lab,
#   booting in the background (about 30 s), is up;
# then the tests that stop or restart a shared service or run another release beside this one
# (marker `serial`) alone, so they never pull a service from under a neighbour; beside them,
# in a process of their own, the static checks (`make check`: formatting, lint, strict typing,
# the layers, the deploy checks, the docs), whose log is printed at the end. The serial tests
# mostly wait for services to stop and start, so the checks' CPU costs the run less there than
# beside the parallel part (2 cores).
#
# The lab is removed once the chaos tests are done, if this run made it (PKGQ_HA_KEEP=1 keeps
# it). PKGQ_SKIP_LAB=1 neither starts nor removes it: then the chaos tests start it themselves.
#
# Extra pytest arguments pass through to every part (a `-m` or `-n` among them replaces the
# part's own; select by path or -k instead). Fails when the checks or any part fail, or
# when no part ran a test (pytest's exit code 5 for one part alone is fine: a selection may
# hold none).
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=${BIN:-.venv/bin}
make=${MAKE:-make}
# Bytecode caches (git-ignored __pycache__, pytest's rewritten test modules among them) are
# written even where the environment says not to: every pytest process (each worker, the chaos
# and the serial parts) imports the whole suite, and without them each compiles it again
# (collecting it: 9.3 CPU s against 5.2 with the caches).
unset PYTHONDONTWRITEBYTECODE
workers=${PKGQ_TEST_WORKERS:-4}  # 4 on 2 cores: the tests mostly wait on services and processes
lab=deploy/local/ha/lab.sh
# The tests of one message's way from the socket to the ack, run with and without the wire
# accelerator.
delivery_tests=(
    tests/integration/test_message_path.py
    tests/integration/test_consumer_loop.py
    tests/integration/test_take_ahead.py
    tests/integration/test_delivery_redelivery.py
    tests/integration/test_delivery_edge_cases.py
    tests/integration/test_bad_input.py
)

scratch=$(mktemp -d -t pkgq-suite.XXXXXX)
lab_log=$scratch/lab.log
lab_rc=$scratch/lab.rc
chaos_log=$scratch/chaos.log
check_log=$scratch/check.log
lab_pid=
lab_started=0
chaos_pid=
check_pid=
finish() {
    if [ -n "${plain_pid:-}" ] && kill -0 "$plain_pid" 2>/dev/null; then
        kill "$plain_pid" 2>/dev/null
        wait "$plain_pid" 2>/dev/null
    fi
    # Interrupted while the chaos tests run: stop them first (they tear their processes down
    # and repair the lab), and only then remove the lab.
    if [ -n "$chaos_pid" ] && kill -0 "$chaos_pid" 2>/dev/null; then
        kill -INT -- "-$chaos_pid" 2>/dev/null
        wait "$chaos_pid" 2>/dev/null
    fi
    if [ -n "$check_pid" ] && kill -0 "$check_pid" 2>/dev/null; then
        kill "$check_pid" 2>/dev/null
        wait "$check_pid" 2>/dev/null
    fi
    if [ -n "$lab_pid" ]; then wait "$lab_pid" 2>/dev/null; fi
    if [ "$lab_started" = 1 ] && [ "${PKGQ_HA_KEEP:-0}" != 1 ]; then
        "$lab" down >>"$lab_log" 2>&1 || { echo "run-suite: '$lab down' failed:" >&2; tail -20 "$lab_log" >&2; }
    fi
    rm -rf "$scratch"
}
trap finish EXIT
trap 'exit 130' INT TERM  # an interrupt ends the run now (finish stops what still runs)
# The services and Debian tools first (apt-get, if anything is missing), then the lab beside them.
"$make" --no-print-directory services || exit $?
if [ "${PKGQ_SKIP_LAB:-0}" != 1 ]; then
    # A lab made before (its state directory's marker), healthy or not, is left in place.
    if [ ! -e "${PKGQ_HA_DIR:-/var/tmp/pkgq-ha}/.pkgq-ha-lab" ]; then lab_started=1; fi
    ( "$lab" up >"$lab_log" 2>&1; echo $? >"$lab_rc" ) &
    lab_pid=$!
else
    echo 0 >"$lab_rc"
fi

# What `make migrate` does once the services are up (they are: just above).
"$bin/pkgq" migrate || exit $?

# A process group of its own (setsid), so that an interrupt is handed to it by finish, in order;
# it waits for the lab's boot to end (up or not: a chaos test boots a missing lab itself), and
# removes the lab when its tests are done, if this run made it, while the parallel part still
# runs (finish removes it again, a no-op by then, in case the group was interrupted).
remove_lab=0
if [ "$lab_started" = 1 ] && [ "${PKGQ_HA_KEEP:-0}" != 1 ]; then remove_lab=1; fi
setsid bash -c 'rc_file=$1 remove=$2 lab=$3 log=$4; shift 4
    while [ ! -s "$rc_file" ]; do sleep 0.5; done
    "$@"; rc=$?
    if [ "$remove" = 1 ]; then "$lab" down >>"$log" 2>&1; fi
    exit "$rc"' \
    chaos-beside "$lab_rc" "$remove_lab" "$lab" "$lab_log" "$bin/pytest" -m chaos "$@" \
    >"$chaos_log" 2>&1 &
chaos_pid=$!
started=$SECONDS
# The delivery tests again without the wire accelerator (infra/rabbit/wire/), beside the
# parallel part: aiormq's own frame paths must give the same results.
plain_log=$scratch/plain.log
plain_pid=
if [ $# -eq 0 ]; then
    PKGQ_WIRE_ACCELERATOR=false "$bin/pytest" -n 2 -p no:cacheprovider \
        -m "not serial and not chaos" "${delivery_tests[@]}" >"$plain_log" 2>&1 &
    plain_pid=$!
fi
"$bin/pytest" -n "$workers" -m "not serial and not chaos" "$@"
parallel=$?
if [ -n "$plain_pid" ]; then
    wait "$plain_pid"
    plain=$?
    plain_pid=
    echo "run-suite: the delivery tests without the wire accelerator (PKGQ_WIRE_ACCELERATOR=false):"
    tail -3 "$plain_log"
    if [ "$plain" -ne 0 ]; then
        cat "$plain_log"
        parallel=$plain
    fi
fi
parallel_s=$((SECONDS - started))
wait "$chaos_pid"
chaos=$?
chaos_pid=
chaos_waited_s=$((SECONDS - started - parallel_s))
if [ -n "$lab_pid" ]; then
    wait "$lab_pid"
    lab_pid=
    if [ "$(cat "$lab_rc")" != 0 ]; then
        echo "run-suite: the HA lab did not come up in the background (the chaos tests tried again):" >&2
        tail -20 "$lab_log" >&2
    fi
fi
echo "run-suite: the chaos tests, run beside the parallel part:"
cat "$chaos_log"
"$make" --no-print-directory check >"$check_log" 2>&1 &
check_pid=$!
started=$SECONDS
"$bin/pytest" -m serial "$@"
serial=$?
serial_s=$((SECONDS - started))
wait "$check_pid"
check=$?
check_pid=
check_waited_s=$((SECONDS - started - serial_s))
echo "run-suite: the static checks, run beside the serial tests:"
cat "$check_log"
# Where the wall time went: make test has 8 minutes on a 2-core machine.
# The waits: for the chaos tests after the parallel part, for the checks after the serial part.
echo "run-suite: seconds: parallel part $parallel_s (then waited $chaos_waited_s for the chaos" \
    "tests), serial part $serial_s (then waited $check_waited_s for the checks), whole run $SECONDS"

if [ "$check" -ne 0 ]; then
    echo "run-suite: the static checks failed (above)" >&2
    exit "$check"
fi
for rc in "$parallel" "$chaos" "$serial"; do
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit "$rc"; fi
done
if [ "$parallel" -eq 5 ] && [ "$chaos" -eq 5 ] && [ "$serial" -eq 5 ]; then
    echo "run-suite: no test ran" >&2
    exit 5
fi
exit 0
