"""The relay's invariant watch: the checks `pkgq doctor` runs (infra/postgres/invariants.py),
run periodically, stored for the console, and exported as `pkgq_invariant_violations`.

The relay holding the `invariant_checks` lease runs them (`check_and_export`); every other
relay exports what it stored (`export_stored`), so all relays report the same figures and
an alert takes the max over them. The loop itself is in infra/outbox/housekeeping.py, with the
other lease-guarded jobs.
"""

from __future__ import annotations

import asyncpg
import structlog

from infra.observability import INVARIANT_VIOLATIONS
from infra.postgres import invariants

log = structlog.get_logger(__name__)

LEASE = "invariant_checks"


def export(results: list[invariants.Result]) -> None:
    """pkgq_invariant_violations: one value per check, 0 included (an alert compares with 0)."""
    for result in results:
        INVARIANT_VIOLATIONS.labels(check=result.check).set(result.violations)


async def check_and_export(
    pool: asyncpg.Pool, graces: invariants.Graces = invariants.GRACES
) -> list[invariants.Result]:
    """Run every check, store the results and export them; log each check that found rows,
    naming the first few."""
    async with pool.acquire() as conn:
        results = await invariants.check_and_store(conn, graces=graces)
    export(results)
    for result in results:
        if not result.ok:
            log.error(
                "invariant_violated",
                check=result.check,
                violations=result.violations,
                sample=result.sample[:3],
            )
    return results


async def export_stored(pool: asyncpg.Pool) -> list[invariants.Result]:
    """Export the results the lease holder stored last."""
    async with pool.acquire() as conn:
        results = await invariants.stored(conn)
    export(results)
    return results
