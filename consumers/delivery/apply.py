"""The apply stage: a batch of deliveries in one transaction, with a fixed number of statements.

1. lock the holds on the batch's users and the users' rows (created if missing), in user_id
   order, and read which messages were applied before: one statement each;
2. load the users' live items with their terms, and what the route's messages need besides
   (targeted items, catalog entries, new item ids, the orders purchases name): one statement
   each;
3. run each message's handler on the users' queues in memory, in user order and each user's
   in delivery order; a message that fails is rolled back in memory and goes to the failure
   stage alone, its neighbours go on;
4. write the batch back set-based: inbox claims, items, user rows, orders, access, withdrawn
   timers, follow-up events, the operators' audit, jobs finished and counters, one statement
   each.
What a batch costs in statements does not grow with its size; only failures, parking and
lifted holds (rare, and per message by nature) add statements of their own.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from uuid import UUID

import structlog

from consumers.delivery.admission import Admission, Gate, Step
from consumers.delivery.decode import BadDelivery, Delivery
from consumers.delivery.failures import Failures, Verdict
from consumers.handler_errors import TTRExceededError
from consumers.unit_of_work import Handler, HandlerContext, Needs, NeedsOf, UnitOfWork
from events.envelope import jsonable
from events.routes import Route
from infra import tracing
from infra.postgres import (
    access,
    audit,
    catalog,
    groups,
    holds,
    inbox,
    job_state,
    outbox,
    queue_repo,
    transitions,
)
from infra.postgres.pool import Conn
from infra.rabbit.outcomes import Outcome, Result
from infra.transient import is_transient

log = structlog.get_logger(__name__)


class TimedOutError(Exception):
    """Delivery `index` ran past the route's TTR: the batch's transaction must roll back."""

    def __init__(self, index: int, error: TTRExceededError) -> None:
        super().__init__(str(error))
        self.index = index
        self.error = error


BLIP_RETRIES = 3
"""How often a transaction that met a blip (deadlock, serialization failure, lock or statement
timeout) is run again at once before the blip counts as the message's own failure."""


async def pause_after_blip(attempt: int) -> None:
    await asyncio.sleep(random.uniform(0.01, 0.05) * attempt)


class ClaimRaceError(Exception):
    """A message applied in memory was claimed in the inbox by someone else meanwhile: the
    batch is rolled back and run again (it is then a duplicate)."""


@dataclass
class Applied:
    """What a committed batch decided: a result per delivery index, and the users whose
    parked messages may go now."""

    results: dict[int, Result] = field(default_factory=dict)
    drain: set[UUID] = field(default_factory=set)


