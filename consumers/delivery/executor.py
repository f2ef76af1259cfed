"""The executor: each delivery of a batch decided in delivery order, its handler run in memory.

For each delivery the gate (domain/delivery.py) first decides what needs no handler (duplicate,
expired, cancelled, parked); otherwise the handler runs on the users' queues in memory and the
gate decides from its result. A handler that fails is rolled back in memory; its neighbours go
on. Nothing here writes: the writer (writer.py) turns the decisions into statements.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import structlog

from consumers.delivery.decode import BadDelivery, Delivery
from consumers.delivery.errors import failure_of
from consumers.delivery.snapshot import Snapshot
from consumers.handler_errors import TTRExceededError
from consumers.retry_policy import RetryPolicy
from consumers.unit_of_work import Handler, HandlerContext, UnitOfWork
from domain.delivery import Decision, ErrorKind, Failure, Fate
from domain.records import record
from events.decoding import Decoded, RawDelivery
from events.envelope import trace_id_of
from events.routes import Route
from infra import log_context, tracing
from infra.postgres.pool import Conn
from infra.transient import is_transient

log = structlog.get_logger(__name__)


class TimedOutError(Exception):
    """Delivery `index` ran past the route's TTR: the batch's transaction must roll back."""

    def __init__(self, index: int, error: TTRExceededError) -> None:
        super().__init__(str(error))
        self.index = index
        self.error = error


@record
class Decided:
    """A delivery and its decision, with what the writer and the log line need of it."""

    index: int
    raw: RawDelivery
    decoded: Decoded | None
    """None: bad input (it did not decode)."""
    decision: Decision
    trace_id: str | None = None
    seconds: float = 0.0


@dataclass
class Known:
    """Failures a batch's deliveries met in this processing, by index: recorded again when the
    batch runs again (after a blip, a TTR, a split), never met a second time by running the
    handler twice."""

    failures: dict[int, Failure] = field(default_factory=dict)


def refused(bad: Sequence[BadDelivery]) -> list[Decided]:
    """Bad input is buried at once with its reason, holding nothing back."""
    decided = []
    for item in bad:
        failure = failure_of(item.problem)
        decision = Decision(Fate.BURIED, failure.reason, failure, attempt=1)
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
        self, conn: Conn, snapshot: Snapshot, ready: Sequence[Delivery], known: Known
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
                    failure = known.failures.get(delivery.index)
                    if failure is None and delivery.decoded.newer:
                        failure = self._newer(delivery)
                    elif failure is None:
                        # What its handler says of a repeat is this run's alone: another
                        # publisher's copy under its message_id may have run in this batch.
                        work.repeats.pop(delivery.message_id, None)
                        failure, trace_id = await self._handle(conn, work, delivery)
                        if failure is not None:
                            known.failures[delivery.index] = failure
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
            context = HandlerContext(conn, work.now, envelope, work, traceparent)
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
