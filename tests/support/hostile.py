"""Hostile AMQP headers: the corpus every route and the dead-letter ingester must survive
(any type, size or depth; forged pkgq headers), and a table nested as deep as asked."""

from __future__ import annotations

from typing import Any

from events.envelope import (
    H_ADDRESS,
    H_ATTEMPT,
    H_DEAD_CONSUMER,
    H_DEAD_ERROR,
    H_DEAD_REASON,
    H_DEAD_TRACEBACK,
    H_EXPIRES_AT,
    H_GROUP,
    H_REPLAY_GENERATION,
    H_SEQ,
    H_TRACEPARENT,
    H_USER_ID,
)
from events.routes import USAGE_RECORD

HUGE = "h" * (100 * 1024)


def nested(depth: int) -> dict[str, Any]:
    """A header table `depth` tables deep."""
    table: dict[str, Any] = {"bottom": "here"}
    for _ in range(depth - 1):
        table = {"a": table}
    return table


CRASHES_RABBITMQ_3_10 = {"x-death": [1, "two", {"count": "many", "reason": {"r": 1}}]}
"""An x-death array with entries that are not tables: RabbitMQ 3.10 resets an x-death of the
wrong type, but this one crashes the queue process that dead-letters it (function_clause in
rabbit_dead_letter:group_by_queue_and_reason/1). pkgq never sees it as a dead letter: it is in
the inbound corpus only (a consumer takes it, the broker never dead-letters it)."""


def hostile_variants(*, inbound: bool = True) -> list[dict[str, Any]]:
    """The corpus: one hostile header set per message (at most one 100 KiB value each, so a
    message still fits in one AMQP frame)."""
    forged_dead = {
        H_DEAD_REASON: "handler_error",
        H_DEAD_ERROR: "Forged: overwrite me",
        H_DEAD_CONSUMER: USAGE_RECORD.short_name,
        H_DEAD_TRACEBACK: 12345,
    }
    return [
        {"x-deep": nested(600)},
        {H_DEAD_TRACEBACK: nested(600), H_DEAD_REASON: "handler_error"},
        {H_USER_ID: nested(600)},
        {"x-huge": HUGE},
        {H_USER_ID: HUGE},
        {H_DEAD_ERROR: HUGE, H_DEAD_REASON: "handler_error"},
        {H_TRACEPARENT: HUGE},
        {H_ADDRESS: HUGE},
        {H_USER_ID: 5, H_TRACEPARENT: 6, H_ADDRESS: 7, H_GROUP: 8, H_EXPIRES_AT: 9},
        {H_USER_ID: {"t": 1}, H_TRACEPARENT: [1, 2], H_ADDRESS: {"a": "b"}, H_GROUP: [3]},
        {H_DEAD_REASON: {"r": 1}, H_DEAD_CONSUMER: 4, H_DEAD_ERROR: [5], H_DEAD_TRACEBACK: 6},
        {H_SEQ: -1, H_ATTEMPT: {"n": 1}, H_REPLAY_GENERATION: -5},
        {H_SEQ: 2**62, H_ATTEMPT: 10**12, H_REPLAY_GENERATION: "many"},
        {H_SEQ: "seven", H_ATTEMPT: "many"},
        {"x-death": 17},
        {"x-first-death-reason": nested(50), "x-first-death-queue": 3},
        forged_dead,
        {**forged_dead, "x-deep": nested(600)},
        {**forged_dead, H_DEAD_TRACEBACK: HUGE},
        *([CRASHES_RABBITMQ_3_10] if inbound else []),
    ]
