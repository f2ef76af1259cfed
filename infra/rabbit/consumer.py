"""The consumer loop of one queue: hand each delivery to its processor, then ack.

Deliveries are handled one at a time, in delivery order (prefetch only fills a local buffer),
so one user's messages on a route are applied in the order the broker holds them.

The processor (consumers/delivery.py for a route, consumers/ingest.py for the dead-letter queue)
decides in Postgres what becomes of the message: applied, duplicate, parked, scheduled for a
retry, or buried in the dead-letter store. Each of those is acked once its transaction commits.
What is left here:
- an outage (see infra/transient.py): retried in place with growing pauses, never acked, never
  skipped, so the next message cannot overtake it;
- a blip: retried briefly with tenacity;
- anything else (a bug in the failure path itself): the message is copied to the dead-letter
  exchange with the error in headers (confirmed), then acked; the dead-letter ingester files
  the copy in the store. If the copy cannot be made, the message stays unacked and the copy is
  retried: it is never rejected into a DLX that might drop it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import signal
import time
import traceback
import zlib
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, TypeVar

import structlog
from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)
from aiormq.exceptions import ChannelInvalidStateError

from events.decoding import RawDelivery
from events.envelope import (
    H_DEAD_AT,
    H_DEAD_CONSUMER,
    H_DEAD_ERROR,
    H_DEAD_REASON,
    H_DEAD_TRACEBACK,
    H_TRACEPARENT,
    H_USER_ID,
)
from events.partitioning import route_of_key
from events.routes import Route
from infra.observability import IN_FLIGHT, MESSAGES, PROCESSING
from infra.rabbit.publisher import Publisher, build_message
from infra.rabbit.topology import declare_exchanges, declare_route_queue, route_queues
from infra.settings import Settings
from infra.tracing import trace_id_of
from infra.transient import is_outage, transient_retrying

log = structlog.get_logger(__name__)

BLOCKED_ALERT_AFTER_S = 300.0


class Outcome(enum.StrEnum):
    ACKED = "acked"
    DUPLICATE = "duplicate"
    DEAD_LETTERED = "dead_lettered"
    RETRY_SCHEDULED = "retried"
    PARKED = "parked"
    RELEASED = "released"
    """Given back to the queue in its place (the handler ran past the route's TTR)."""
    CANCELLED = "cancelled"
    """A member of a cancelled group: acknowledged without running the handler."""
    EXPIRED = "expired"
    """Delivered after its TTL: recorded as expired in the dead-letter store, not applied."""


MESSAGE_TIMES: ContextVar[dict[int, float] | None] = ContextVar("pkgq_message_times", default=None)
"""Set by the consumer around a batch: the processor records, by delivery index, the seconds
each message of the batch took on its own (its log line's `ms`; the batch's is `batch_ms`)."""
MESSAGE_TRACES: ContextVar[dict[str, str] | None] = ContextVar("pkgq_message_traces", default=None)
"""Set by the consumer around its processing: the processor records, by message_id, the trace
a message was applied in (one it started, when it came without a `traceparent`)."""

Processor = Callable[[RawDelivery], Awaitable[Outcome]]
BatchProcessor = Callable[[Sequence[RawDelivery]], Awaitable[list[Outcome]]]
T = TypeVar("T")
Declare = Callable[[AbstractChannel], Awaitable[AbstractQueue]]
Idle = Callable[[], Awaitable[object]]


def raw_delivery(message: AbstractIncomingMessage) -> RawDelivery:
    ts = message.timestamp
    if ts is not None and ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return RawDelivery(
        body=message.body,
        message_id=message.message_id,
        message_type=message.type,
        content_type=message.content_type,
        timestamp=ts,
        headers=dict(message.headers or {}),
        routing_key=message.routing_key,
    )


class QueueConsumer:
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
        batch: BatchProcessor | None = None,
        batch_size: int = 1,
        linger: float = 0.0,
        prefetch: int | None = None,
        lanes: int = 1,
    ) -> None:
        """`name`: the route (or queue) for logs and the DLX routing key; `declare`: makes the
        queue on a channel; `dead_letters`: where the last-resort copy goes (None: requeue after
        a pause instead); `idle`: called between deliveries at least every `idle_every` s;
        `batch`: processes up to `batch_size` deliveries at once, waiting up to `linger` s;
        `lanes`: worker lanes (messages are spread over them by user, so each user's stay in
        order while different users are processed concurrently)."""
        self.name = name
        self.consumer_name = route_of_key(name).rsplit(".", 1)[-1]
        self._declare = declare
        self._settings = settings
        self._connection = connection
        self._processor = processor
        self._dead_letters = dead_letters
        self._idle = idle
        self._idle_every = idle_every
        self._batch = batch
        self._batch_size = batch_size
        self._linger = linger
        self._prefetch = prefetch or settings.prefetch
        self.lanes = max(1, lanes)
        self._lane_queues: list[asyncio.Queue[AbstractIncomingMessage]] = []
        self._giving_back = asyncio.Lock()
        self.active = 0
        """Deliveries being processed right now, over all lanes."""
        self.max_active = 0
        """The most deliveries ever processed at once (a concurrency limit's witness)."""
        self._buffer: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.failed = asyncio.Event()
        """Set if the worker died: the process should exit non-zero and be restarted."""
        self._consumer_tag: str | None = None
        self._queue: Any = None
        self._channel: Any = None
        self.processed = 0

    @property
    def consuming(self) -> bool:
        """Subscribed, on an open channel, and not stopping (for /readyz)."""
        return (
            self._consumer_tag is not None
            and not self._stopping.is_set()
            and not self.failed.is_set()
            and self._channel is not None
            and not self._channel.is_closed
        )

    async def start(self) -> None:
        await self._subscribe()
        self._worker = asyncio.create_task(self._run(), name=f"consume:{self.name}")
        self._worker.add_done_callback(self._worker_done)
        log.info("consuming", route=self.name, queue=self._queue.name)

    async def _subscribe(self) -> None:
        self._channel = await self._connection.channel(publisher_confirms=False)
        await self._channel.set_qos(prefetch_count=max(self._prefetch, self._batch_size))
        self._queue = await self._declare(self._channel)
        self._consumer_tag = await self._queue.consume(self._buffer.put)

    async def _give_back(self) -> None:
        """Return every unacknowledged delivery of this consumer to the queue in its original
        place, by closing the channel (a nack with requeue would send it to the back of a quorum
        queue), then subscribe again on a new channel."""
        async with self._giving_back:
            old = self._channel
            self._consumer_tag = None
            with contextlib.suppress(Exception):
                await asyncio.wait_for(old.close(), timeout=5)
            # What was buffered came on the closed channel and is back in the queue: drop it.
            for queue in (self._buffer, *self._lane_queues):
                kept = []
                while not queue.empty():
                    message = queue.get_nowait()
                    if _channel_open(message):
                        kept.append(message)
                for message in kept:
                    queue.put_nowait(message)
            if not self._stopping.is_set():
                await self._subscribe()
            log.info("given_back", route=self.name)

    async def _give_back_or_fail(self) -> None:
        """Give the deliveries back; if that breaks (no new channel), the consumer is failed,
        so the process exits and is restarted: what it held is back on the queue either way,
        and is never dead-lettered for it."""
        try:
            await self._give_back()
        except Exception:
            log.exception("give_back_failed", route=self.name)
            self.failed.set()
            raise _StoppingError from None

    async def stop(self) -> None:
        """Stop taking deliveries, finish the one in hand, leave the rest to be redelivered."""
        self._stopping.set()
        if self._queue is not None and self._consumer_tag is not None:
            # Bounded: with the broker down, aio-pika would wait for a reconnect first.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._queue.cancel(self._consumer_tag), timeout=2)
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
                user = (message.headers or {}).get(H_USER_ID)
                key = user if isinstance(user, bytes) else str(user or "").encode()
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

    async def _consume(
        self, source: asyncio.Queue[AbstractIncomingMessage], *, idle: bool = True
    ) -> None:
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
            if self._batch is not None and self._batch_size > 1:
                batch = [m for m in await self._collect(source, message) if _channel_open(m)]
                if len(batch) > 1:
                    await self._handle_batch(batch)
                    continue
                if not batch:
                    continue
                message = batch[0]
            if not _channel_open(message):
                continue  # its channel died; the broker redelivers it on the new one
            with structlog.contextvars.bound_contextvars(
                route=self.name, message_id=message.message_id
            ):
                try:
                    await self._handle(message)
                except asyncio.CancelledError:
                    raise
                except _StoppingError:
                    return  # it could not subscribe again after a give-back: failed
                except Exception as exc:
                    log.exception("delivery_failed_unexpectedly")
                    try:
                        await self._dead_letter(message, "handler_error", exc)
                    except Exception:
                        log.exception("dead_letter_failed_unexpectedly")
                        # Give it back rather than leave it unacked on the channel, where the
                        # next batch's multiple-ack would take it along unprocessed.
                        with contextlib.suppress(Exception):
                            await message.nack(requeue=True)

    async def _collect(
        self, source: asyncio.Queue[AbstractIncomingMessage], first: AbstractIncomingMessage
    ) -> list[AbstractIncomingMessage]:
        """Up to `batch_size` deliveries: what is buffered, then whatever arrives within the
        linger (so a quiet queue waits at most `linger` seconds for company)."""
        batch = [first]
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

    async def _handle_batch(self, messages: list[AbstractIncomingMessage]) -> None:
        """One transaction for the batch, then one ack for all of it (`multiple`)."""
        assert self._batch is not None
        started = time.perf_counter()
        raws = [raw_delivery(m) for m in messages]
        batch = self._batch
        in_flight = IN_FLIGHT.labels(route=route_of_key(self.name))
        in_flight.inc(len(messages))
        self._enter(len(messages))
        failure: Exception | None = None
        times: dict[int, float] = {}
        traces: dict[str, str] = {}
        token = MESSAGE_TIMES.set(times)
        traces_token = MESSAGE_TRACES.set(traces)
        try:
            outcomes = await self._process_until_done(lambda: batch(raws))
        except asyncio.CancelledError:
            raise
        except _StoppingError:
            return  # left unacked: redelivered after the restart
        except Exception as exc:  # noqa: BLE001  (handled below, one delivery at a time)
            failure = exc
        finally:
            MESSAGE_TIMES.reset(token)
            MESSAGE_TRACES.reset(traces_token)
            in_flight.dec(len(messages))
            self.active -= len(messages)
        if failure is not None:
            # A bug in the batch path: fall back to one delivery at a time, so whatever is
            # wrong is isolated to the message that causes it.
            log.error("batch_failed_unexpectedly", size=len(messages), exc_info=failure)
            for message in messages:
                if not _channel_open(message):
                    return  # given back (a TTR): the rest went back with it, in order
                with structlog.contextvars.bound_contextvars(message_id=message.message_id):
                    if not await self._handle(message):
                        return  # stopping: it and the rest stay unacked, redelivered in order
            return
        if self._settings.fault_kill_after_commit == route_of_key(self.name):
            os.kill(os.getpid(), signal.SIGKILL)  # crash test: committed, not acked
        given_back = [m for m, o in zip(messages, outcomes, strict=True) if o is Outcome.RELEASED]
        done = messages[: len(messages) - len(given_back)]  # only a tail is ever given back
        if done:
            await self._ack_all(done)
        if given_back:
            await self._give_back_or_fail()
        self.processed += len(done)
        elapsed = time.perf_counter() - started
        ms = round(elapsed * 1000, 2)
        route = route_of_key(self.name)
        for outcome in outcomes:
            MESSAGES.labels(route=route, outcome=outcome.value).inc()
            PROCESSING.labels(route=route).observe(elapsed / len(messages))
        for index, (message, outcome, raw) in enumerate(zip(messages, outcomes, raws, strict=True)):
            own = times.get(index)
            log.info(
                "processed",
                route=self.name,
                message_id=message.message_id,
                user_id=str(raw.headers.get(H_USER_ID, "")),
                trace_id=traces.get(str(message.message_id))
                or trace_id_of(_text(raw.headers.get(H_TRACEPARENT))),
                outcome=outcome.value,
                batch=len(messages),
                ms=round(own * 1000, 2) if own is not None else None,
                batch_ms=ms,
            )

    async def _ack_all(self, messages: list[AbstractIncomingMessage]) -> None:
        try:
            if self.lanes == 1:
                # Deliveries are handled in order, so every earlier tag on the channel is done.
                await messages[-1].ack(multiple=True)
            else:  # other lanes hold earlier tags that are not done yet
                for message in messages:
                    await message.ack()
        except Exception as exc:  # noqa: BLE001  (channel gone: the inbox absorbs the redelivery)
            log.warning("ack_failed", error=repr(exc))

    def _enter(self, count: int) -> None:
        self.active += count
        self.max_active = max(self.max_active, self.active)

    async def _run_idle(self) -> None:
        if self._idle is None:
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

    async def _handle(self, message: AbstractIncomingMessage) -> bool:
        """Process one delivery. False: shutdown began first and it was left unacked. Its log
        lines carry its route, message_id, user_id and trace_id (bound from context)."""
        raw = raw_delivery(message)
        with structlog.contextvars.bound_contextvars(
            user_id=_text(raw.headers.get(H_USER_ID)),
            trace_id=trace_id_of(_text(raw.headers.get(H_TRACEPARENT))),
        ):
            return await self._handle_bound(message, raw)

    async def _handle_bound(self, message: AbstractIncomingMessage, raw: RawDelivery) -> bool:
        started = time.perf_counter()
        route = route_of_key(self.name)
        self._enter(1)
        traces: dict[str, str] = {}
        traces_token = MESSAGE_TRACES.set(traces)
        try:
            with IN_FLIGHT.labels(route=route).track_inprogress():
                outcome = await self._process_until_done(lambda: self._processor(raw))
        except asyncio.CancelledError:
            raise
        except _StoppingError:
            return False  # left unacked: redelivered after the restart
        except Exception as exc:
            log.exception("processing_failed_unexpectedly")
            await self._dead_letter(message, "handler_error", exc)
            MESSAGES.labels(route=route, outcome=Outcome.DEAD_LETTERED.value).inc()
            return True
        finally:
            self.active -= 1
            MESSAGE_TRACES.reset(traces_token)
        MESSAGES.labels(route=route, outcome=outcome.value).inc()
        PROCESSING.labels(route=route).observe(time.perf_counter() - started)
        if outcome is Outcome.RELEASED:
            await self._give_back_or_fail()
            return True
        if self._settings.fault_kill_after_commit == route_of_key(self.name):
            os.kill(os.getpid(), signal.SIGKILL)  # crash test: committed, not acked
        await self._ack(message)
        self.processed += 1
        elapsed_ms = round((time.perf_counter() - started) * 1000, 2)
        log.info(
            "processed",
            route=self.name,
            message_id=message.message_id,
            user_id=_text(raw.headers.get(H_USER_ID)),
            trace_id=traces.get(str(message.message_id))
            or trace_id_of(_text(raw.headers.get(H_TRACEPARENT))),
            outcome=outcome.value,
            batch=1,
            ms=elapsed_ms,
            batch_ms=elapsed_ms,
        )
        return True

    async def _process_until_done(self, call: Callable[[], Awaitable[T]]) -> T:
        """Retry blips briefly with tenacity; wait out outages with pauses until it works."""
        pause = 1.0
        blocked_since = time.monotonic()
        while True:
            try:
                async for attempt in transient_retrying():
                    with attempt:
                        return await call()
            except Exception as exc:
                if not is_outage(exc):
                    raise
                if self._stopping.is_set():
                    raise _StoppingError from exc
                blocked_for = time.monotonic() - blocked_since
                # Loud after a while: an outage that lasts may be a deployment mistake (a
                # schema never migrated), and every later message on the route waits behind it.
                level = log.error if blocked_for > BLOCKED_ALERT_AFTER_S else log.warning
                level(
                    "infrastructure_unavailable",
                    error=repr(exc),
                    retry_in_s=pause,
                    blocked_for_s=round(blocked_for),
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=pause)
                pause = min(pause * 2, 30.0)

    async def _ack(self, message: AbstractIncomingMessage) -> None:
        try:
            await message.ack()
        except Exception as exc:  # noqa: BLE001  (channel gone: the inbox absorbs the redelivery)
            log.warning("ack_failed", error=repr(exc))

    async def _dead_letter(
        self, message: AbstractIncomingMessage, reason: str, exc: BaseException
    ) -> None:
        if self._dead_letters is None:
            # The dead-letter queue's own consumer: give it back, after a pause, to try again.
            log.error("requeued_after_failure", error=repr(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=5)
            with contextlib.suppress(Exception):
                await message.nack(requeue=True)
            return
        headers = dict(message.headers or {})
        headers.update(
            {
                H_DEAD_REASON: reason,
                H_DEAD_ERROR: f"{type(exc).__name__}: {exc}"[:4000],
                H_DEAD_CONSUMER: self.consumer_name,
                H_DEAD_AT: datetime.now(UTC).isoformat(),
                H_DEAD_TRACEBACK: "".join(traceback.format_exception(exc))[-8000:],
            }
        )
        copy = build_message(
            message.body,
            message_id=message.message_id or "",
            message_type=message.type,
            headers=headers,
            content_type=message.content_type,
            timestamp=message.timestamp,
        )
        pause = 1.0
        while True:
            try:
                await self._dead_letters.publish(copy, self.name)
                break
            except Exception as publish_error:  # noqa: BLE001  (kept unacked, retried)
                # Never reject or ack a message that has no confirmed copy in the dead-letter
                # queue: if the DLX is unroutable the broker would drop it.
                log.error(  # noqa: TRY400  (expected and retried: no traceback wanted)
                    "dead_letter_publish_failed", error=repr(publish_error), retry_in_s=pause
                )
                if self._stopping.is_set() or not _channel_open(message):
                    return  # unacked: redelivered, and dead-lettered again then
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=pause)
                pause = min(pause * 2, 30.0)
        await self._ack(message)
        log.warning(
            "dead_lettered", outcome=Outcome.DEAD_LETTERED.value, reason=reason, error=str(exc)
        )