class Applier:
    """Runs batches of one route's deliveries (see the module docstring)."""

    def __init__(
        self,
        route: Route,
        handler: Handler,
        needs: NeedsOf,
        failures: Failures,
        *,
        ttr: float | None,
        kill_before_commit: bool = False,
    ) -> None:
        self.route = route
        self.consumer = route.short_name
        self._handler = handler
        self._needs = needs
        self._failures = failures
        self.ttr = ttr
        self._kill_before_commit = kill_before_commit

    async def run(
        self,
        conn: Conn,
        ready: Sequence[Delivery],
        bad: Sequence[BadDelivery],
        known: dict[int, Exception],
        admission: Admission = Admission.FROM_QUEUE,
    ) -> Applied:
        """Inside a transaction. `known`: failures this delivery attempt already met, by
        index: recorded again instead of the handler called twice (a batch run again after a
        TTR); failures met here are added to it."""
        applied = Applied()
        for item in bad:
            started = time.perf_counter()
            await self._failures.bury(conn, item.raw, item.problem.reason, item.problem, attempts=1)
            log.warning(
                "dead_lettered",
                route=self.route.name,
                message_id=item.raw.message_id,
                reason=item.problem.reason,
                error=str(item.problem),
            )
            applied.results[item.index] = Result(
                Outcome.DEAD_LETTERED, time.perf_counter() - started
            )
        work, gate, members = await self._load(conn, ready, admission, known)
        claims: list[UUID] = []
        finished: list[job_state.Finished] = []
        for delivery in ready:
            started = time.perf_counter()
            envelope = delivery.decoded.envelope
            with structlog.contextvars.bound_contextvars(
                route=self.route.name,
                message_id=str(envelope.message_id),
                user_id=str(envelope.user_id) if envelope.user_id else None,
                trace_id=tracing.trace_id_of(envelope.traceparent),
            ):
                verdict, trace_id = await self._one(
                    conn, work, gate, members, known, delivery, claims, finished
                )
            applied.results[delivery.index] = Result(
                verdict.outcome, time.perf_counter() - started, trace_id
            )
            if verdict.drain and delivery.user_id is not None:
                applied.drain.add(delivery.user_id)
        # A parked message was counted as taken when it was parked.
        taken = 0 if admission is Admission.FROM_PARKING else len(ready) + len(bad)
        await self._write(conn, work, claims, finished, applied, taken=taken)
        return applied

    async def _load(
        self,
        conn: Conn,
        ready: Sequence[Delivery],
        admission: Admission,
        known: dict[int, Exception],
    ) -> tuple[UnitOfWork, Gate, dict[UUID, str]]:
        users = sorted({d.user_id for d in ready if d.user_id is not None})
        # The users' rows first, then their holds (the order every writer of holds takes too),
        # so a hold another batch made while this one waited for a user is seen. A message
        # whose failure is known already needs no user row: its run only records the failure,
        # even while someone else keeps that row locked.
        rows, now = await queue_repo.lock_users(
            conn, {d.user_id for d in ready if d.user_id is not None and d.index not in known}
        )
        held = await holds.lock_many(conn, self.consumer, users) if users else {}
        ids = [d.message_id for d in ready]
        seen = await inbox.seen_many(conn, self.consumer, ids) if ids else set()
        needs = [self._needs(d.decoded.body) for d in ready if d.message_id not in seen]
        wanted = Needs(
            item_ids=tuple(i for n in needs for i in n.item_ids),
            package_ids=tuple(p for n in needs for p in n.package_ids),
            new_items=sum(n.new_items for n in needs),
            orders=tuple(o for n in needs for o in n.orders),
        )
        items = await queue_repo.load_items(conn, rows, wanted.item_ids) if rows else {}
        # Orders are looked up by (user, by_order), not found among the loaded items: an old
        # order's items may all be consumed and so not loaded.
        orders = await queue_repo.load_orders(conn, wanted.orders)
        work = UnitOfWork(
            now,
            {
                u: queue_repo.loaded_queue(row, items.get(u, []), orders.get(u))
                for u, row in rows.items()
            },
        )
        if wanted.package_ids:
            work.packages = await catalog.get_packages(conn, wanted.package_ids)
        if wanted.new_items:
            work.new_ids, work.created_at = await queue_repo.allocate_item_ids(
                conn, wanted.new_items
            )
        # A group member's row is locked until commit: a cancel waits for this batch, or this
        # batch sees the cancel.
        members = await groups.lock_members(
            conn, [d.message_id for d in ready if d.decoded.envelope.group_id is not None]
        )
        return work, Gate(self.consumer, seen, held, now, admission), members

    async def _one(
        self,
        conn: Conn,
        work: UnitOfWork,
        gate: Gate,
        members: dict[UUID, str],
        known: dict[int, Exception],
        delivery: Delivery,
        claims: list[UUID],
        finished: list[job_state.Finished],
    ) -> tuple[Verdict, str | None]:
        envelope = delivery.decoded.envelope
        hold = gate.hold_of(delivery)
        step = gate.step(delivery)
        trace_id: str | None = None
        if step is Step.DUPLICATE:
            drain = await self._failures.done_with_blocker(conn, delivery.message_id, hold)
            verdict = Verdict(Outcome.DUPLICATE, drain)
        elif step is Step.EXPIRED:
            verdict = await self._failures.expired(conn, delivery.decoded, delivery.raw, hold)
        elif step is Step.PARK:
            assert hold is not None
            await holds.park(
                conn,
                self.consumer,
                hold.user_id,
                delivery.message_id,
                self.route.name,
                self.route.message_type,
                delivery.raw.body,
                json.dumps(jsonable(dict(delivery.raw.headers))),
            )
            return Verdict(Outcome.PARKED, drain=hold.blocker is None), None
        elif members.get(delivery.message_id) == "cancelled":
            log.info("group_member_cancelled", group_id=str(envelope.group_id))
            claims.append(delivery.message_id)
            drain = await self._failures.done_with_blocker(conn, delivery.message_id, hold)
            verdict = Verdict(Outcome.CANCELLED, drain)
        else:
            failure = known.get(delivery.index)
            if failure is None:
                failure, trace_id = await self._handle(conn, work, delivery)
                if failure is not None:
                    known[delivery.index] = failure
            if failure is not None:
                verdict = await self._failures.failed(
                    conn, delivery.decoded, delivery.raw, hold, failure, work.now
                )
            else:
                claims.append(delivery.message_id)
                if envelope.address is not None or envelope.group_id is not None:
                    finished.append(
                        job_state.Finished(
                            delivery.message_id, envelope.address, envelope.group_id, ok=True
                        )
                    )
                drain = await self._failures.done_with_blocker(conn, delivery.message_id, hold)
                # A repeat of an order bought before is applied (as nothing) and acked, but
                # said apart from a new purchase in the metrics and the processed line.
                repeat = delivery.message_id in work.duplicate_orders
                verdict = Verdict(Outcome.DUPLICATE_ORDER if repeat else Outcome.ACKED, drain)
        gate.done(
            delivery,
            finished=verdict.outcome
            in (
                Outcome.ACKED,
                Outcome.DUPLICATE_ORDER,
                Outcome.DUPLICATE,
                Outcome.CANCELLED,
                Outcome.EXPIRED,
            ),
            holds_user=verdict.holds_user,
        )
        return verdict, trace_id

    async def _handle(
        self, conn: Conn, work: UnitOfWork, delivery: Delivery
    ) -> tuple[Exception | None, str | None]:
        """Run the handler in memory. Returns how it failed (None: it did not) and the trace
        it ran in. A failure is rolled back in memory; infrastructure errors (outages and
        blips) and a TTR leave the batch."""
        envelope = delivery.decoded.envelope
        point = work.savepoint(envelope.user_id)
        with tracing.consuming(
            self.route.name, str(envelope.message_id), envelope.traceparent
        ) as traceparent:
            context = HandlerContext(conn, work.now, envelope, work, traceparent)
            trace_id = tracing.trace_id_of(traceparent)
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
                return exc, trace_id
        return None, trace_id

    async def _write(
        self,
        conn: Conn,
        work: UnitOfWork,
        claims: list[UUID],
        finished: list[job_state.Finished],
        applied: Applied,
        *,
        taken: int,
    ) -> None:
        if claims:
            claimed = await inbox.claim_many(conn, self.consumer, claims)
            if len(claimed) != len(set(claims)):
                raise ClaimRaceError(f"{len(set(claims)) - len(claimed)} claimed meanwhile")
        await queue_repo.save(conn, work.queues.values())
        stale = set(work.access_changes)
        stale -= await access.write(conn, work.access_changes, work.remaining_to_write())
        for user in sorted(stale):
            log.info("access_update_stale", user_id=str(user), seq=work.access_changes[user].seq)
        await outbox.withdraw(conn, [key for key, _ in work.withdrawn])
        await outbox.enqueue(conn, work.rows_to_write())
        await audit.write(conn, work.audit)
        await job_state.finish(conn, finished)  # addresses done, groups completed
        await transitions.count(conn, moves(self.route.name, taken, applied.results.values()))
        if self._kill_before_commit and claims:
            os.kill(os.getpid(), signal.SIGKILL)  # crash test: applied, not committed


def moves(route: str, taken: int, results: Iterable[Result]) -> dict[tuple[str, str], int]:
    """Transition counts of a batch (bury and ttl are counted by a trigger on the store)."""
    outcomes = [r.outcome for r in results]
    acked = sum(1 for o in outcomes if o in (Outcome.ACKED, Outcome.DUPLICATE_ORDER))
    retried = sum(1 for o in outcomes if o is Outcome.RETRY_SCHEDULED)
    # seed 004's "release": a taken message put back to wait (here: a retry scheduled)
    return {(route, "take"): taken, (route, "ack"): acked, (route, "release"): retried}
