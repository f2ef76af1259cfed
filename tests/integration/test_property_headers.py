"""Clients that cannot set the AMQP message_id or type property (Debian's amqp-publish) send
them as the x-message-id and x-message-type headers; the properties win when both are there."""

from __future__ import annotations

from uuid import UUID, uuid4

import asyncpg
from aio_pika.abc import AbstractRobustConnection

from events.envelope import H_MESSAGE_ID, H_MESSAGE_TYPE, H_SCHEMA_VERSION, H_USER_ID
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.settings import Settings
from tests.support.deliveries import send_raw
from tests.support.in_process import InProcess
from tests.support.observing import eventually


async def _applied(pool: asyncpg.Pool) -> list[UUID]:
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT sent_as AS message_id FROM telecom.inbox ORDER BY processed_at"
        )
    return [r["message_id"] for r in rows]


def _body() -> bytes:
    return RecordUsage(user_id=uuid4(), upload=1, download=2).model_dump_json().encode()


async def test_message_id_and_type_headers_stand_in_for_missing_properties(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    app = InProcess(settings, pool, amqp)
    await app.start_consumers([USAGE_RECORD])
    try:
        stand_in = uuid4()
        await send_raw(
            settings,
            amqp,
            USAGE_RECORD,
            _body(),
            message_id=None,  # published through pika: no message_id property at all
            message_type=None,
            headers={
                H_SCHEMA_VERSION: str(USAGE_RECORD.schema_version),  # amqp-publish: all text
                H_MESSAGE_ID: str(stand_in),
                H_MESSAGE_TYPE: USAGE_RECORD.message_type,
            },
        )

        async def applied() -> bool:
            return await _applied(pool) == [stand_in]

        await eventually(applied)

        # Both: the property is the message_id; the header is only a claim beside it.
        prop, header = uuid4(), uuid4()
        await send_raw(
            settings,
            amqp,
            USAGE_RECORD,
            _body(),
            message_id=str(prop),
            headers={H_SCHEMA_VERSION: USAGE_RECORD.schema_version, H_MESSAGE_ID: str(header)},
        )

        async def both() -> bool:
            return await _applied(pool) == [stand_in, prop]

        await eventually(both)
    finally:
        await app.close()
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM telecom.dead_letters") == 0


async def test_without_the_property_or_the_header_a_message_is_still_refused_as_unidentified(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    app = InProcess(settings, pool, amqp)
    await app.start_consumers([USAGE_RECORD])
    try:
        await send_raw(
            settings,
            amqp,
            USAGE_RECORD,
            _body(),
            message_id=None,
            headers={H_SCHEMA_VERSION: USAGE_RECORD.schema_version, H_USER_ID: "not-checked-first"},
        )

        async def buried() -> bool:
            async with pool.acquire() as conn:
                return bool(await conn.fetchval("SELECT count(*) FROM telecom.dead_letters"))

        await eventually(buried)
    finally:
        await app.close()
    async with pool.acquire() as conn:
        reason = await conn.fetchval("SELECT reason FROM telecom.dead_letters")
    assert reason == "missing_message_id"
    assert await _applied(pool) == []