def _text(value: object) -> str | None:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return None if value is None else str(value)


def _channel_open(message: AbstractIncomingMessage) -> bool:
    try:
        return not message.channel.is_closed
    except ChannelInvalidStateError:  # aio-pika raises once the channel is closed
        return False


class _StoppingError(Exception):
    """Shutdown began while waiting for the infrastructure to come back."""


def route_consumer(
    route: Route,
    settings: Settings,
    connection: AbstractRobustConnection,
    processor: Processor,
    dead_letters: Publisher,
    *,
    idle: Idle | None = None,
    batch: BatchProcessor | None = None,
    partition: int = 0,
) -> QueueConsumer:
    """The consumer of one partition of a route: `pkgq.<route>` or `pkgq.<route>.p<k>`."""

    async def declare(channel: AbstractChannel) -> AbstractQueue:
        exchange, _ = await declare_exchanges(channel, settings)
        return await declare_route_queue(channel, settings, exchange, route, partition)

    _, key = route_queues(settings, route.name)[partition]
    return QueueConsumer(
        key,
        declare,
        settings,
        connection,
        processor,
        dead_letters,
        idle=idle,
        idle_every=settings.release_poll_interval,
        batch=batch,
        batch_size=settings.batch_size_for(route.name) if batch is not None else 1,
        linger=settings.batch_linger_ms / 1000,
        prefetch=settings.prefetch_for(route.name),
        lanes=settings.concurrency_for(route.name),
    )
