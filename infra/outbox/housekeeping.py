"""Housekeeping: the singleton jobs that ride along with the relays.

Every `housekeeping_interval` seconds each relay tries, job by job, to take the job's lease
(telecom.leases) and runs the job only if it holds it, so with several relays running each job
still runs in one place at a time:
- `expiry_sweep`: re-send the time-expiry trigger of overdue active items (infra/outbox/sweep.py);
- `retention`: prune what is past retention (infra/postgres/retention.py).
A lease lasts three intervals and is renewed on every round by its holder; when the holder stops
or is reaped, the lease is free at once. A failing job is logged and tried again next round: it is
never fatal to the relay.

Beside them, on its own interval (`invariant_check_interval`, 0: off), the invariant checks
(infra/outbox/invariant_watch.py) run under their lease the same way; a relay that does not hold
it exports the results the holder stored, so every relay reports the same figures.

And every TREND_TICK seconds, without a lease, this minute's trend snapshot
(infra/postgres/trends.py): one statement that writes only the first time it runs in a minute,
whichever relay runs it, so a snapshot opens each minute within a few seconds of its start.

Without a worker id (a relay that was not started by `services()`), the jobs run without a lease:
both are safe to run concurrently, the lease only saves duplicate work.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from uuid import UUID

import asyncpg
import structlog

from infra.outbox import invariant_watch
from infra.outbox.sweep import sweep_overdue_expiries
from infra.postgres import leases, retention, trends
from infra.postgres.check_base import Graces
from infra.settings import Settings
from infra.transient import is_transient, needs_operator

log = structlog.get_logger(__name__)

EXPIRY_SWEEP = "expiry_sweep"
RETENTION = "retention"
TRENDS = "trend_snapshot"
TREND_TICK = 5.0
"""Seconds between two tries at this minute's trend snapshot (a no-op once it is taken)."""


async def housekeeping_forever(
    settings: Settings, pool: asyncpg.Pool, worker_id: UUID | None, stop: asyncio.Event
) -> None:
    """Run the lease-guarded jobs every `settings.housekeeping_interval`, the invariant checks
    every `settings.invariant_check_interval` and the trend snapshot every minute, until `stop`
    is set."""
    async with asyncio.TaskGroup() as loops:
        loops.create_task(_jobs_forever(settings, pool, worker_id, stop))
        loops.create_task(_invariants_forever(settings, pool, worker_id, stop))
        loops.create_task(_trends_forever(settings, pool, stop))


async def _jobs_forever(
    settings: Settings, pool: asyncpg.Pool, worker_id: UUID | None, stop: asyncio.Event
) -> None:
    ttl = 3 * settings.housekeeping_interval

    async def sweep() -> None:
        found = await sweep_overdue_expiries(pool, settings.sweep_grace)
        if found:
            log.warning("sweep_rescheduled_expiries", count=found)

    async def prune() -> None:
        counts = await retention.prune(pool, settings.retention, settings.prune_batch_size)
        deleted = {k: v for k, v in counts.items() if v and k != retention.BATCHES}
        if deleted:
            log.info("retention_pruned", **deleted)

    jobs: list[tuple[str, Callable[[], Awaitable[None]]]] = [
        (EXPIRY_SWEEP, sweep),
        (RETENTION, prune),
    ]
    try:
        while not stop.is_set():
            for name, job in jobs:
                if stop.is_set():
                    break
                await _run_job(settings, pool, worker_id, name, job, ttl)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=settings.housekeeping_interval)
    finally:
        if worker_id is not None:
            await _release_all(pool, worker_id, [name for name, _ in jobs])


async def _invariants_forever(
    settings: Settings, pool: asyncpg.Pool, worker_id: UUID | None, stop: asyncio.Event
) -> None:
    """The invariant checks under their lease; without it, the holder's stored results."""
    every = settings.invariant_check_interval
    if every <= 0:
        return

    async def check() -> None:
        bound = settings.attempts_bound()
        await invariant_watch.check_and_export(pool, Graces(attempts_bound=bound))

    async def export() -> None:
        await invariant_watch.export_stored(pool)

    try:
        while not stop.is_set():
            if not await _run_job(
                settings, pool, worker_id, invariant_watch.LEASE, check, 3 * every
            ):
                await _run_job(settings, pool, None, "invariant_export", export, 0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=every)
    finally:
        if worker_id is not None:
            await _release_all(pool, worker_id, [invariant_watch.LEASE])


async def _trends_forever(settings: Settings, pool: asyncpg.Pool, stop: asyncio.Event) -> None:
    """This minute's trend snapshot, tried every TREND_TICK seconds (no lease: it is taken once
    a minute whoever tries, and trying costs one primary-key lookup)."""

    async def take() -> None:
        async with pool.acquire() as conn:
            await trends.snapshot(conn)

    while not stop.is_set():
        await _run_job(settings, pool, None, TRENDS, take, 0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=TREND_TICK)


async def _run_job(
    settings: Settings,
    pool: asyncpg.Pool,
    worker_id: UUID | None,
    name: str,
    job: Callable[[], Awaitable[None]],
    ttl: float,
) -> bool:
    """Run `job` if this worker holds (or takes) its lease, or without one when `worker_id` is
    None. Returns whether it held the lease (False also when the lease could not be asked)."""
    held = False
    try:
        if worker_id is not None:
            async with pool.acquire() as conn:
                held = await leases.acquire(
                    conn, name, worker_id, ttl, stale_after_s=settings.worker_stale_after
                )
            if not held:
                return False
        held = True
        await job()
    except Exception as exc:  # the next round tries again
        if needs_operator(exc):
            log.error("housekeeping_failed", job=name, error=repr(exc))  # noqa: TRY400  (no trace: a grant)
        elif is_transient(exc):
            log.warning("housekeeping_failed", job=name, error=repr(exc))
        else:
            log.exception("housekeeping_error", job=name)
    return held


async def _release_all(pool: asyncpg.Pool, worker_id: UUID, names: list[str]) -> None:
    """Give the leases up on the way out, so another relay takes them over at once."""
    with contextlib.suppress(Exception):  # bounded and best effort: Postgres may be down
        async with asyncio.timeout(5):
            async with pool.acquire() as conn:
                for name in names:
                    await leases.release(conn, name, worker_id)
