"""The dead-letter ingester: files what reaches `telecom.dlx` in the dead-letter store.

Two kinds of message arrive on the dead-letter queue:
- messages the broker dead-lettered on its own (rejected, TTL expired, a queue length limit, a
  quorum queue's delivery limit): the reason and the queue come from the `x-death` header;
- last-resort copies a pkgq consumer made when even its failure path broke (see
  infra/rabbit/consumer.py): the reason and error come from the `x-pkgq-dead-*` headers.
Each is stored in one statement and then acked; a redelivery updates the same row.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import asyncpg
import structlog
from aio_pika.abc import AbstractChannel, AbstractQueue, AbstractRobustConnection

from events.decoding import RawDelivery
from events.envelope import (
    H_DEAD_CONSUMER,
    H_DEAD_ERROR,
    H_DEAD_REASON,
    H_DEAD_TRACEBACK,
    H_USER_ID,
    job_marks,
    jsonable,
)
from events.partitioning import route_of_key
from events.routes import ROUTES
from infra.postgres import dead_letters, holds, job_state
from infra.postgres.pool import Conn
from infra.rabbit.consumer import Outcome, Processor, QueueConsumer, Result
from infra.rabbit.topology import declare_exchanges
from infra.settings import Settings

log = structlog.get_logger(__name__)


def _user(headers: dict[str, Any]) -> UUID | None:
    try:
        value = headers.get(H_USER_ID)
        return UUID(str(value)) if value is not None else None
    except ValueError:
        return None


def _consumer_of(route: str, queue: str | None) -> str:
    if route in ROUTES:
        return ROUTES[route].short_name
    return queue or route


def to_dead_letter(raw: RawDelivery) -> dead_letters.NewDeadLetter:
    headers = jsonable(dict(raw.headers))
    route = route_of_key(raw.routing_key or "")
    common: dict[str, Any] = {
        "message_id": raw.message_id,
        "user_id": _user(headers),
        "message_type": raw.message_type,
        "content_type": raw.content_type,
        "body": raw.body,
        "headers": headers,
    }
    if H_DEAD_REASON in headers:
        error = str(headers.get(H_DEAD_ERROR) or "")
        error_type, _, message = error.partition(": ")
        return dead_letters.NewDeadLetter(
            source="consumer",
            route=route,
            consumer=str(headers.get(H_DEAD_CONSUMER) or _consumer_of(route, None)),
            reason=str(headers[H_DEAD_REASON]),
            error_type=error_type or "Error",
            error_message=message or error_type or error or "(no message)",
            error_location="consumer failure path",
            traceback=headers.get(H_DEAD_TRACEBACK),
            **common,
        )
    deaths = headers.get("x-death")
    death: dict[str, Any] = deaths[0] if isinstance(deaths, list) and deaths else {}
    reason = str(death.get("reason") or headers.get("x-first-death-reason") or "unknown")
    queue = str(death.get("queue") or headers.get("x-first-death-queue") or "")
    keys = death.get("routing-keys")
    if isinstance(keys, list) and keys:
        route = route_of_key(str(keys[0]))
    count = death.get("count", 1)
    return dead_letters.NewDeadLetter(
        source="broker",
        route=route,
        consumer=_consumer_of(route, queue),
        reason=reason,
        error_type="BrokerDeadLetter",
        error_message=f"RabbitMQ dead-lettered it from queue {queue!r}: {reason}",
        error_location=f"queue {queue}",
        attempts=int(count) if isinstance(count, int) else 1,
        **common,
    )


def make_ingester(pool: asyncpg.Pool) -> Processor:
    async def ingest_all(raws: Sequence[RawDelivery]) -> list[Result]:
        return [Result(await ingest(raw)) for raw in raws]

    async def ingest(raw: RawDelivery) -> Outcome:
        dead = to_dead_letter(raw)
        async with pool.acquire(timeout=10) as conn, conn.transaction():
            try:
                async with conn.transaction():  # a savepoint: the fallback below can follow
                    dead_id = await dead_letters.bury(conn, dead)
            except asyncpg.DataError as exc:
                # Something in it Postgres will not store as given: keep the message anyway,
                # with its headers as text, rather than send it round the queue for ever.
                log.error("dead_letter_stored_degraded", error=repr(exc))  # noqa: TRY400
                dead = dataclasses.replace(
                    dead,
                    headers={"x-pkgq-unstorable-headers": repr(raw.headers)[:16000]},
                    error_message=f"{dead.error_message} (headers kept as text: {exc})",
                )
                dead_id = await dead_letters.bury(conn, dead)
            # Addressed and grouped messages have failed for good: say so to waiters and groups.
            await _finish(conn, raw, dead)
        log.warning(
            "dead_letter_ingested",
            id=dead_id,
            source=dead.source,
            reason=dead.reason,
            dead_route=dead.route,
        )
        return Outcome.DEAD_LETTERED

    return ingest_all


async def _finish(conn: Conn, raw: RawDelivery, dead: dead_letters.NewDeadLetter) -> None:
    """The message failed for good: its address and group hear so, and an expired retry (it
    will never come) blocks its user's later messages no more."""
    if dead.reason == "expired":
        with contextlib.suppress(ValueError):
            await holds.release_blocked_by(conn, [UUID(str(dead.message_id))])
    address, group = job_marks(raw.headers)
    error = f"{dead.reason}: {dead.error_message}"
    await job_state.finish_failed(conn, dead.message_id, address, group, error)


def ingester(
    settings: Settings, pool: asyncpg.Pool, connection: AbstractRobustConnection
) -> QueueConsumer:
    """The consumer of `pkgq.dead_letters`."""

    async def declare(channel: AbstractChannel) -> AbstractQueue:
        await declare_exchanges(channel, settings)
        return await channel.declare_queue(settings.dead_letter_queue, passive=True)

    return QueueConsumer(
        settings.dead_letter_queue,
        declare,
        settings,
        connection,
        make_ingester(pool),
        None,  # nowhere further to send a copy: failures are requeued after a pause
    )
