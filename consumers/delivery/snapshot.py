"""The snapshot a batch is decided on, loaded in a fixed number of statements.

In this order, one statement each, whatever the batch's size:
1. lock the users' rows (created if missing), in user_id order;
2. under those locks, lock their holds on the consumer (the lock order every writer of holds
   keeps: user, then hold), and read which messages the consumer applied before, how often
   each has failed, and the users' live items with their terms and the items the messages
   target (infra/postgres/batch_read.py);
3. for messages taken from the parking lot, lock their parked rows;
4. what the route's messages need besides (catalog entries, new item ids, the orders
   purchases name, the billing record ids usage records name), and lock the group members
   among the messages; a route whose messages need none of these sends none of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from uuid import UUID

from consumers.delivery.decode import Delivery
from consumers.unit_of_work import NeedsOf, UnitOfWork
from domain.delivery import Facts, Gate, Hold, Source
from infra.postgres import batch_read, catalog, groups, holds, queue_repo, usage_billed
from infra.postgres.pool import Conn


@dataclass
class Snapshot:
    work: UnitOfWork
    """The users' queues in memory, which the handlers change."""
    gate: Gate
    """What decides each delivery (domain/delivery.py)."""
    facts: dict[int, Facts]
    """What the snapshot says of each delivery, by its index in the batch."""
    holds_before: dict[UUID, Hold]
    """The users' holds as loaded (the gate's change as the batch goes)."""
    failed_before: set[UUID]
    """Keys of messages that had failed before this batch (a retry may be pending)."""


async def load(
    conn: Conn,
    consumer: str,
    needs_of: NeedsOf,
    ready: Sequence[Delivery],
    source: Source,
    *,
    settled: frozenset[int] = frozenset(),
    parked: Mapping[int, int] | None = None,
) -> Snapshot:
    """Inside the batch's transaction. `settled`: deliveries whose failure is known already
    (their run only records it): their users' rows are not locked, so a row that someone else
    keeps locked past the statement timeout does not fail the recording too. `parked`: from
    the parking lot, each delivery's parked row by index (a parked message is its row)."""
    rows, now = await queue_repo.lock_users(
        conn, {d.user_id for d in ready if d.user_id is not None and d.index not in settled}
    )
    # What each message needs is asked of all of them, applied before or not (the items a
    # duplicate targets are loaded too, and left unchanged), so that the one read under the
    # locks need not wait for the inbox's answer.
    asked = {d.index: needs_of(d.decoded.body) for d in ready if not d.decoded.newer}
    read = await batch_read.read_locked(
        conn,
        consumer,
        hold_users=[d.user_id for d in ready if d.user_id is not None],
        keys=[(d.key, d.message_id) for d in ready],
        item_users=list(rows),
        extra_item_ids=[i for n in asked.values() for i in n.item_ids],
    )
    held, seen, counted, items = read.held, read.seen, read.counted, read.items
    if source is Source.PARKING:
        # Another drain may have taken some meanwhile: those are gone from the batch.
        row_of = parked or {}
        still = await holds.lock_parked(conn, consumer, [row_of[d.index] for d in ready])
        ready = [d for d in ready if row_of[d.index] in still]
    needs = [asked[d.index] for d in ready if d.index in asked and d.key not in seen]
    # Orders are looked up by (user, by_order), not found among the loaded items: an old
    # order's items may all be consumed and so not loaded.
    orders = await queue_repo.load_orders(conn, [o for n in needs for o in n.orders])
    billed = await usage_billed.load(conn, [u for n in needs for u in n.usages])
    work = UnitOfWork(
        now,
        {
            u: queue_repo.loaded_queue(row, items.get(u, []), orders.get(u), billed.get(u))
            for u, row in rows.items()
        },
    )
    package_ids = [p for n in needs for p in n.package_ids]
    if package_ids:
        work.packages = await catalog.get_packages(conn, package_ids)
    new_items = sum(n.new_items for n in needs)
    if new_items:
        work.new_ids, work.created_at = await queue_repo.allocate_item_ids(conn, new_items)
    # A group member's row is locked until commit: a cancel waits for this batch, or this
    # batch sees the cancel.
    members = await groups.lock_members(
        conn, [d.message_id for d in ready if d.decoded.envelope.group_id is not None]
    )
    facts = {
        d.index: Facts(
            index=d.index,
            key=d.key,
            user_id=d.user_id,
            expires_at=d.decoded.envelope.expires_at,
            cancelled_member=members.get(d.message_id) == "cancelled",
        )
        for d in ready
    }
    gate = Gate(now, source, seen, dict(held), dict(counted))
    return Snapshot(work, gate, facts, held, set(counted))
