"""The delivery pipeline of one route: what becomes of each delivery, decided in Postgres.

A batch goes through the stages in order: decode (bad input is buried with its reason), dedup
and holds (duplicates, expired, parked), apply (handlers in memory, one set-based write-back),
failures (retry, hold, bury) and, after the commit, the drain of parked messages whose hold
was lifted. The consumer loop (infra/rabbit/consumer.py) settles the results: ack, give back,
metrics and log lines.

Two modes, named by `Mode`: a batch runs in one transaction; if that transaction fails on
something other than a handler (a bug, a constraint the write-back broke), each delivery runs
in a transaction of its own, so the failure is pinned on the message that causes it and its
neighbours commit. Outages and blips leave the pipeline: the consumer waits them out and
runs the whole batch again, so nothing is recorded as a failure of a message.

TTR (seed 001): a handler that runs past the route's TTR rolls the batch back; the deliveries
before it are applied again and it and the ones after it are given back to the queue in their
places ([A, B, C], A times out while B is done: the queue is [A, C], not [C, A]). After
max_attempts strikes it is buried instead (reason `ttr`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
from collections.abc import AsyncIterator, Sequence
from uuid import UUID

import asyncpg
import structlog

from consumers.delivery.apply import (
    BLIP_RETRIES,
    Applied,
    Applier,
    ClaimRaceError,
    TimedOutError,
    pause_after_blip,
)
from consumers.delivery.decode import decode_all
from consumers.delivery.failures import Failures
from consumers.delivery.parked import ParkingLot
from consumers.registry import needs_of
from consumers.retry_policy import RetryPolicy
from consumers.unit_of_work import Handler, NeedsOf
from events.decoding import RawDelivery
from events.envelope import bounded_text, without_pkgq_marks
from events.routes import Route
from infra.postgres import strikes, transitions
from infra.postgres.pool import Conn
from infra.rabbit.outcomes import Outcome, Result
from infra.transient import is_outage, is_transient

log = structlog.get_logger(__name__)

CLAIM_RACE_RETRIES = 3


class Mode(enum.Enum):
    SET_BASED = "set_based"
    """The whole batch in one transaction, with a fixed number of statements."""
    ONE_BY_ONE = "one_by_one"
    """Each delivery in a transaction of its own, in delivery order."""


class DatabaseUnavailableError(ConnectionError):
    """No pooled connection could be had in time (an outage: see infra/transient.py)."""


class DeliveryPipeline:
    """The processor of one route's consumer (see infra/rabbit/consumer.py)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        route: Route,
        handler: Handler,
        policy: RetryPolicy,
        *,
        max_body_bytes: int,
        kill_before_commit: bool = False,
        ttr: float | None = None,
        needs: NeedsOf | None = None,
        trusted_publisher: str | None = None,
    ) -> None:
        """`trusted_publisher`: pkgq's AMQP user (Settings.amqp_user). Given, the consumer of a
        route that is not inbound buries what anyone else published (untrusted_publisher);
        None turns the check off (tests that feed deliveries without the broker)."""
        self._pool = pool
        self._trusted_publisher = trusted_publisher
        self.route = route
        self.consumer = route.short_name
        self.policy = policy
        self._max_body_bytes = max_body_bytes
        self.failures = Failures(route, policy)
        self._applier = Applier(
            route,
            handler,
            needs or needs_of(route.name),
            self.failures,
            ttr=ttr,
            kill_before_commit=kill_before_commit,
        )
        self.parking = ParkingLot(
            route, self._applier, self.failures, self._connection, max_body_bytes=max_body_bytes
        )

    @property
    def ttr(self) -> float | None:
        """Seconds a handler may run on one message (None: no limit)."""
        return self._applier.ttr

    @ttr.setter
    def ttr(self, seconds: float | None) -> None:
        self._applier.ttr = seconds

    async def __call__(self, raw: RawDelivery) -> Outcome:
        (result,) = await self.process_batch([raw])
        return result.outcome

    async def process_batch(self, raws: Sequence[RawDelivery]) -> list[Result]:
        """Decide the fate of deliveries; a result per delivery, in delivery order."""
        raws = self._distrusted(raws)
        results: dict[int, Result] = {}
        known: dict[int, Exception] = {}
        """Failures this delivery attempt already met, by index: recorded again when the batch
        runs again (after a TTR), not met a second time by calling the handler twice."""
        end = len(raws)
        mode = Mode.SET_BASED
        races = blips = 0
        drain: set[UUID] = set()
        while pending := [i for i in range(end) if i not in results]:
            try:
                if mode is Mode.SET_BASED:
                    applied = await self._in_one_transaction(raws, pending, known)
                    results.update(applied.results)
                    drain |= applied.drain
                else:
                    await self._one_by_one(raws, pending, known, results, drain)
            except TimedOutError as timed_out:
                end = await self._timed_out(raws, timed_out, known, end)
            except ClaimRaceError:
                races += 1
                if races > CLAIM_RACE_RETRIES:
                    raise
            except Exception as exc:
                if is_outage(exc) or mode is Mode.ONE_BY_ONE:
                    raise  # an outage is waited out by the consumer, then the batch runs again
                if is_transient(exc) and blips < BLIP_RETRIES:
                    blips += 1
                    await pause_after_blip(blips)
                    continue
                log.warning("batch_failed_one_by_one_next", size=len(pending), error=repr(exc))
                mode = Mode.ONE_BY_ONE
        await self._drain(drain)
        return [results.get(i, Result(Outcome.GIVEN_BACK)) for i in range(len(raws))]

    def _distrusted(self, raws: Sequence[RawDelivery]) -> Sequence[RawDelivery]:
        """The deliveries with an outsider's pkgq marks (job marks, failure and replay history:
        events.envelope.PKGQ_MARKS) taken away, before anything reads, parks, retries or buries
        them: the message is applied as if it had none, and no address or group of pkgq's
        hears of it. Only with a trusted publisher to compare against."""
        if self._trusted_publisher is None:
            return raws
        kept: list[RawDelivery] = []
        for raw in raws:
            headers = (
                None
                if raw.publisher == self._trusted_publisher
                else without_pkgq_marks(raw.headers)
            )
            if headers is not None:
                log.info(
                    "outsider_job_marks_ignored",
                    route=self.route.name,
                    message_id=bounded_text(str(raw.message_id), 64),
                    publisher=bounded_text(str(raw.publisher), 64),
                    headers=sorted(set(raw.headers) - set(headers)),
                )
                raw = dataclasses.replace(raw, headers=headers)
            kept.append(raw)
        return kept

    async def _in_one_transaction(
        self, raws: Sequence[RawDelivery], indexes: list[int], known: dict[int, Exception]
    ) -> Applied:
        ready, bad = decode_all(
            self.route,
            [(i, raws[i]) for i in indexes],
            max_body_bytes=self._max_body_bytes,
            trusted_publisher=self._trusted_publisher,
        )
        async with self._connection() as conn, conn.transaction():
            return await self._applier.run(conn, ready, bad, known)

    async def _one_by_one(
        self,
        raws: Sequence[RawDelivery],
        indexes: list[int],
        known: dict[int, Exception],
        results: dict[int, Result],
        drain: set[UUID],
    ) -> None:
        for index in indexes:
            applied = await self._alone(raws, index, known)
            results.update(applied.results)
            drain |= applied.drain

    async def _alone(
        self, raws: Sequence[RawDelivery], index: int, known: dict[int, Exception]
    ) -> Applied:
        """One delivery in a transaction of its own. If that transaction fails on something
        other than an outage (a blip that persists, a constraint the write-back broke), the
        failure is the message's own: it is recorded in a new transaction (retry and hold, or
        bury), without its handler called again."""
        for attempt in range(BLIP_RETRIES + 1):
            try:
                return await self._in_one_transaction(raws, [index], known)
            except (TimedOutError, ClaimRaceError):
                raise
            except Exception as exc:
                if is_outage(exc):
                    raise
                if is_transient(exc) and attempt < BLIP_RETRIES:
                    await pause_after_blip(attempt + 1)
                    continue
                known.setdefault(index, exc)
                log.warning("delivery_failed_alone", index=index, error=repr(exc))
                break
        return await self._in_one_transaction(raws, [index], known)

    async def _timed_out(
        self,
        raws: Sequence[RawDelivery],
        timed_out: TimedOutError,
        known: dict[int, Exception],
        end: int,
    ) -> int:
        """Count a TTR strike; returns where the batch now ends (the rest is given back)."""
        index = timed_out.index
        ready, _ = decode_all(
            self.route, [(index, raws[index])], max_body_bytes=self._max_body_bytes
        )
        async with self._connection() as conn, conn.transaction():
            count = await strikes.strike(conn, self.consumer, ready[0].message_id)
            await transitions.count_one(conn, self.route.name, "ttr")
        if count >= self.policy.max_attempts:
            log.error("ttr_exhausted", strikes=count, error=str(timed_out.error))
            known[index] = timed_out.error  # run again: this time it is buried
            return end
        log.warning(
            "ttr_exceeded_given_back",
            message_id=str(ready[0].message_id),
            strikes=count,
            given_back=end - index,
            error=str(timed_out.error),
        )
        for later in [i for i in known if i >= index]:
            del known[later]
        return index

    async def _drain(self, users: set[UUID]) -> None:
        for user in sorted(users):
            try:
                await self.parking.drain(user)
            except Exception as exc:  # noqa: BLE001  (these deliveries are done; the poll retries)
                log.warning("drain_deferred", user_id=str(user), error=repr(exc))

    async def drain_parked(self) -> int:
        """The consumer's idle task: drain the users whose holds were lifted meanwhile."""
        return await self.parking.drain_lifted()

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Conn]:
        """A pooled connection. Waiting too long for one is an outage (the pool is exhausted or
        the server hangs), to be waited out in place, not a failure of the message."""
        try:
            conn = await self._pool.acquire(timeout=10)
        except TimeoutError as exc:
            raise DatabaseUnavailableError("no Postgres connection within 10 s") from exc
        try:
            yield conn
        finally:
            await self._pool.release(conn)
