#!/usr/bin/env bash
# The whole suite, as `make test` runs it: the isolated tests in parallel (pytest-xdist; each test
# has its own database and exchange prefix), then the tests that stop or restart a shared service
# (marker `serial`) alone, so they never pull a service from under a parallel neighbour.
# Extra pytest arguments pass through to both parts. Fails when either part fails, or when
# neither ran a test (pytest's exit code 5 for one part alone is fine: a selection may hold none).
set -uo pipefail
bin=${BIN:-.venv/bin}
workers=${PKGQ_TEST_WORKERS:-3}

"$bin/pytest" -n "$workers" -m "not serial" "$@"
parallel=$?
"$bin/pytest" -m serial "$@"
serial=$?

for rc in "$parallel" "$serial"; do
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit "$rc"; fi
done
if [ "$parallel" -eq 5 ] && [ "$serial" -eq 5 ]; then
    echo "run-suite: no test ran" >&2
    exit 5
fi
exit 0
