"""When a consumer's processor itself raises (a bug in its failure path, not a failure of a
message, which the processor records): a batch falls back to one delivery at a time, and a
single delivery gets the last resort, a confirmed copy in the dead-letter queue
(infra/rabbit/last_resort.py). Off the way of a message that is decided."""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from domain.delivery import Fate
from events.partitioning import route_of_key
from infra.observability import MESSAGES
from infra.rabbit.deliveries import AmqpDelivery, channel_open
from infra.rabbit.last_resort import copy_to_dead_letters
from infra.rabbit.publisher import Publisher

log = structlog.get_logger(__name__)


class Fallbacks:
    """The fallback half of infra/rabbit/consumer.QueueConsumer (which sets these)."""

    name: str
    consumer_name: str
    _dead_letters: Publisher | None
    _stopping: asyncio.Event

    async def _deliver(self, messages: list[AmqpDelivery], *, alone: bool = False) -> bool:
        """Process and settle deliveries (QueueConsumer's)."""
        raise NotImplementedError

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
            MESSAGES.labels(route=route_of_key(self.name), outcome=Fate.DEAD_LETTERED.value).inc()
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
