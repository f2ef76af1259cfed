"""The delivery pipeline of one route: decide, then write, one transaction at a time.

One message's way, in these stages (ARCHITECTURE.md draws them):
infra/rabbit/deliveries.py (handed over) -> consumers/delivery/decode.py (the trust gate and
decoding, done as it arrives: `take_ahead`) -> infra/rabbit/consumer.py (a batch) ->
pipeline.py (this loop) -> decide.py (the snapshot under the users' locks, from
infra/postgres/batch_read.py; the gate of domain/delivery.py decides; the handler runs in
memory on domain/queue.py through consumers/unit_of_work.py) -> writer.py (the decisions as
rows, then statements through infra/postgres/batch_write.py) -> back to the consumer, which
derives ack or give-back from each decision's fate.

**The batch's transaction loop** (`_decide_all`; docs/explanation/retries.md lists it with
pkgq's other loops) takes a batch through one transaction at a time:
- the whole batch in one transaction; if it fails on something that is not a blip (a write-back
  a constraint refuses, a bug), the batch is split and each delivery goes alone, so the failure
  is pinned on the message that causes it and its neighbours commit;
- a delivery whose own transaction fails is decided again with that failure recorded as its
  own (a data error Postgres refuses is PERMANENT: buried at once; anything else is retried
  with backoff), without running its handler again; if recording it fails too, it is
  UNDECIDED, and the consumer's last resort files a copy (the rest of the batch stays decided);
- a blip (deadlock, serialization failure, lock or statement timeout, a claim race) is run
  again after a short pause, up to BLIP_RETRIES times per transaction, then counts as the
  failure of what the transaction held (the batch splits; a lone delivery records it);
- an outage leaves the loop: the consumer waits it out (infra/transient.until_done) and runs
  the batch again, so nothing is recorded as a failure of a message; one that shows the server
  no longer takes writes (a demoted primary) first drops the pool's connections (`_connection`);
- TTR: a handler that runs past the route's TTR rolls the transaction back, a strike
  is counted, the deliveries before it are decided again, and it and the ones after it are
  given back unacknowledged, so they keep their places (the queue [A, B, C] with A taken and
  timed out while B was taken and done elsewhere is [A, C], not [C, A]); after max_attempts
  strikes it is buried (`ttr`).

Worst case, for a batch of B deliveries and R = BLIP_RETRIES: (R + 1) * (1 + 2B) transactions
(the batch, then each delivery alone and its recording), each followed on a blip by a pause of
at most 0.05 * k s (k = 1..R), so at most (1 + 2B) * 0.3 s of pauses; plus one transaction per
TTR strike (at most max_attempts per delivery). A blip that never clears proves the bound in
tests/integration/test_failure_kinds.py.

After the commit, users whose hold was lifted have their parked messages drained (drain.py): the
same loop over the parking lot (Source.PARKING) until none is left or one fails again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from uuid import UUID

import asyncpg
import structlog

from consumers.delivery import decide, writer
from consumers.delivery.decide import Executor, Failures, TimedOutError, refused
from consumers.delivery.decode import BadDelivery, Delivery, Taken, decode_one, sort_taken
from consumers.delivery.drain import Draining
from consumers.delivery.errors import failure_of
from consumers.delivery.writer import writes_of
from consumers.registry import needs_of
from consumers.retry_policy import RetryPolicy
from consumers.unit_of_work import Handler, NeedsOf
from domain.delivery import Decision, Fate, Source
from events.decoding import RawDelivery
from events.envelope import bounded_text
from events.routes import Route
from infra.observability import observe_committed
from infra.postgres import strikes, transitions
from infra.postgres.pool import Conn, forget_if_demoted
from infra.rabbit.consumer import Decided
from infra.transient import is_outage, is_transient

log = structlog.get_logger(__name__)

BLIP_RETRIES = 3
"""How often a transaction that met a blip is run again before the blip counts as a failure."""
AHEAD_LIMIT = 4096
"""Deliveries taken ahead (`take_ahead`) and not yet batched that a pipeline keeps by default:
beyond that the oldest is forgotten (taken again if its batch comes). A delivery the consumer
drops unbatched (its channel closed, a pause or a give-back: it comes back as a new one) stays
until that many newer ones have been taken. `pipeline_for` sizes it from the route's prefetch
and partitions."""


def undecided(item: Item, exc: Exception) -> Decided:
    """A delivery whose failure could not be recorded (see Fate.UNDECIDED)."""
    decoded = item.decoded if isinstance(item, Delivery) else None
    failure = dataclasses.replace(failure_of(exc), reason="undecided")
    return Decided(item.index, item.raw, decoded, Decision(Fate.UNDECIDED, failure=failure))


NEWS = frozenset({Fate.RETRIED, Fate.DEAD_LETTERED, Fate.EXPIRED, Fate.UNDECIDED, Fate.PARKED})
"""The fates worth a line of their own (an applied message gets the consumer's `processed`)."""


def report(route: Route, decided: Sequence[Decided]) -> None:
    for d in decided:
        decision, failure = d.decision, d.decision.failure
        if decision.fate not in NEWS:
            continue
        if d.decoded is not None:
            envelope = d.decoded.envelope
            message_id = str(envelope.message_id)
            user_id = str(envelope.user_id) if envelope.user_id is not None else None
        else:
            message_id, user_id = bounded_text(str(d.raw.message_id), 64), None
        fields = {"route": route.name, "message_id": message_id, "user_id": user_id}
        error = failure.summary if failure is not None else None
        if decision.fate is Fate.RETRIED:
            assert failure is not None
            log.warning(
                "retry_scheduled",
                **fields,
                attempt=decision.attempt,
                retry_at=decision.retry_at.isoformat() if decision.retry_at else None,
                error=error,
                at=failure.location,
            )
        elif decision.fate is Fate.DEAD_LETTERED:
            level = log.error if decision.holds is not None else log.warning
            level(
                "dead_lettered",
                **fields,
                reason=decision.reason,
                attempts=decision.attempt,
                holds_user=decision.holds is not None,
                error=error,
            )
        elif decision.fate is Fate.EXPIRED:
            log.warning("expired", **fields, error=error)
        elif decision.fate is Fate.UNDECIDED:
            log.error("undecided_to_last_resort", **fields, error=error)
        elif decision.fate is Fate.PARKED:
            log.info("parked", **fields, behind=str(decision.behind) if decision.behind else None)


class DatabaseUnavailableError(ConnectionError):
    """No pooled connection could be had in time (an outage: see infra/transient.py)."""


Item = Delivery | BadDelivery


class DeliveryPipeline(Draining):
    """The processor of one route's consumer (see infra/rabbit/consumer.py)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        route: Route,
        handler: Handler,
        policy: RetryPolicy,
        *,
        max_body_bytes: int,
        ttr: float | None = None,
        needs: NeedsOf | None = None,
        trusted_publisher: str | None = None,
        usage_dedup_days: int = writer.USAGE_DEDUP_DAYS,
        ahead_limit: int = AHEAD_LIMIT,
    ) -> None:
        """`trusted_publisher`: pkgq's AMQP user (Settings.amqp_user). Given, the consumer of a
        route that is not inbound buries what anyone else published (untrusted_publisher);
        None turns the check off (tests that feed deliveries without the broker).
        `ahead_limit`: deliveries taken ahead kept at most (AHEAD_LIMIT)."""
        self._pool = pool
        self._trusted_publisher = trusted_publisher
        self.route = route
        self.consumer = route.short_name
        self.policy = policy
        self._max_body_bytes = max_body_bytes
        self._needs = needs or needs_of(route.name)
        self._executor = Executor(route, handler, policy, ttr)
        self._polled_at = -1e9
        self._usage_dedup_days = usage_dedup_days
        self._ahead_limit = max(1, ahead_limit)
        self._ahead: dict[int, tuple[RawDelivery, Taken]] = {}
        """Deliveries taken before their batch (by the RawDelivery's id: the entry keeps the
        object alive, so the id cannot name another meanwhile)."""

    @property
    def ttr(self) -> float | None:
        """Seconds a handler may run on one message (None: no limit)."""
        return self._executor.ttr

    @ttr.setter
    def ttr(self, seconds: float | None) -> None:
        self._executor.ttr = seconds

    async def __call__(self, raw: RawDelivery) -> Fate:
        (result,) = await self.process_batch([raw])
        return result.decision.fate

    def take_ahead(self, raw: RawDelivery) -> None:
        """Take a delivery (its trust check, its pkgq marks, its decoding: `_take`) before its
        batch comes. The consumer calls this as each delivery arrives, in the channel's reader
        task, which runs while the batch before waits on Postgres: that work then fills the
        wait instead of lengthening the next batch. `process_batch` uses it for the same
        RawDelivery object, and takes any other delivery itself. Never raises: a delivery
        whose taking fails on something unforeseen (a bug) is left for its batch, which takes
        it again and meets the failure where the consumer isolates it."""
        if len(self._ahead) >= self._ahead_limit:
            # The oldest first (a dict keeps insertion order): a delivery dropped unbatched,
            # never one still buffered, when the limit exceeds what can be buffered at once.
            del self._ahead[next(iter(self._ahead))]
        try:
            self._ahead[id(raw)] = (raw, self._take(raw))
        except Exception:  # noqa: BLE001  (met again, and handled, in its batch)
            return

    def _take(self, raw: RawDelivery) -> Taken:
        """What a delivery is before its batch (decode.py: the trust gate, then decoding)."""
        return decode_one(
            self.route,
            raw,
            max_body_bytes=self._max_body_bytes,
            trusted_publisher=self._trusted_publisher,
        )

    def _taken(self, raw: RawDelivery) -> Taken:
        """As taken ahead, else now. An entry keeps its RawDelivery alive, so no other object
        can have the id it is filed under."""
        entry = self._ahead.pop(id(raw), None)
        return entry[1] if entry is not None else self._take(raw)

    async def process_batch(self, raws: Sequence[RawDelivery]) -> list[Decided]:
        """Decide the fate of deliveries; a `Decided` per delivery, in delivery order (one
        without a decision in this run is given back)."""
        ready, bad = sort_taken([self._taken(raw) for raw in raws])
        decided, drain = await self._decide_all([*ready, *bad], Source.QUEUE)
        if drain:
            await self._drain(drain)
        return [
            decided.get(i) or Decided(i, raw, None, Decision(Fate.GIVEN_BACK), seconds=None)
            for i, raw in enumerate(raws)
        ]

    async def _decide_all(
        self, items: Sequence[Item], source: Source, parked: Mapping[int, int] | None = None
    ) -> tuple[dict[int, Decided], set[UUID]]:
        """The batch's transaction loop (see the module docstring). Returns the decisions by
        index (a delivery without one is given back) and the users whose parked messages may go.
        `parked`: from the parking lot, each delivery's parked row (by index)."""
        decided: dict[int, Decided] = {}
        drain: set[UUID] = set()
        known: Failures = {}
        end = len(items) and max(i.index for i in items) + 1
        split = False
        blips = 0
        while pending := sorted(
            (i for i in items if i.index < end and i.index not in decided), key=lambda i: i.index
        ):
            scope = pending[:1] if split else pending
            try:
                done, lifted = await self._transaction(scope, source, known, parked or {})
            except TimedOutError as timed_out:
                end = await self._timed_out(items, timed_out, known, end)
                continue
            except Exception as exc:
                if is_outage(exc):
                    raise  # waited out by the consumer, then the batch runs again
                if (is_transient(exc) or isinstance(exc, writer.ClaimRaceError)) and (
                    blips < BLIP_RETRIES
                ):
                    blips += 1
                    await asyncio.sleep(random.uniform(0.01, 0.05) * blips)
                    continue
                blips = 0
                if len(scope) > 1:
                    log.warning("batch_failed_one_by_one_next", size=len(scope), error=repr(exc))
                    split = True
                    continue
                item = scope[0]
                if item.index in known:
                    # Recording its failure failed too: the consumer's last resort takes it;
                    # what the batch decided and committed before stays decided.
                    decided[item.index] = undecided(item, exc)
                    report(self.route, [decided[item.index]])
                    continue
                log.warning("delivery_failed_alone", index=item.index, error=repr(exc))
                known[item.index] = failure_of(exc)
                continue
            blips = 0
            decided.update((d.index, d) for d in done)
            drain |= set(lifted)
            report(self.route, done)
        return decided, drain

    async def _transaction(
        self, scope: Sequence[Item], source: Source, known: Failures, parked: Mapping[int, int]
    ) -> tuple[list[Decided], list[UUID]]:
        """Decide and write one scope of the batch in one transaction."""
        ready = [i for i in scope if isinstance(i, Delivery)]
        bad = [i for i in scope if isinstance(i, BadDelivery)]
        async with self._connection() as conn, conn.transaction():
            loaded = await decide.load(
                conn,
                self.consumer,
                self._needs,
                ready,
                source,
                failed_here=frozenset(known),
                parked=parked,
            )
            done = refused(bad) + await self._executor.run(conn, loaded, ready, known)
            rows = writes_of(
                self.route,
                done,
                loaded.work.now,
                source=source,
                holds_before=loaded.holds_before,
                holds_after=loaded.gate.holds,
                failed_before=loaded.failed_before,
                parked=parked,
            )
            lifted = await writer.write(
                conn, self.route, loaded.work, rows, usage_dedup_days=self._usage_dedup_days
            )
        # Committed: the time its users waited (infra/observability.py). A metric that fails must
        # not make the committed batch look failed (it would run again).
        try:
            observe_committed(self.route.name, rows.starts, loaded.work.granted())
        except Exception as exc:  # noqa: BLE001  (logged; the batch stands)
            log.warning("critical_time_not_observed", error=repr(exc))
        return done, lifted

    async def _timed_out(
        self, items: Sequence[Item], timed_out: TimedOutError, known: Failures, end: int
    ) -> int:
        """Count a TTR strike; returns where the batch now ends (the rest is given back, or,
        from the parking lot, stays parked)."""
        index = timed_out.index
        (delivery,) = [i for i in items if i.index == index and isinstance(i, Delivery)]
        async with self._connection() as conn, conn.transaction():
            count = await strikes.strike(conn, self.consumer, delivery.key, delivery.message_id)
            await transitions.count_one(conn, self.route.name, "ttr")
        if count >= self.policy.max_attempts:
            log.error("ttr_exhausted", strikes=count, error=str(timed_out.error))
            known[index] = failure_of(timed_out.error)  # run again: it is buried
            return end
        log.warning(
            "ttr_exceeded_given_back",
            message_id=str(delivery.message_id),
            strikes=count,
            error=str(timed_out.error),
        )
        for later in [i for i in known if i >= index]:
            del known[later]
        return index

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Conn]:
        """A pooled connection. Waiting too long for one is an outage (the pool is exhausted or
        the server hangs), to be waited out in place, not a failure of the message. A failure
        that shows the server no longer takes writes (a demoted primary) drops the pool's
        connections, so the retry connects to the new primary."""
        try:
            conn = await self._pool.acquire(timeout=10)
        except TimeoutError as exc:
            raise DatabaseUnavailableError("no Postgres connection within 10 s") from exc
        try:
            yield conn
        except Exception as exc:
            await forget_if_demoted(self._pool, exc)
            raise
        finally:
            await self._pool.release(conn)
