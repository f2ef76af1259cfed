"""A consumer's subscription to its queue: the channel it takes deliveries on, subscribing
again after a reconnection or a broker-side cancel, and giving back what it holds.

Deliveries are taken from aiormq directly (infra/rabbit/deliveries.AmqpDelivery), not through
aio-pika's consume, whose message object and Task per delivery cost about a tenth of a busy
consumer's CPU; the channel is aio-pika's robust one, which reopens after a reconnection (with
its QoS and queue), and the subscription is then made again on it. What was buffered came on
the old channel and is dropped unacknowledged: the broker redelivers it, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import aiormq.abc
import structlog
from aio_pika.abc import AbstractChannel, AbstractQueue, AbstractRobustConnection

from infra.rabbit.deliveries import Ahead, AmqpDelivery, Handover, InHand, channel_open
from infra.rabbit.setting_up import lost_with_connection, through_outages
from infra.settings import Settings
from infra.transient import StoppingError, is_transient

log = structlog.get_logger(__name__)

Declare = Callable[[AbstractChannel], Awaitable[AbstractQueue]]
Idle = Callable[[], Awaitable[object]]


class Subscription:
    """The subscription half of infra/rabbit/consumer.QueueConsumer (which sets these): its
    start and stop, its pause, and its channel's ups and downs."""

    name: str
    _declare: Declare
    _settings: Settings
    _connection: AbstractRobustConnection
    _prefetch: int
    _batch_size: int
    _buffer: asyncio.Queue[AmqpDelivery]
    _ahead: Ahead | None
    _lane_queues: list[asyncio.Queue[AmqpDelivery]]
    _giving_back: asyncio.Lock
    _stopping: asyncio.Event
    failed: asyncio.Event
    _consumer_tag: str | None
    _background: set[asyncio.Task[None]]
    _queue: Any
    _channel: Any
    _paused: bool
    _in_hand: InHand
    _worker: asyncio.Task[None] | None
    _idle: Idle | None

    async def _run(self) -> None:
        """The consumer loop (QueueConsumer's)."""
        raise NotImplementedError

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
            try:  # unacked buffered deliveries go back, in order
                await asyncio.wait_for(self._channel.close(), timeout=2)
            except Exception as exc:  # noqa: BLE001  (said: the broker may keep the subscription)
                # Until the connection goes, the broker may keep this subscription active with
                # nobody behind it: what it holds waits, and a standby stays a standby.
                log.warning("channel_close_failed", route=self.name, error=repr(exc))

    @property
    def closed(self) -> bool:
        """Whether its channel is closed (after `stop`: the broker gave back what it held)."""
        return self._channel is None or bool(self._channel.is_closed)

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

    async def pause(self) -> None:
        """Stop consuming and keep the queue (`pkgq route pause`): cancel the subscription, let
        the batch in hand be processed and settled, then give back what is buffered by closing
        the channel (back in its place, in order). Until `resume`, nothing subscribes again,
        not even after a reconnection. Does nothing if paused already."""
        if self._paused:
            return
        self._paused = True
        async with self._giving_back:
            tag, self._consumer_tag = self._consumer_tag, None
            if self._channel is not None and tag is not None:
                with contextlib.suppress(Exception):  # bounded: the broker may be down
                    underlay = await asyncio.wait_for(self._channel.get_underlay_channel(), 2)
                    await asyncio.wait_for(underlay.basic_cancel(tag), timeout=2)
            await self._settled(self._settings.drain_timeout)
            if self._channel is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._channel.close(), timeout=5)
            self._drop_buffered()
        log.info("consumer_paused", route=self.name)

    async def resume(self) -> None:
        """Subscribe again after `pause`. With the broker away (a restart, a lost node) it
        returns at once and subscribes once the broker is back, however long that takes, as
        the robust connection restores a subscription after any outage: never a reason to exit
        (nor to hold up the pause watch, which obeys a pause written meanwhile). Only a failure
        that is no outage (the queue declared anew with other arguments) fails the consumer."""
        if not self._paused:
            return
        self._paused = False
        if await self._resubscribe():
            return
        log.warning("resume_waiting_for_broker", route=self.name)
        self._in_background(self._resubscribe_once_back(), f"resume:{self.name}")

    def _in_background(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run `work` as a task the subscription keeps until it ends."""
        task = asyncio.create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _stopping_or_connected(self, at_most: float | None = None) -> None:
        """Wait until a stop is asked for or the connection is up (at most `at_most` s)."""
        stopping = asyncio.ensure_future(self._stopping.wait())
        connected = asyncio.ensure_future(self._connection.ready())
        try:
            await asyncio.wait(
                {stopping, connected}, timeout=at_most, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopping.cancel()
            connected.cancel()

    def _resubscribed_or_unwanted(self) -> bool:
        """Subscribed already, or no subscription is wanted now (paused again, stopping)."""
        return self._stopping.is_set() or self._paused or self._consumer_tag is not None

    async def _resubscribe(self) -> bool:
        """One attempt to subscribe after a pause. False: the broker is away (try again once
        it is back); True: done (subscribed, no longer wanted, or failed for good)."""
        if self._resubscribed_or_unwanted():
            return True
        if not self._connection.connected.is_set():
            return False
        async with self._giving_back:
            if self._resubscribed_or_unwanted():
                return True
            try:
                await self._subscribe()
            except Exception as exc:
                if self._channel is not None:  # half made: not to be restored beside the next
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(self._channel.close(), timeout=2)
                if is_transient(exc):
                    return False
                log.exception("resume_failed", route=self.name)
                self.failed.set()
                return True
        log.info("consumer_resumed", route=self.name)
        return True

    async def _resubscribe_once_back(self) -> None:
        while not await self._resubscribe():
            with contextlib.suppress(TimeoutError):  # a breath between attempts
                await asyncio.wait_for(self._stopping.wait(), timeout=0.5)
            await self._stopping_or_connected()

    @property
    def paused(self) -> bool:
        return self._paused

    async def _settled(self, at_most: float) -> None:
        """Wait (up to `at_most` s) until no batch is being processed or settled."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._in_hand.emptied(), at_most)

    async def _set_up(self) -> None:
        """The first subscription (paused: the queue's declaration only). A connection lost
        meanwhile is waited out and the setup made again from the start once it is back, the
        half-made channel discarded (infra/rabbit/setting_up.py); a broker's refusal (the queue
        declared with other arguments) raises. StoppingError: stopped while it waited."""

        async def step() -> None:
            if self._paused:
                await self._declare_only()
            else:
                await self._subscribe()

        await through_outages(
            self._connection,
            step,
            self._stopping,
            what=f"consumer of {self.name}",
            undo=self._discard_channel,
        )

    async def _discard_channel(self) -> None:
        """Close a channel whose setup failed: not to be restored beside the next one."""
        channel, self._channel, self._consumer_tag = self._channel, None, None
        if channel is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(channel.close(), timeout=2)

    async def _declare_only(self) -> None:
        """Start paused: the queue exists (publishers' messages are kept), nobody consumes."""
        channel = await self._connection.channel(publisher_confirms=False)
        try:
            self._queue = await self._declare(channel)
        finally:
            await channel.close()

    async def _subscribe(self) -> None:
        self._channel = await self._connection.channel(publisher_confirms=False)
        await self._channel.set_qos(prefetch_count=max(self._prefetch, self._batch_size))
        self._queue = await self._declare(self._channel)
        # The channel is robust: after a reconnection it is opened again (with its QoS and
        # queue), and then the subscription is made again on it.
        self._channel.reopen_callbacks.add(self._consume_again)
        await self._take_deliveries()

    async def _take_deliveries(self) -> None:
        """Subscribe on the channel's current AMQP channel, taking deliveries from aiormq
        directly (infra/rabbit/deliveries.AmqpDelivery)."""
        underlay: aiormq.abc.AbstractChannel = await self._channel.get_underlay_channel()
        underlay.on_consumer_cancel_callbacks.add(self._cancelled_by_broker)
        handover = Handover(self._buffer, self._ahead)
        ok = await underlay.basic_consume(self._queue.name, handover)  # type: ignore[arg-type]
        self._consumer_tag = ok.consumer_tag

    async def _consume_again(self, *_: object) -> None:
        """After a reconnection: subscribe again (what was buffered came on the old channel
        and is dropped unacked: the broker redelivers it, in order)."""
        if self._stopping.is_set() or self._paused:
            return
        try:
            await self._take_deliveries()
        except Exception as exc:
            if lost_with_connection(self._connection, exc):
                # Lost again as it came back (a flapping network): what was delivered on it
                # is redelivered; subscribe again on a new channel once the connection is up.
                log.warning("resubscribe_interrupted", route=self.name, error=repr(exc))
                self._in_background(self._resubscribe_after_cancel(), f"again:{self.name}")
                return
            log.exception("resubscribe_failed", route=self.name)
            self.failed.set()  # the process exits and is restarted: nothing is lost

    def _cancelled_by_broker(self, frame: Any) -> None:
        """The broker ended the subscription (its queue deleted or converted): give back what
        is held and subscribe again, as for a TTR overrun."""
        if frame.consumer_tag != self._consumer_tag or self._stopping.is_set():
            return
        log.warning("consumer_cancelled_by_broker", route=self.name)
        self._consumer_tag = None
        self._in_background(self._resubscribe_after_cancel(), f"cancel:{self.name}")

    async def _resubscribe_after_cancel(self) -> None:
        with contextlib.suppress(StoppingError):
            await self._give_back_or_fail()

    async def _give_back(self) -> None:
        """Return every unacknowledged delivery of this consumer to the queue in its original
        place, by closing the channel (a nack with requeue would send it to the back of a quorum
        queue), then subscribe again on a new channel."""
        async with self._giving_back:
            old = self._channel
            self._consumer_tag = None
            with contextlib.suppress(Exception):
                await asyncio.wait_for(old.close(), timeout=5)
            self._drop_buffered()
            if self._paused:  # paused meanwhile: it subscribes again on resume
                return
            await self._subscribe_when_connected()
            log.info("given_back", route=self.name)

    def _drop_buffered(self) -> None:
        """What was buffered on a closed channel is back in the queue: drop it here."""
        for queue in (self._buffer, *self._lane_queues):
            kept = []
            while not queue.empty():
                message = queue.get_nowait()
                if channel_open(message):
                    kept.append(message)
            for message in kept:
                queue.put_nowait(message)

    async def _subscribe_when_connected(self) -> None:
        """Subscribe again, unless stopping or paused. After a lost node, a broker restart or a
        network fault the connection may still be reconnecting (or just about to notice it is
        gone): that is waited out, however long it lasts (infra/rabbit/setting_up.py), and a
        stop ends the wait at once. A broker's refusal raises."""

        async def step() -> None:
            if not self._paused:
                await self._subscribe()

        with contextlib.suppress(StoppingError):
            await through_outages(
                self._connection,
                step,
                self._stopping,
                what=f"consumer of {self.name}",
                undo=self._discard_channel,
            )

    async def _give_back_or_fail(self) -> None:
        """Give the deliveries back; if that breaks (the broker refuses the new subscription:
        an outage is waited out), the consumer is failed, so the process exits and is
        restarted: what it held is back on the queue either way,
        and is never dead-lettered for it."""
        try:
            await self._give_back()
        except Exception:
            log.exception("give_back_failed", route=self.name)
            self.failed.set()
            raise StoppingError from None
