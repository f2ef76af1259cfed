"""The consumer loop of one queue: take deliveries in batches, have them decided, settle them.

One message's way through the transport, in this file after infra/rabbit/deliveries.py:
1. `_consume` takes a delivery from the buffer and `_collect` makes its batch (what is buffered,
   then what arrives within the linger, up to the batch size);
2. `_deliver` hands the batch to the processor (consumers/delivery/pipeline.py for a route,
   consumers/ingest.py for the dead-letter queue) inside `until_done`, which waits out an
   outage in place (infra/transient.py): never acked, never skipped, so the next message
   cannot overtake it;
3. the processor returns a `Decided` per delivery, and the loop settles them all here: the
   transport's verdict (`Settle`) is derived from each decision's fate, and nowhere else; then
   metrics and one `processed` line per message (`record`).

Deliveries are taken in delivery order, one batch at a time per lane (prefetch only fills a local
buffer), so one user's messages on a route are applied in the order the broker holds them.
The subscription (and what a reconnection, a broker-side cancel, a pause or a give-back does to
the buffer) is infra/rabbit/subscription.py; what happens when the processor itself raises (a
bug in the failure path) is infra/rabbit/fallback.py.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import structlog
from aio_pika.abc import AbstractRobustConnection

from domain.delivery import Decision, Fate
from domain.records import record as frozen_record
from events.decoding import Decoded, RawDelivery
from events.envelope import H_TRACEPARENT, H_USER_ID, header_text, trace_id_of
from events.partitioning import route_of_key
from infra import faults
from infra.observability import IN_FLIGHT, MESSAGES, PROCESSING
from infra.rabbit.deliveries import Ahead, AmqpDelivery, InHand, channel_open
from infra.rabbit.fallback import Fallbacks
from infra.rabbit.publisher import Publisher
from infra.rabbit.subscription import Declare, Idle, Subscription
from infra.settings import Settings
from infra.transient import StoppingError, until_done

log = structlog.get_logger(__name__)

__all__ = ["Decided", "Idle", "Processor", "QueueConsumer", "Settle", "settle_of"]


@frozen_record
class Decided:
    """One delivery and its decision: what a processor returns for each delivery it was handed
    (and what the delivery pipeline's writer and log lines read of it)."""

    index: int
    """Its place in the batch."""
    raw: RawDelivery
    decoded: Decoded | None
    """None: bad input (it did not decode), or a processor that does not decode."""
    decision: Decision
    trace_id: str | None = None
    """The trace it was applied in (one it started, when it came without a `traceparent`)."""
    seconds: float | None = 0.0
    """The message's own share of its batch's time (its log line's `ms`; None: not decided
    in this run)."""

    @classmethod
    def of(cls, index: int, raw: RawDelivery, fate: Fate) -> Decided:
        """A decision that is its fate alone (the dead-letter ingester's)."""
        return cls(index, raw, None, Decision(fate), seconds=None)

    @property
    def fate(self) -> Fate:
        return self.decision.fate

    @property
    def error(self) -> str | None:
        """Why it is UNDECIDED (what its last-resort copy says)."""
        failure = self.decision.failure
        if self.decision.fate is not Fate.UNDECIDED or failure is None:
            return None
        return failure.summary


Processor = Callable[[Sequence[RawDelivery]], Awaitable[list[Decided]]]
"""Decides a batch of deliveries (often one): a `Decided` per delivery, in order."""


class Settle(enum.Enum):
    """What the transport does with a decided delivery: derived from its fate (`settle_of`)."""

    ACK = "ack"
    """Done with on the broker: applied, recorded, parked, scheduled again or buried."""
    GIVE_BACK = "give_back"
    """Back to the queue in its place: the channel is closed with it unacknowledged (a nack
    with requeue would send it to the back of a quorum queue)."""
    LAST_RESORT = "last_resort"
    """A confirmed copy to the dead-letter exchange first (infra/rabbit/last_resort.py), then
    the ack."""


def settle_of(fate: Fate) -> Settle:
    if fate is Fate.GIVEN_BACK:
        return Settle.GIVE_BACK
    return Settle.LAST_RESORT if fate is Fate.UNDECIDED else Settle.ACK


class QueueConsumer(Subscription, Fallbacks):
    def __init__(
        self,
        name: str,
        declare: Declare,
        settings: Settings,
        connection: AbstractRobustConnection,
        processor: Processor,
        dead_letters: Publisher | None,
        *,
        idle: Idle | None = None,
        idle_every: float = 2.0,
        batch_size: int = 1,
        batch_max: int | None = None,
        linger: float = 0.0,
        prefetch: int | None = None,
        lanes: int = 1,
        pausable: bool = False,
        ahead: Ahead | None = None,
    ) -> None:
        """`name`: the route (or queue) for logs and the DLX routing key; `declare`: makes the
        queue on a channel; `dead_letters`: where the last-resort copy goes (None: requeue after
        a pause instead); `idle`: called between deliveries at least every `idle_every` s;
        `processor` takes up to `batch_size` deliveries at once, waiting up to `linger` s, and
        up to `batch_max` (default: batch_size) when that many are buffered already;
        `lanes`: worker lanes (messages are spread over them by user, so each user's stay in
        order while different users are processed concurrently); `pausable`: it consumes a
        route, which `pkgq route pause` may pause (the dead-letter ingester has none);
        `ahead`: told of each delivery as it arrives (the processor may take it before its
        batch: DeliveryPipeline.take_ahead)."""
        self.name = name
        self.pausable = pausable
        self.consumer_name = route_of_key(name).rsplit(".", 1)[-1]
        self._declare = declare
        self._settings = settings
        self._connection = connection
        self._processor = processor
        self._ahead = ahead
        self._dead_letters = dead_letters
        self._idle = idle
        self._idle_every = idle_every
        self._batch_size = max(1, batch_size)
        self._batch_max = max(self._batch_size, batch_max or 0)
        self._linger = linger
        self._prefetch = prefetch or settings.prefetch
        self.lanes = max(1, lanes)
        self._lane_queues: list[asyncio.Queue[AmqpDelivery]] = []
        self._giving_back = asyncio.Lock()
        self.active = 0
        """Deliveries being processed right now, over all lanes."""
        self.max_active = 0
        """The most deliveries ever processed at once (a concurrency limit's witness)."""
        self._buffer: asyncio.Queue[AmqpDelivery] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.failed = asyncio.Event()
        """Set if the worker died: the process should exit non-zero and be restarted."""
        self._consumer_tag: str | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._queue: Any = None
        self._channel: Any = None
        self._paused = False
        self._in_hand = InHand()
        """Batches being processed or settled (a pause waits for them)."""
        self.processed = 0

    async def _run(self) -> None:
        if self.lanes == 1:
            await self._consume(self._buffer)
            return
        self._lane_queues = [asyncio.Queue() for _ in range(self.lanes)]
        workers = [
            asyncio.create_task(self._consume(q, idle=k == 0), name=f"lane{k}:{self.name}")
            for k, q in enumerate(self._lane_queues)
        ]
        try:
            while not self._stopping.is_set():
                getter = asyncio.ensure_future(self._buffer.get())
                stopper = asyncio.ensure_future(self._stopping.wait())
                await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                stopper.cancel()
                if not getter.done():
                    getter.cancel()
                    break
                message = getter.result()
                user = header_text(message.headers or {}, H_USER_ID, 64)  # never a table's str
                key = (user or "").encode()
                self._lane_queues[zlib.crc32(key) % self.lanes].put_nowait(message)
                for worker in workers:
                    if worker.done():
                        worker.result()  # a dead lane kills the consumer (raises)
        finally:
            results = await asyncio.gather(*workers, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException) and not isinstance(
                    result, asyncio.CancelledError
                ):
                    raise result

    async def _consume(self, source: asyncio.Queue[AmqpDelivery], *, idle: bool = True) -> None:
        """Process deliveries from `source` one by one, or in batches, in order."""
        if idle:
            await self._run_idle()
        last_idle = time.monotonic()
        while not self._stopping.is_set():
            if idle and self._idle is not None and time.monotonic() - last_idle >= self._idle_every:
                await self._run_idle()
                last_idle = time.monotonic()
            getter = asyncio.ensure_future(source.get())
            stopper = asyncio.ensure_future(self._stopping.wait())
            await asyncio.wait(
                {getter, stopper},
                timeout=self._idle_every if self._idle is not None else None,
                return_when=asyncio.FIRST_COMPLETED,
            )
            stopper.cancel()
            if not getter.done():
                getter.cancel()  # Queue.get gives up cleanly: nothing is taken
                continue  # stopping, or time for the idle task
            if self._stopping.is_set():
                break  # a delivery that raced the stop stays unacked: redelivered
            message = getter.result()
            batch = [m for m in await self._collect(source, message) if channel_open(m)]
            if not batch or self._paused:
                # Their channel died (the broker redelivers them on the new one), or a pause
                # began: its channel's close gives them back, in order.
                continue
            with self._in_hand:  # no await since the pause check: a pause waits for this
                if not await self._deliver(batch):
                    return  # stopping, or failed to subscribe again: the rest stays unacked

    async def _collect(
        self, source: asyncio.Queue[AmqpDelivery], first: AmqpDelivery
    ) -> list[AmqpDelivery]:
        """Up to `batch_size` deliveries: what is buffered, then whatever arrives within the
        linger (so a quiet queue waits at most `linger` seconds for company); beyond that, up
        to `batch_max` of what is buffered already, without waiting (a backlog drains in
        large batches, whose fixed statements cost less per delivery)."""
        batch = [first]
        while len(batch) < self._batch_max and not source.empty():
            batch.append(source.get_nowait())
        deadline = time.monotonic() + self._linger
        while len(batch) < self._batch_size:
            try:
                batch.append(source.get_nowait())
                continue
            except asyncio.QueueEmpty:
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._stopping.is_set():
                break
            try:
                batch.append(await asyncio.wait_for(source.get(), remaining))
            except TimeoutError:
                break
        return batch

    async def _deliver(self, messages: list[AmqpDelivery], *, alone: bool = False) -> bool:
        """Process deliveries (one or a batch) and settle them. False: shutdown began first
        (they stay unacked and are redelivered in order) or the consumer failed. `alone`: one
        of a failed batch's deliveries, acked by itself (an earlier one of the batch may be
        left unacked, and a `multiple` ack would take it along)."""
        started = time.perf_counter()
        raws = [m.raw for m in messages]
        route = route_of_key(self.name)
        in_flight = IN_FLIGHT.labels(route=route)
        in_flight.inc(len(messages))
        self._enter(len(messages))
        try:
            results = await until_done(lambda: self._processor(raws), self._stopping, route)
        except asyncio.CancelledError:
            raise
        except StoppingError:
            return False
        except Exception as exc:  # noqa: BLE001  (a bug in the processor: isolated below)
            return await self._undecided(messages, exc)
        finally:
            in_flight.dec(len(messages))
            self.active -= len(messages)
        faults.hit(faults.CONSUMER_AFTER_COMMIT, route=route)
        done, given_back = done_and_given_back(messages, results)
        # A delivery whose failure could not be recorded gets the last resort; the rest of the
        # batch keeps what was decided (each copy is acked once it is made).
        copies = [
            (m, r)
            for m, r in zip(done, results, strict=False)
            if settle_of(r.fate) is Settle.LAST_RESORT
        ]
        for message, result in copies:
            copied = await self._last_resort(message, RuntimeError(result.error))
            if not copied and self._stopping.is_set():
                return False  # it and the rest stay unacked: redelivered in order
        done = [m for m in done if all(m is not c for c, _ in copies)]
        await ack(done, in_order=self.lanes == 1 and not alone and not copies)
        if given_back:
            try:
                await self._give_back_or_fail()
            except StoppingError:
                return False
        self.processed += len(done)
        record(self.name, route, raws, results, started)
        return True

    def _enter(self, count: int) -> None:
        self.active += count
        self.max_active = max(self.max_active, self.active)


# Settling: the transport's part, derived from each decision.


def done_and_given_back(
    messages: Sequence[AmqpDelivery], results: Sequence[Decided]
) -> tuple[list[AmqpDelivery], int]:
    """The deliveries to ack, and how many go back to the queue (only a tail ever does)."""
    given_back = sum(1 for r in results if settle_of(r.fate) is Settle.GIVE_BACK)
    return list(messages[: len(messages) - given_back]), given_back


async def ack(messages: Sequence[AmqpDelivery], *, in_order: bool) -> None:
    """Ack the deliveries. `in_order`: every earlier tag on the channel is done too, so one
    `multiple` ack covers them (with worker lanes, other lanes hold earlier tags)."""
    if not messages:
        return
    try:
        if in_order:
            await messages[-1].ack(multiple=True)
        else:
            for message in messages:
                await message.ack()
    except Exception as exc:  # noqa: BLE001  (channel gone: the inbox absorbs the redelivery)
        log.warning("ack_failed", error=repr(exc))


def record(
    queue_name: str,
    route: str,
    raws: Sequence[RawDelivery],
    results: Sequence[Decided],
    started: float,
) -> None:
    """Metrics and one `processed` line per message (its fields are only worked out when the
    line is written: at level warning the batch costs a few counter increments)."""
    elapsed = time.perf_counter() - started
    share = elapsed / len(raws)
    histogram = PROCESSING.labels(route=route)
    for _ in raws:
        histogram.observe(share)
    for fate, count in collections.Counter(r.fate for r in results).items():
        MESSAGES.labels(route=route, outcome=fate.value).inc(count)
    if not log.is_enabled_for(logging.INFO):
        return
    batch_ms = round(elapsed * 1000, 2)
    for raw, result in zip(raws, results, strict=True):
        own = result.seconds
        log.info(
            "processed",
            route=queue_name,
            message_id=raw.message_id,
            # Headers are an outsider's data: text only, bounded (never a table's repr).
            user_id=header_text(raw.headers, H_USER_ID, 64),
            trace_id=result.trace_id or trace_id_of(header_text(raw.headers, H_TRACEPARENT, 256)),
            outcome=result.fate.value,
            batch=len(raws),
            ms=round(own * 1000, 2) if own is not None else None,
            batch_ms=batch_ms,
        )
