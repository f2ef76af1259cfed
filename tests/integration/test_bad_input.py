"""Bad input is buried in the dead-letter store with its reason; the consumer goes on."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from events.envelope import H_SCHEMA_VERSION
from events.models import RecordUsage
from events.routes import PACKAGE_CANCEL, PACKAGE_PURCHASE, USAGE_RECORD, Route
from infra.settings import Settings
from tests.support.deliveries import add_package, send, send_raw
from tests.support.in_process import InProcess, StartApp
from tests.support.observing import eventually

LIMIT = 4096


@dataclass(frozen=True)
class Bad:
    reason: str
    route: Route
    body: bytes
    props: dict[str, Any] = field(default_factory=dict)


def _usage(user: UUID) -> bytes:
    return RecordUsage(user_id=user, upload=1, download=1).model_dump_json().encode()


USER = uuid4()
CASES = {
    "malformed_json": Bad("invalid_json", USAGE_RECORD, b'{"user_id": '),
    "invalid_utf8": Bad("invalid_utf8", USAGE_RECORD, b'{"user_id": "\xff\xfe"}'),
    "schema_invalid": Bad(
        "schema_invalid",
        USAGE_RECORD,
        json.dumps({"user_id": str(USER), "upload": "lots", "download": 1}).encode(),
    ),
    "unknown_field": Bad(
        "schema_invalid",
        USAGE_RECORD,
        json.dumps({"user_id": str(USER), "upload": 1, "download": 1, "x": 1}).encode(),
    ),
    "zero_amount": Bad(
        "schema_invalid",
        PACKAGE_PURCHASE,
        json.dumps({"user_id": str(USER), "package_id": 1, "amount": 0}).encode(),
    ),
    "missing_message_id": Bad(
        "missing_message_id", USAGE_RECORD, _usage(USER), {"message_id": None}
    ),
    "invalid_message_id": Bad(
        "invalid_message_id", USAGE_RECORD, _usage(USER), {"message_id": "not-a-uuid"}
    ),
    "wrong_content_type": Bad(
        "wrong_content_type", USAGE_RECORD, _usage(USER), {"content_type": "text/plain"}
    ),
    "unknown_type": Bad("unknown_type", USAGE_RECORD, _usage(USER), {"message_type": "Nope"}),
    "unsupported_version": Bad(
        "unsupported_version", USAGE_RECORD, _usage(USER), {"headers": {H_SCHEMA_VERSION: 0}}
    ),
    "oversized": Bad("oversized", USAGE_RECORD, b" " * (LIMIT + 1) + _usage(USER)),
    "unknown_package": Bad(
        "domain_rule",
        PACKAGE_PURCHASE,
        json.dumps({"user_id": str(USER), "package_id": 424242, "amount": 1}).encode(),
    ),
    "foreign_item": Bad(
        "domain_rule",
        PACKAGE_CANCEL,
        json.dumps({"user_id": str(USER), "item_id": 987654}).encode(),
    ),
}


@pytest.fixture
async def small_limit(settings: Settings) -> Settings:
    return settings.model_copy(update={"max_body_bytes": LIMIT})


@pytest.fixture
async def running(
    in_process: StartApp, small_limit: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> InProcess:
    app = in_process(small_limit, pool, amqp)
    await app.start_consumers()
    return app


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
async def test_bad_message_is_stored_with_its_reason_and_the_next_good_one_is_processed(
    case: Bad,
    small_limit: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    running: InProcess,
) -> None:
    await add_package(pool, 1000)
    message_id = await send_raw(small_limit, amqp, case.route, case.body, **case.props)
    good_user = uuid4()
    await send(
        small_limit, amqp, USAGE_RECORD, RecordUsage(user_id=good_user, upload=5, download=6)
    )

    async def good_one_processed() -> bool:
        async with pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT unbilled_upload FROM telecom.queue_users WHERE user_id = $1", good_user
            )
        return row is not None and row[0] == 5

    await eventually(good_one_processed, within=10)
    dead = await stored_dead_letter(pool)
    assert dead["reason"] == case.reason
    assert dead["consumer"] == case.route.short_name
    assert dead["route"] == case.route.name
    assert dead["source"] == "consumer"
    assert dead["status"] == "buried"
    assert dead["error_message"]
    assert dead["error_type"]
    assert bytes(dead["body"]) == case.body  # the original, byte for byte
    if case.props.get("message_id", "fresh") == "fresh":
        assert dead["message_id"] == message_id

    channel = await amqp.channel()
    try:
        source = await channel.declare_queue(small_limit.queue_name(case.route.name), passive=True)
        assert source.declaration_result.message_count == 0  # not requeued forever
    finally:
        await channel.close()


async def stored_dead_letter(pool: asyncpg.Pool) -> dict[str, Any]:
    async def stored() -> bool:
        async with pool.acquire() as conn:
            return bool(await conn.fetchval("SELECT count(*) FROM telecom.dead_letters"))

    await eventually(stored, within=10)
    async with pool.acquire() as conn:
        rows = await conn.fetch("SELECT *, status::text AS status FROM telecom.dead_letters")
    assert len(rows) == 1, rows
    return dict(rows[0])
