"""Settling a batch of deliveries once their processor has decided: ack what is done, give
back what goes back to the queue, count the outcomes and log one line per message. The same
for a batch of one and a batch of many."""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Sequence

import structlog

from events.decoding import RawDelivery
from events.envelope import H_TRACEPARENT, H_USER_ID, header_text, trace_id_of
from infra.observability import MESSAGES, PROCESSING
from infra.rabbit.deliveries import AmqpDelivery
from infra.rabbit.outcomes import Result, Settle, settle_of

log = structlog.get_logger(__name__)


def done_and_given_back(
    messages: Sequence[AmqpDelivery], results: Sequence[Result]
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
    results: Sequence[Result],
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
