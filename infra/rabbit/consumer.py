"""The consumer loop of one route: decode, process in Postgres, then ack; or dead-letter.

Deliveries are handled one at a time, in delivery order (prefetch only fills a local buffer),
so one user's messages on a route are applied in the order the broker holds them.

Outcomes:
- processed or duplicate: ack after the transaction commits;
- bad input or a broken domain rule: copy to the dead-letter exchange with the reason in
  headers (confirmed), then ack; if that copy cannot be made, the message stays unacked and
  the copy is retried (it is never rejected into a DLX that might drop it);
- an outage (see infra/transient.py): retried in place with growing pauses, never acked, never
  skipped, so the next message cannot overtake it;
- a blip: retried briefly; any other error, or a blip that persists: dead-lettered with its
  type, message and traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import signal
import time
import traceback
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import structlog
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from aiormq.exceptions import ChannelInvalidStateError

from domain.errors import DomainError
from events.decoding import BadMessageError, Decoded, RawDelivery, decode
from events.envelope import H_DEAD_AT, H_DEAD_CONSUMER, H_DEAD_ERROR, H_DEAD_REASON
from events.routes import Route
from infra.rabbit.publisher import Publisher, build_message
from infra.rabbit.topology import declare_exchanges, declare_route_queue
from infra.settings import Settings
from infra.transient import is_outage, transient_retrying

log = structlog.get_logger(__name__)

BLOCKED_ALERT_AFTER_S = 300.0


class Outcome(enum.StrEnum):
    ACKED = "acked"
    DUPLICATE = "duplicate"
    DEAD_LETTERED = "dead_lettered"


Processor = Callable[[Decoded], Awaitable[Outcome]]


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
    )


class RouteConsumer:
    def __init__(
        self,
        route: Route,
        settings: Settings,
        connection: AbstractRobustConnection,
        processor: Processor,
        dead_letters: Publisher,
    ) -> None:
        self.route = route
        self.consumer_name = route.short_name
        self._settings = settings
        self._connection = connection
        self._processor = processor
        self._dead_letters = dead_letters
        self._buffer: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.failed = asyncio.Event()
        """Set if the worker died: the process should exit non-zero and be restarted."""
        self._consumer_tag: str | None = None
        self._queue: Any = None
        self._channel: Any = None
        self.processed = 0

    async def start(self) -> None:
        self._channel = await self._connection.channel(publisher_confirms=False)
        await self._channel.set_qos(prefetch_count=self._settings.prefetch)
        exchange, _ = await declare_exchanges(self._channel, self._settings)
        self._queue = await declare_route_queue(self._channel, self._settings, exchange, self.route)
        self._consumer_tag = await self._queue.consume(self._buffer.put)
        self._worker = asyncio.create_task(self._run(), name=f"consume:{self.route.name}")
        self._worker.add_done_callback(self._worker_done)
        log.info("consuming", route=self.route.name, queue=self._queue.name)

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
                log.warning("drain_timeout", route=self.route.name)
                self._worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._worker
        if self._channel is not None:
            with contextlib.suppress(Exception):  # unacked buffered deliveries go back, in order
                await asyncio.wait_for(self._channel.close(), timeout=2)

    async def _run(self) -> None:
        while not self._stopping.is_set():
            getter = asyncio.ensure_future(self._buffer.get())
            stopper = asyncio.ensure_future(self._stopping.wait())
            done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                break
            stopper.cancel()
            message = getter.result()
            if not _channel_open(message):
                continue  # its channel died; the broker redelivers it on the new one
            with structlog.contextvars.bound_contextvars(
                route=self.route.name, message_id=message.message_id
            ):
                try:
                    await self._handle(message)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.exception("delivery_failed_unexpectedly")
                    try:
                        await self._dead_letter(message, "handler_error", exc)
                    except Exception:
                        log.exception("dead_letter_failed_unexpectedly")

    def _worker_done(self, task: asyncio.Task[None]) -> None:
        if self._stopping.is_set():
            return
        error = "cancelled" if task.cancelled() else repr(task.exception())
        log.critical("consumer_worker_died", route=self.route.name, error=error)
        self.failed.set()

    async def _handle(self, message: AbstractIncomingMessage) -> None:
        started = time.perf_counter()
        try:
            decoded = decode(
                self.route, raw_delivery(message), max_body_bytes=self._settings.max_body_bytes
            )
        except BadMessageError as exc:
            await self._dead_letter(message, exc.reason, exc)
            return
        structlog.contextvars.bind_contextvars(user_id=str(decoded.envelope.user_id))
        try:
            outcome = await self._process_until_done(decoded)
        except asyncio.CancelledError:
            raise
        except DomainError as exc:
            await self._dead_letter(message, "domain_rule", exc)
            return
        except _StoppingError:
            return  # left unacked: redelivered after the restart
        except Exception as exc:  # noqa: BLE001  (any handler bug is dead-lettered, never lost)
            await self._dead_letter(message, "handler_error", exc)
            return
        if self._settings.fault_kill_after_commit == self.route.name:
            os.kill(os.getpid(), signal.SIGKILL)  # crash test: committed, not acked
        await self._ack(message)
        self.processed += 1
        log.info(
            "processed",
            outcome=outcome.value,
            ms=round((time.perf_counter() - started) * 1000, 2),
        )

    async def _process_until_done(self, decoded: Decoded) -> Outcome:
        """Retry blips briefly with tenacity; wait out outages with pauses until it works."""
        pause = 1.0
        blocked_since = time.monotonic()
        while True:
            try:
                async for attempt in transient_retrying():
                    with attempt:
                        return await self._processor(decoded)
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
        headers = dict(message.headers or {})
        headers.update(
            {
                H_DEAD_REASON: reason,
                H_DEAD_ERROR: f"{type(exc).__name__}: {exc}"[:4000],
                H_DEAD_CONSUMER: self.consumer_name,
                H_DEAD_AT: datetime.now(UTC).isoformat(),
                "x-pkgq-dead-traceback": "".join(traceback.format_exception(exc))[-8000:],
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
                await self._dead_letters.publish(copy, self.route.name)
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


def _channel_open(message: AbstractIncomingMessage) -> bool:
    try:
        return not message.channel.is_closed
    except ChannelInvalidStateError:  # aio-pika raises once the channel is closed
        return False


class _StoppingError(Exception):
    """Shutdown began while waiting for the infrastructure to come back."""
