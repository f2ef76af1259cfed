"""Input Postgres cannot store is refused before the database sees it, against the real services:
counters that would overflow a bigint (`domain_rule`, decided by the domain) and text holding NUL
or a lone surrogate (`schema_invalid`, decided when the body is decoded). Either way the message
is buried at once, after one attempt, with no retry scheduled and no hold on its user, whose
next message is applied as usual.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from events.envelope import H_SCHEMA_VERSION, H_USER_ID
from events.models import AdjustQuota, PurchasePackage, RecordUsage
from events.routes import PACKAGE_CANCEL, PACKAGE_PURCHASE, QUOTA_ADJUST, USAGE_RECORD, Route
from infra.settings import Settings
from tests.integration.failure_helpers import billed, dead_letter_of
from tests.support.deliveries import add_package, send, send_raw
from tests.support.in_process import InProcess
from tests.support.observing import eventually, fetch

BIG = 2**62
"""The most traffic (or quota change) one message may carry: two of them overflow a bigint."""


async def buried_at_once_holding_nothing(
    pool: asyncpg.Pool, user: UUID, message_id: str | UUID, reason: str
) -> dict[str, Any]:
    """The message's dead letter, once it is filed; checks that it was buried on its first
    attempt and left nothing behind: no retry in the outbox, no hold, nothing parked."""
    dead = await dead_letter_of(pool, UUID(str(message_id)))
    assert (dead["reason"], dead["status"], dead["attempts"]) == (reason, "buried", 1)
    assert dead["user_id"] == user
    retries = "SELECT dedup_key FROM telecom.outbox WHERE message_id = $1"
    assert await fetch(pool, retries, UUID(str(message_id))) == []
    assert await fetch(pool, "SELECT * FROM telecom.holds WHERE user_id = $1", user) == []
    assert await fetch(pool, "SELECT * FROM telecom.parked WHERE user_id = $1", user) == []
    return dead


async def active_item(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, user: UUID
) -> int:
    """Buy the user a package and wait until it is active; its item id."""
    package = await add_package(pool, 10**6)
    await send(settings, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package))

    async def activated() -> bool:
        return bool(await item_rows(pool, user, "active"))

    await eventually(activated)
    (item,) = await item_rows(pool, user, "active")
    return int(item["id"])


async def item_rows(pool: asyncpg.Pool, user: UUID, status: str) -> list[dict[str, Any]]:
    return await fetch(
        pool,
        "SELECT id, upload, adjust_quota FROM telecom.package_queue "
        "WHERE user_id = $1 AND status::text = $2",
        user,
        status,
    )


async def item_upload(pool: asyncpg.Pool, item_id: int, upload: int) -> None:
    """Wait until the item's committed upload is `upload`."""

    async def committed() -> bool:
        rows = await fetch(pool, "SELECT upload FROM telecom.package_queue WHERE id = $1", item_id)
        return bool(rows[0]["upload"] == upload)

    await eventually(committed)


async def test_usage_overflowing_a_counter_is_buried_as_a_domain_rule_and_the_next_one_applied(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, running_app: InProcess
) -> None:
    user = uuid4()  # no package: usage is kept as unbilled
    await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=BIG, download=0))
    await billed(pool, user, BIG)

    # The second 2^62 would make the unbilled upload 2^63; the one right behind it must not wait.
    second = await send(
        settings, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=BIG, download=0)
    )
    await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=7, download=0))

    await billed(pool, user, BIG + 7)
    dead = await buried_at_once_holding_nothing(pool, user, second, "domain_rule")
    assert dead["error_type"] == "CounterOverflowError"
    assert dead["error_message"].startswith("unbilled upload would be 9223372036854775808")


async def test_a_quota_raise_overflowing_a_counter_is_buried_as_a_domain_rule_and_the_next_applied(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, running_app: InProcess
) -> None:
    user = uuid4()
    item = await active_item(settings, pool, amqp, user)
    raise_by = AdjustQuota(user_id=user, item_id=item, delta=BIG, reason="goodwill")
    await send(settings, amqp, QUOTA_ADJUST, raise_by)

    async def raised_once() -> bool:
        return bool((await item_rows(pool, user, "active"))[0]["adjust_quota"] == BIG)

    await eventually(raised_once)
    again = await send(settings, amqp, QUOTA_ADJUST, raise_by)
    await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=5, download=0))

    await item_upload(pool, item, 5)
    dead = await buried_at_once_holding_nothing(pool, user, again, "domain_rule")
    assert dead["error_type"] == "CounterOverflowError"
    assert f"item {item} adjust_quota would be" in dead["error_message"]
    assert [r["adjust_quota"] for r in await item_rows(pool, user, "active")] == [BIG]
    audited = await fetch(pool, "SELECT delta FROM telecom.item_audit WHERE item_id = $1", item)
    assert [r["delta"] for r in audited] == [BIG]  # the refused raise is not in the audit


def cancel_with_reason(item: int, reason: str) -> dict[str, Any]:
    return {"item_id": item, "reason": reason, "operator": "ops@admin"}


def adjust_with_reason(item: int, reason: str) -> dict[str, Any]:
    return {"item_id": item, "delta": 10, "reason": reason, "operator": "ops@admin"}


def adjust_by_operator(item: int, operator: str) -> dict[str, Any]:
    return {"item_id": item, "delta": 10, "reason": "goodwill", "operator": operator}


UNSTORABLE = {
    "cancel_reason_with_nul": (PACKAGE_CANCEL, cancel_with_reason, "refund\x00requested"),
    "quota_adjust_reason_with_nul": (QUOTA_ADJUST, adjust_with_reason, "goodwill\x00"),
    "quota_adjust_operator_with_nul": (QUOTA_ADJUST, adjust_by_operator, "\x00ops"),
    "cancel_reason_with_lone_surrogate": (PACKAGE_CANCEL, cancel_with_reason, "refund \ud800"),
}


@pytest.mark.parametrize(("route", "body_of", "text"), UNSTORABLE.values(), ids=UNSTORABLE.keys())
async def test_text_postgres_cannot_store_in_a_command_is_buried_as_schema_invalid_holding_nothing(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    running_app: InProcess,
    route: Route,
    body_of: Any,
    text: str,
) -> None:
    user = uuid4()
    item = await active_item(settings, pool, amqp, user)
    # As any JSON producer writes it: NUL as \u0000, a lone surrogate as its \ud800 escape.
    body = json.dumps({"user_id": str(user), **body_of(item, text)}).encode()
    assert b"\\u0000" in body or b"\\ud800" in body
    headers = {H_SCHEMA_VERSION: route.schema_version, H_USER_ID: str(user)}
    sent = await send_raw(settings, amqp, route, body, headers=headers)
    await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=5, download=0))

    await item_upload(pool, item, 5)  # the user's next message was not held back
    dead = await buried_at_once_holding_nothing(pool, user, str(sent), "schema_invalid")
    field = "operator" if body_of is adjust_by_operator else "reason"
    assert dead["error_message"].startswith(f"{field}: text holds U+")
    assert bytes(dead["body"]) == body  # kept byte for byte, for an operator to fix and replay
    (still,) = await item_rows(pool, user, "active")
    assert (still["id"], still["adjust_quota"]) == (item, 0)  # neither cancelled nor adjusted
    assert await fetch(pool, "SELECT * FROM telecom.item_audit WHERE item_id = $1", item) == []
