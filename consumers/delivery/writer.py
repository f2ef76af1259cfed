"""The one writer: a batch's writes (writes.py) become statements, failures included.

In this order, inside the batch's transaction (whose snapshot locked the users, then their
holds: the lock order lives in snapshot.py, and nothing here locks anything else first):
inbox claims; items and user rows; usage records billed under a record id; access; timers and
superseded retries withdrawn; follow-up events and retries; the operators' audit; addresses
and groups finished; dead letters; failed attempts counted; parked messages parked or
unparked; holds made; holds lifted; counters.
Each table's write is one part, and the parts go out as few statements as keeps their order
(infra/postgres/compound.py): consecutive parts share a statement unless they touch the same
table (the access grants and the remaining traffic; timers withdrawn and rows added), and
the failure path's writes (finished jobs, dead letters, parking and holds) go as statements of
their own between them. A batch whose messages all apply writes in one statement, two when it
both grants and bills or both withdraws and adds; a part with nothing to write is not sent, so
a batch costs at most a fixed number of statements, whatever its size and however many of its
messages fail.

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
    compound,
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
    batch = compound.Batch(conn)
    claimed = await batch.add(inbox.claim_many(consumer, writes.claims))
    for part in queue_repo.save(work.queues.values()):
        await batch.add(part)
    await batch.add(usage_billed.write(work.billings_to_write(), usage_dedup_days))
    changes, remaining = access.write(work.access_changes, work.remaining_to_write())
    applied = await batch.add(changes)
    await batch.add(remaining)
    await batch.add(outbox.withdraw_part([key for key, _ in work.withdrawn] + writes.withdrawn))
    await batch.add(outbox.enqueue_part(work.rows_to_write() + writes.retries))
    await batch.add(audit.write(work.audit))
    # The failure path's statements go one by one, in this order, after what came before.
    if writes.finished or writes.buried:
        await batch.send()
        await job_state.finish(conn, writes.finished)
        await dead_letters.bury_many(conn, writes.buried)
    await batch.add(attempts.add_many(consumer, writes.counted))
    drain: list[UUID] = []
    if writes.parked or writes.unparked or writes.made or writes.lifted:
        await batch.send()
        await holds.park_many(conn, consumer, writes.parked)
        await holds.unpark(conn, consumer, writes.unparked)
        await holds.hold_many(conn, consumer, writes.made)
        drain = await holds.settle_lifted(conn, consumer, writes.lifted)
    await batch.add(transitions.count_part(writes.moves))
    await batch.send()
    if writes.claims and claimed.get() != len(writes.claims):
        raise ClaimRaceError(f"{len(writes.claims) - claimed.get()} claimed meanwhile")
    stale = set(work.access_changes) - (applied.get() or set())
    for user in sorted(stale):
        log.info("access_update_stale", user_id=str(user), seq=work.access_changes[user].seq)
    if writes.claims:
        faults.hit(faults.DELIVERY_BEFORE_COMMIT, route=route.name)
    return drain
