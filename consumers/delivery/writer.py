"""The one writer: a batch's writes (writes.py) become statements, one per table, failures
included.

In this order, inside the batch's transaction (whose snapshot locked the users, then their
holds: the lock order lives in snapshot.py, and nothing here locks anything else first):
inbox claims; items and user rows; usage records billed under a record id; access; timers and
superseded retries withdrawn; follow-up events and retries; the operators' audit; addresses
and groups finished; dead letters; failed attempts counted; parked messages parked or
unparked; holds made; holds lifted; counters.
A statement with nothing to write is not sent, so a batch costs at most a fixed number of
statements, whatever its size and however many of its messages fail.

What it guarantees (checked in production by `pkgq doctor`): every hold it makes has a way out
written in the same transaction (a retry in the outbox, or the blocker's buried dead letter);
every message it parks has a hold; every failure it counts is retried or buried.
"""

from __future__ import annotations

from uuid import UUID

import structlog

from consumers.delivery.writes import Writes
from consumers.unit_of_work import UnitOfWork
from events.routes import Route
from infra import faults
from infra.postgres import (
    access,
    attempts,
    audit,
    dead_letters,
    holds,
    inbox,
    job_state,
    outbox,
    queue_repo,
    transitions,
    usage_billed,
)
from infra.postgres.pool import Conn

USAGE_DEDUP_DAYS = 35
"""The default of PKGQ_USAGE_DEDUP_DAYS."""

log = structlog.get_logger(__name__)


class ClaimRaceError(Exception):
    """A message applied in memory was claimed in the inbox by someone else meanwhile: the
    batch is rolled back and run again (it is then a duplicate)."""


async def write(
    conn: Conn,
    route: Route,
    work: UnitOfWork,
    writes: Writes,
    *,
    usage_dedup_days: int = USAGE_DEDUP_DAYS,
) -> list[UUID]:
    """Send a batch's writes. Returns the users whose parked messages may go now.
    `usage_dedup_days`: how long a billing record id billed now is remembered."""
    consumer = route.short_name
    if writes.claims:
        claimed = await inbox.claim_many(conn, consumer, writes.claims)
        if claimed != len(writes.claims):
            raise ClaimRaceError(f"{len(writes.claims) - claimed} claimed meanwhile")
    await queue_repo.save(conn, work.queues.values())
    await usage_billed.write(conn, work.billings_to_write(), usage_dedup_days)
    stale = set(work.access_changes)
    stale -= await access.write(conn, work.access_changes, work.remaining_to_write())
    for user in sorted(stale):
        log.info("access_update_stale", user_id=str(user), seq=work.access_changes[user].seq)
    await outbox.withdraw(conn, [key for key, _ in work.withdrawn] + writes.withdrawn)
    await outbox.enqueue(conn, work.rows_to_write() + writes.retries)
    await audit.write(conn, work.audit)
    await job_state.finish(conn, writes.finished)
    await dead_letters.bury_many(conn, writes.buried)
    await attempts.add_many(conn, consumer, writes.counted)
    await holds.park_many(conn, consumer, writes.parked)
    await holds.unpark(conn, consumer, writes.unparked)
    await holds.hold_many(conn, consumer, writes.made)
    drain = await holds.settle_lifted(conn, consumer, writes.lifted)
    await transitions.count(conn, writes.moves)
    if writes.claims:
        faults.hit(faults.DELIVERY_BEFORE_COMMIT, route=route.name)
    return drain
