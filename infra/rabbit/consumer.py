"""The consumer loop of one queue: hand deliveries to the processor, then settle them.

Deliveries are taken in delivery order, one batch at a time per lane (prefetch only fills a local
buffer), so one user's messages on a route are applied in the order the broker holds them.
How they arrive in that buffer (the subscription, and what a reconnection, a broker-side cancel
or a give-back does to it) is infra/rabbit/subscription.py.

The processor (consumers/delivery/ for a route, consumers/ingest.py for the dead-letter queue)
decides in Postgres what becomes of each message and returns a `Result` per delivery; the loop
settles them all in one place (infra/rabbit/settle.py). What is left here:
- an outage (see infra/transient.py): retried in place with growing pauses, never acked, never
  skipped, so the next message cannot overtake it;
- a blip: retried briefly with tenacity;
- anything else (a bug in the failure path itself): a batch falls back to one delivery at a
  time, and a single delivery gets the last resort (infra/rabbit/last_resort.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aio_pika.abc import AbstractRobustConnection

from domain.delivery import Fate
from events.envelope import H_USER_ID, header_text
from events.partitioning import route_of_key
from infra import faults
from infra.observability import IN_FLIGHT, MESSAGES
from infra.rabbit import settle
from infra.rabbit.deliveries import AmqpDelivery, channel_open
from infra.rabbit.in_hand import InHand
from infra.rabbit.last_resort import copy_to_dead_letters
from infra.rabbit.outcomes import Processor, Result, Settle, settle_of
from infra.rabbit.publisher import Publisher
from infra.rabbit.subscription import Ahead, Declare, Subscription
from infra.settings import Settings
from infra.transient import StoppingError, until_done

log = structlog.get_logger(__name__)

Idle = Callable[[], Awaitable[object]]

__all__ = ["Processor", "QueueConsumer", "Result"]


class QueueConsumer(Subscription):
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

    @property
    def consuming(self) -> bool:
        """Subscribed on an open channel, or paused on purpose, and not stopping (/readyz)."""
        if self._stopping.is_set() or self.failed.is_set():
            return False
        return self._paused or (
            self._consumer_tag is not None
            and self._channel is not None
            and not self._channel.is_closed
        )

    async def start(self, *, paused: bool = False) -> None:
        """Subscribe and consume; `paused`: declare the queue only, until `resume`. A RabbitMQ
        connection lost meanwhile is an outage it waits out (StoppingError if `stop` is called
        meanwhile); only the broker's refusal (the queue declared with other arguments) raises."""
        self._paused = paused
        await self._set_up()  # a connection lost meanwhile is waited out
        self._worker = asyncio.create_task(self._run(), name=f"consume:{self.name}")
        self._worker.add_done_callback(self._worker_done)
        log.info("consuming", route=self.name, queue=self._queue.name, paused=paused)

    async def stop(self, *, hand_over: bool = False) -> None:
        """Stop taking deliveries, finish the one in hand, leave the rest to be redelivered.

        `hand_over`: another process's consumer waits on this queue (single-active-consumer)
        to take it over. Then no cancel comes first, which would make that one active while
        this one still holds deliveries: the batch in hand is settled first, and the channel's
        close gives the rest back in place and ends the subscription in one step."""
        self._stopping.set()
        if not hand_over and self._channel is not None and self._consumer_tag is not None:
            # Bounded: with the broker down, aio-pika would wait for a reconnect first.
            with contextlib.suppress(Exception):
                underlay = await asyncio.wait_for(self._channel.get_underlay_channel(), 2)
                await asyncio.wait_for(underlay.basic_cancel(self._consumer_tag), timeout=2)
        if self._worker is not None:
            try:
                await asyncio.wait_for(
                    asyncio.shield(self._worker), timeout=self._settings.drain_timeout
                )
            except Exception:  # noqa: BLE001  (a timeout, or the worker's own death: logged)
                log.warning("drain_timeout", route=self.name)
                self._worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._worker
        if self._channel is not None:
            with contextlib.suppress(Exception):  # unacked buffered deliveries go back, in order
                await asyncio.wait_for(self._channel.close(), timeout=2)

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
        done, given_back = settle.done_and_given_back(messages, results)
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
        await settle.ack(done, in_order=self.lanes == 1 and not alone and not copies)
        if given_back:
            try:
                await self._give_back_or_fail()
            except StoppingError:
                return False
        self.processed += len(done)
        settle.record(self.name, route, raws, results, started)
        return True

    async def _undecided(self, messages: list[AmqpDelivery], exc: Exception) -> bool:
        """The processor raised (a bug in its failure path): a batch falls back to one
        delivery at a time, so whatever is wrong is isolated to the message that causes it;
        a single delivery gets the last resort (a confirmed copy in the dead-letter queue)."""
        if len(messages) > 1:
            log.error("batch_failed_unexpectedly", size=len(messages), exc_info=exc)
            for message in messages:
                if self._stopping.is_set():
                    return False  # the rest stays unacked: redelivered, in order
                if not channel_open(message):
                    return True  # given back: the rest went back with it, in order
                with structlog.contextvars.bound_contextvars(message_id=message.message_id):
                    if not await self._deliver([message], alone=True):
                        return False
            return True
        message = messages[0]
        log.error("processing_failed_unexpectedly", message_id=message.message_id, exc_info=exc)
        if await self._last_resort(message, exc):
            MESSAGES.labels(route=route_of_key(self.name), outcome=Fate.BURIED.value).inc()
            return True
        return not self._stopping.is_set()  # left unacked: redelivered

    async def _last_resort(self, message: AmqpDelivery, exc: Exception) -> bool:
        """A confirmed copy of one delivery in the dead-letter queue, then its ack. False: no
        copy was made (stopping, its channel gone, or given back): it is redelivered."""
        try:
            copied = await copy_to_dead_letters(
                message,
                self._dead_letters,
                queue_name=self.name,
                consumer=self.consumer_name,
                reason="handler_error",
                exc=exc,
                stopping=self._stopping,
            )
        except Exception:
            log.exception("dead_letter_failed_unexpectedly")
            # Give it back rather than leave it unacked on the channel, where the next
            # batch's multiple-ack would take it along unprocessed.
            with contextlib.suppress(Exception):
                await message.nack(requeue=True)
            return False
        return copied

    def _enter(self, count: int) -> None:
        self.active += count
        self.max_active = max(self.max_active, self.active)

    async def _run_idle(self) -> None:
        if self._idle is None or self._paused:  # paused: the parked wait too
            return
        try:
            await self._idle()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001  (housekeeping: the next round tries again)
            log.warning("idle_task_failed", route=self.name, error=repr(exc))

    def _worker_done(self, task: asyncio.Task[None]) -> None:
        if self._stopping.is_set():
            return
        error = "cancelled" if task.cancelled() else repr(task.exception())
        log.critical("consumer_worker_died", route=self.name, error=error)
        self.failed.set()
