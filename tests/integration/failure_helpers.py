"""Helpers for the failure-path tests (test_failure_handling.py, test_dead_letter_replay.py):
a usage route whose handler fails on demand, and waits on what the failure path stores."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

import asyncpg
from aio_pika.abc import AbstractRobustConnection

from consumers.delivery import DeliveryPipeline
from consumers.handlers import usage_record
from consumers.retry_policy import RetryPolicy
from consumers.unit_of_work import HandlerContext
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.settings import Settings
from tests.support.deliveries import send
from tests.support.observing import eventually, fetch

Applied = list[tuple[UUID, int]]


class BillingRefusedError(Exception):
    pass


def usage_pipeline(
    pool: asyncpg.Pool,
    policy: RetryPolicy,
    fails: Callable[[HandlerContext, RecordUsage], bool],
) -> tuple[DeliveryPipeline, Applied]:
    """The usage_record route with a handler that fails when `fails` says so, and a log of the
    (user, upload) of every application that went through the real handler."""
    applied: Applied = []

    async def handler(ctx: HandlerContext, body: RecordUsage) -> None:
        if fails(ctx, body):
            refuse_billing(body.upload)
        await usage_record.handle(ctx, body)
        applied.append((body.user_id, body.upload))

    return DeliveryPipeline(pool, USAGE_RECORD, handler, policy, max_body_bytes=2**20), applied


def refuse_billing(upload: int) -> None:
    raise BillingRefusedError(f"rating plan for upload {upload} is missing")


async def usage(settings: Settings, amqp: AbstractRobustConnection, user: UUID, up: int) -> UUID:
    return await send(
        settings, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=up, download=0)
    )


async def dead_letter_of(pool: asyncpg.Pool, message_id: UUID) -> dict[str, Any]:
    async def stored() -> bool:
        return bool(await rows_of(pool, message_id))

    await eventually(stored, within=15)
    (row,) = await rows_of(pool, message_id)
    return row


async def billed(pool: asyncpg.Pool, user: UUID, upload: int) -> None:
    """Wait until the user's committed unbilled upload is `upload` (the handler's log of what
    it applied is written before its transaction commits)."""

    async def committed() -> bool:
        rows = await fetch(
            pool, "SELECT unbilled_upload FROM telecom.queue_users WHERE user_id = $1", user
        )
        return bool(rows) and rows[0]["unbilled_upload"] == upload

    await eventually(committed, within=20)


async def no_holds_left(pool: asyncpg.Pool) -> None:
    """The hold is dropped in the transaction after the last parked message is applied."""

    async def none() -> bool:
        return await fetch(pool, "SELECT * FROM telecom.holds") == []

    await eventually(none, within=10)


async def rows_of(pool: asyncpg.Pool, message_id: UUID) -> list[dict[str, Any]]:
    return await fetch(
        pool,
        "SELECT *, status::text AS status FROM telecom.dead_letters WHERE message_id = $1",
        str(message_id),
    )


def until(condition: Callable[[], bool]) -> Callable[[], Any]:
    async def check() -> bool:
        return condition()

    check.__qualname__ = getattr(condition, "__qualname__", "condition")
    return check
