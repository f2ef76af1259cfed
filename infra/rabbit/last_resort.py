"""The last resort for a delivery its processor could not decide (a bug in the failure path
itself): copy it to the dead-letter exchange with the error in headers, confirmed, then ack it;
the dead-letter ingester files the copy in the store. If the copy cannot be made, the delivery
stays unacked and the copy is retried: it is never rejected into a DLX that might drop it.

The copy's retries are an outage's pauses (infra/transient.OutagePauses, not probed: the
failure is the broker's): 1 s, doubling up to OUTAGE_LONGEST_PAUSE_S (2 s), every failure of
any kind tried again, until the copy is confirmed, `stopping` is set, or the delivery's
channel closes (then it is redelivered and taken again). The failure is an error the first
time and again every LOUD_REPEAT_S at most (the tries between are debug lines)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime

import structlog

from domain.delivery import Fate
from events.envelope import (
    H_DEAD_AT,
    H_DEAD_CONSUMER,
    H_DEAD_ERROR,
    H_DEAD_REASON,
    H_DEAD_TRACEBACK,
    H_PUBLISHER,
    publisher_of,
    republished_headers,
    without_pkgq_marks,
)
from infra.rabbit.deliveries import AmqpDelivery, channel_open
from infra.rabbit.publisher import Publisher, build_message
from infra.transient import (
    LOUD_REPEAT_S,
    OUTAGE_FIRST_PAUSE_S,
    OUTAGE_LONGEST_PAUSE_S,
    OutagePauses,
    Wait,
)

log = structlog.get_logger(__name__)


async def copy_to_dead_letters(
    message: AmqpDelivery,
    publisher: Publisher | None,
    *,
    queue_name: str,
    consumer: str,
    reason: str,
    exc: BaseException,
    stopping: asyncio.Event,
    wait: Wait | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """True once the confirmed copy is made and the delivery acked; False if it was left
    unacked (shutdown, or its channel closed): it is redelivered and dead-lettered then.
    `wait` and `clock`: the pauses and the time as tests drive them."""
    if publisher is None:
        # The dead-letter queue's own consumer: give it back, after a pause, to try again.
        log.error("requeued_after_failure", error=repr(exc))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), timeout=5)
        with contextlib.suppress(Exception):
            await message.nack(requeue=True)
        return False
    # Without any x-death or x-pkgq-dead-* it came with: the ingester believes the dead-letter
    # headers only on a message without x-death, and these must be pkgq's own, not a sender's.
    headers = republished_headers(message.headers or {}, {})
    if message.user_id != publisher.user_id:  # an outsider's marks must not become pkgq's
        headers = without_pkgq_marks(headers) or headers
    headers.update(
        {
            # Who published the message first: the copy is pkgq's, the message is not.
            H_PUBLISHER: publisher_of(headers, message.user_id),
            H_DEAD_REASON: reason,
            H_DEAD_ERROR: f"{type(exc).__name__}: {exc}"[:4000],
            H_DEAD_CONSUMER: consumer,
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
    pauses = OutagePauses(OUTAGE_FIRST_PAUSE_S, OUTAGE_LONGEST_PAUSE_S, probed=False, wait=wait)
    said_at: float | None = None
    while True:
        try:
            await publisher.publish(copy, queue_name)
            break
        except Exception as publish_error:  # noqa: BLE001  (kept unacked, retried)
            # Never reject or ack a message that has no confirmed copy in the dead-letter
            # queue: if the DLX is unroutable the broker would drop it.
            now = clock()
            loud = said_at is None or now - said_at >= LOUD_REPEAT_S
            if loud:
                said_at = now
            (log.error if loud else log.debug)(
                "dead_letter_publish_failed", error=repr(publish_error), retry_in_s=pauses.current
            )
            if stopping.is_set() or not channel_open(message):
                return False  # unacked: redelivered, and dead-lettered again then
            await pauses.wait(publish_error, stopping)
    try:
        await message.ack()
    except Exception as ack_error:  # noqa: BLE001  (channel gone: the inbox absorbs it)
        log.warning("ack_failed", error=repr(ack_error))
    log.warning("dead_lettered", outcome=Fate.DEAD_LETTERED.value, reason=reason, error=str(exc))
    return True
