"""Deciding a batch: its snapshot loaded under its users' locks, then each delivery decided.

**The snapshot** (`load`), in a fixed number of statements whatever the batch's size, all of
them in infra/postgres/batch_read.py:
1. lock the users' rows (created if missing), in user_id order;
2. under those locks, lock their holds on the consumer (the lock order every writer of holds
   keeps: user, then hold), and read which messages the consumer applied before, how often
   each has failed, and the users' live items with their terms and the items the messages
   target;
3. for messages taken from the parking lot, lock their parked rows;
4. what the route's messages need besides (catalog entries, new item ids, the orders
   purchases name, the billing record ids usage records name), and lock the group members
   among the messages; a route whose messages need none of these sends none of them.

**The decisions** (`Executor.run`), in delivery order: the gate of domain/delivery.py first
decides what needs no handler (duplicate, expired, cancelled, parked); otherwise the handler
runs on the users' queues in memory and the gate decides from its result. A handler that fails
is rolled back in memory; its neighbours go on. Nothing here writes: the writer (writer.py)
turns the decisions into statements.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from uuid import UUID

import structlog

from consumers.delivery.decode import BadDelivery, Delivery
from consumers.delivery.errors import failure_of
from consumers.handler_errors import TTRExceededError
from consumers.retry_policy import RetryPolicy
from consumers.unit_of_work import Handler, HandlerContext, NeedsOf, UnitOfWork
from domain.delivery import Decision, ErrorKind, Facts, Failure, Fate, Gate, Hold, Source
from events.envelope import trace_id_of
from events.routes import Route
from infra import log_context, tracing
from infra.postgres import batch_read, catalog, holds, queue_repo
from infra.postgres.pool import Conn
from infra.rabbit.consumer import Decided
from infra.transient import is_transient

log = structlog.get_logger(__name__)

Failures = dict[int, Failure]
"""Failures a batch's deliveries met in this processing, by index: recorded again when the
batch runs again (after a blip, a TTR, a split), never met a second time by running the
handler twice."""


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
    failed_here: frozenset[int] = frozenset(),
    parked: Mapping[int, int] | None = None,
) -> Snapshot:
    """Inside the batch's transaction. `failed_here`: deliveries whose failure is known already
    (their run only records it): their users' rows are not locked, so a row that someone else
    keeps locked past the statement timeout does not fail the recording too. `parked`: from
    the parking lot, each delivery's parked row by index (a parked message is its row)."""
    rows, now = await batch_read.lock_users(
        conn, {d.user_id for d in ready if d.user_id is not None and d.index not in failed_here}
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
    orders = await batch_read.load_orders(conn, [o for n in needs for o in n.orders])
    billed = await batch_read.load_billed(conn, [u for n in needs for u in n.usages])
    work = UnitOfWork(
        now,
        {
            u: batch_read.loaded_queue(row, items.get(u, []), orders.get(u), billed.get(u))
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
    members = await batch_read.lock_members(
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


class TimedOutError(Exception):
    """Delivery `index` ran past the route's TTR: the batch's transaction must roll back."""

    def __init__(self, index: int, error: TTRExceededError) -> None:
        super().__init__(str(error))
        self.index = index
        self.error = error


def refused(bad: Sequence[BadDelivery]) -> list[Decided]:
    """Bad input is buried at once with its reason, holding nothing back."""
    decided = []
    for item in bad:
        failure = failure_of(item.problem)
        decision = Decision(Fate.DEAD_LETTERED, failure.reason, failure, attempt=1)
        decided.append(Decided(item.index, item.raw, None, decision))
    return decided


class Executor:
    def __init__(
        self, route: Route, handler: Handler, policy: RetryPolicy, ttr: float | None
    ) -> None:
        self.route = route
        self._handler = handler
        self._policy = policy
        self.ttr = ttr

    async def run(
        self, conn: Conn, snapshot: Snapshot, ready: Sequence[Delivery], known: Failures
    ) -> list[Decided]:
        """Decide the deliveries in delivery order (raises TimedOutError on a TTR)."""
        gate, work = snapshot.gate, snapshot.work
        decided: list[Decided] = []
        for delivery in sorted(ready, key=lambda d: d.index):
            facts = snapshot.facts.get(delivery.index)
            if facts is None:  # a parked message another drain decided meanwhile
                decided.append(
                    Decided(
                        delivery.index, delivery.raw, delivery.decoded, Decision(Fate.GIVEN_BACK)
                    )
                )
                continue
            started = time.perf_counter()
            trace_id: str | None = None
            # What is logged meanwhile names the delivery (worked out only for lines written).
            entered = log_context.enter(self.route.name, delivery.decoded.envelope)
            try:
                decision = gate.admit(facts)
                if decision is None:
                    failure = known.get(delivery.index)
                    if failure is None and delivery.decoded.newer:
                        failure = self._newer(delivery)
                    elif failure is None:
                        # What its handler says of a repeat is this run's alone: another
                        # publisher's copy under its message_id may have run in this batch.
                        work.repeats.pop(delivery.message_id, None)
                        failure, trace_id = await self._handle(conn, work, delivery)
                        if failure is not None:
                            known[delivery.index] = failure
                    repeat = work.repeats.pop(delivery.message_id, None)
                    decision = gate.decide(facts, failure, self._policy.delay_after, repeat=repeat)
                gate.note(facts, decision)
            finally:
                log_context.leave(entered)
            seconds = time.perf_counter() - started
            decided.append(
                Decided(delivery.index, delivery.raw, delivery.decoded, decision, trace_id, seconds)
            )
        return decided

    def _newer(self, delivery: Delivery) -> Failure:
        """A version this pkgq does not know: no handler runs, a newer pkgq applies it."""
        envelope = delivery.decoded.envelope
        log.warning(
            "newer_version_deferred",
            schema_version=envelope.schema_version,
            accepts=list(self.route.accepted_versions),
            retry_in_s=self._policy.newer_version_s,
        )
        return Failure(
            ErrorKind.NEWER,
            "newer_version",
            "NewerVersionError",
            f"x-schema-version={envelope.schema_version} is newer than this pkgq knows (it "
            f"applies {' and '.join(map(str, self.route.accepted_versions))})",
            delay=self._policy.newer_version_s,
            limit=self._policy.newer_version_limit,
        )

    async def _handle(
        self, conn: Conn, work: UnitOfWork, delivery: Delivery
    ) -> tuple[Failure | None, str | None]:
        """Run the handler in memory. Returns how it failed (None: it did not) and the trace
        it ran in. A failure is rolled back in memory; transient errors (outages and blips)
        and a TTR leave the batch."""
        envelope = delivery.decoded.envelope
        point = work.savepoint(envelope.user_id)
        with tracing.consuming(
            self.route.name, envelope.message_id, envelope.traceparent
        ) as traceparent:
            context = HandlerContext(conn, work.now, envelope, work, traceparent, delivery.raw)
            trace_id = trace_id_of(traceparent)
            try:
                if self.ttr is None:
                    await self._handler(context, delivery.decoded.body)
                else:
                    deadline = asyncio.timeout(self.ttr)
                    try:
                        async with deadline:
                            await self._handler(context, delivery.decoded.body)
                    except TimeoutError as exc:
                        if deadline.expired():  # ours, not one the handler met on its own
                            raise TimedOutError(delivery.index, TTRExceededError(self.ttr)) from exc
                        raise
            except TimedOutError:
                raise
            except Exception as exc:
                if is_transient(exc):
                    raise  # not the message's fault: the whole batch is tried again
                work.rollback(point)
                return failure_of(exc), trace_id
        return None, trace_id
