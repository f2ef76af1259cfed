"""What an operator does (consumers/operations.py), against real Postgres: the console and the
CLI call these, so their guarantees are pinned here once."""

from __future__ import annotations

import json
from uuid import UUID, uuid4

import asyncpg
import pytest
from pydantic import ValidationError

from consumers import operations
from events.decoding import RawDelivery, decode
from events.envelope import CONTENT_TYPE
from events.models import RecordUsage
from events.routes import PACKAGE_PURCHASE, USAGE_RECORD
from infra.postgres import dead_letters, holds
from infra.settings import Settings
from tests.support import keys
from tests.support.dead_letters import buried
from tests.support.deliveries import add_package
from tests.support.processes import cli


async def _buried_purchase(pool: asyncpg.Pool, user: UUID, body: bytes) -> tuple[int, UUID]:
    message_id = uuid4()
    dead = await buried(
        pool,
        PACKAGE_PURCHASE.name,
        message_id=str(message_id),
        user_id=user,
        body=body,
        headers={"x-schema-version": 1, "x-user-id": str(user)},
    )
    return dead, message_id


async def test_an_edited_replay_keeps_the_users_parked_messages_waiting_behind_it(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    package = await add_package(pool, 1000)
    user = uuid4()
    original = json.dumps({"user_id": str(user), "package_id": package, "amount": "2"}).encode()
    dead, message_id = await _buried_purchase(pool, user, original)
    later = uuid4()
    async with pool.acquire() as conn:
        await keys.hold(conn, "package_purchase", user, message_id, "buried", None, 3, "boom")
        await holds.park_many(
            conn,
            "package_purchase",
            [
                holds.NewParked(
                    user, later, later, PACKAGE_PURCHASE.name, "PurchasePackage", b"{}", {}
                )
            ],
        )
        edited = json.dumps({"user_id": str(user), "package_id": package, "amount": 2})
        async with conn.transaction():
            result = await operations.edit_and_replay(
                conn, dead, edited, "web:olga", pkgq_user=settings.amqp_user
            )
        assert result.replayed
        hold = await conn.fetchrow(
            "SELECT blocker, state FROM telecom.holds WHERE user_id = $1", user
        )
        parked = await conn.fetchval("SELECT count(*) FROM telecom.parked WHERE user_id = $1", user)
        sent = await conn.fetchrow(
            "SELECT body, headers::text AS headers FROM telecom.outbox WHERE message_id = $1",
            message_id,
        )
        row = await dead_letters.get(conn, dead)
        audit = await conn.fetchrow(
            "SELECT actor, detail::text AS detail FROM telecom.operator_actions "
            "WHERE dead_letter_id = $1",
            dead,
        )
    assert hold is not None
    assert (hold["blocker"], hold["state"]) == (message_id, "retrying")  # still waits for it
    assert parked == 1
    assert sent is not None
    assert json.loads(bytes(sent["body"]))["amount"] == 2
    assert json.loads(sent["headers"])["x-pkgq-replay-of"] == dead
    assert row is not None
    assert (row["status"], row["replayed_by"]) == ("replayed", "web:olga")
    assert bytes(row["body"]) == original  # the original is kept
    assert audit is not None
    assert audit["actor"] == "web:olga"
    assert json.loads(audit["detail"])["original_body"] == original.decode()


async def test_an_edited_v1_usage_record_is_replayed_as_the_current_version_and_decodes(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    user = uuid4()
    old = json.dumps({"user_id": str(user), "upload": -1, "download": 0}).encode()
    message_id = uuid4()
    dead = await buried(
        pool,
        USAGE_RECORD.name,
        message_id=str(message_id),
        user_id=user,
        body=old,
        headers={"x-schema-version": 1, "x-user-id": str(user)},
    )
    edited = json.dumps({"user_id": str(user), "upload": 1, "download": 0, "usage_id": "c-1"})
    async with pool.acquire() as conn, conn.transaction():
        result = await operations.edit_and_replay(
            conn, dead, edited, "web:olga", pkgq_user=settings.amqp_user
        )
    assert result.replayed
    async with pool.acquire() as conn:
        sent = await conn.fetchrow(
            "SELECT schema_version, body, headers FROM telecom.outbox WHERE message_id = $1",
            message_id,
        )
    assert sent is not None
    assert sent["schema_version"] == USAGE_RECORD.schema_version
    assert sent["headers"]["x-schema-version"] == USAGE_RECORD.schema_version
    # What the consumer will make of it: the current version, with the usage_id the edit added.
    delivery = RawDelivery(
        bytes(sent["body"]), str(message_id), "RecordUsage", CONTENT_TYPE, None, sent["headers"]
    )
    decoded = decode(USAGE_RECORD, delivery, max_body_bytes=2**20)
    assert isinstance(decoded.body, RecordUsage)
    assert decoded.body.usage_id == "c-1"


async def test_an_edit_that_fails_validation_or_changes_the_user_replays_nothing(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    user = uuid4()
    dead, message_id = await _buried_purchase(pool, user, b"not json")
    async with pool.acquire() as conn:
        with pytest.raises(ValidationError):
            await operations.edit_and_replay(
                conn,
                dead,
                json.dumps({"user_id": str(user), "package_id": 1, "amount": 0}),
                "x",
                pkgq_user=settings.amqp_user,
            )
        with pytest.raises(operations.EditRefusedError, match="changes user_id"):
            await operations.edit_and_replay(
                conn,
                dead,
                json.dumps({"user_id": str(uuid4()), "package_id": 1}),
                "x",
                pkgq_user=settings.amqp_user,
            )
        sent = await conn.fetchval(
            "SELECT count(*) FROM telecom.outbox WHERE message_id = $1", message_id
        )
        status = await conn.fetchval(
            "SELECT status::text FROM telecom.dead_letters WHERE id = $1", dead
        )
    assert sent == 0
    assert status == "buried"


async def test_cancel_and_adjust_quota_go_through_the_outbox_with_an_audit_row(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    package = await add_package(pool, 1000)
    user = uuid4()
    async with pool.acquire() as conn:
        item = await conn.fetchval(
            "INSERT INTO telecom.package_queue (user_id, package_id, package_name, traffic_limit) "
            "VALUES ($1, $2, 'p', 1000) RETURNING id",
            user,
            package,
        )
        async with conn.transaction():
            cancel = await operations.cancel_item(conn, item, "web:olga", "refund")
            adjust = await operations.adjust_quota(conn, item, -5, "alice@host")
        with pytest.raises(operations.UnknownItemError):
            await operations.cancel_item(conn, item + 1, "web:olga")
        rows = await conn.fetch(
            "SELECT route, body FROM telecom.outbox WHERE message_id = ANY($1::uuid[]) ORDER BY id",
            [cancel, adjust],
        )
        audit = await conn.fetch(
            "SELECT actor, action, item_id, message_id FROM telecom.operator_actions ORDER BY id"
        )
    assert [r["route"] for r in rows] == ["telecom.package_cancel", "telecom.quota_adjust"]
    assert json.loads(bytes(rows[0]["body"])) == {
        "user_id": str(user),
        "item_id": item,
        "reason": "refund",
        "operator": "web:olga",
    }
    assert json.loads(bytes(rows[1]["body"]))["delta"] == -5
    assert [(a["actor"], a["action"], a["item_id"], a["message_id"]) for a in audit] == [
        ("web:olga", "cancel", item, cancel),
        ("alice@host", "adjust_quota", item, adjust),
    ]


async def test_the_cli_discards_and_replays_through_the_same_functions_with_audit_rows(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    user = uuid4()
    body = json.dumps({"user_id": str(user), "package_id": 1}).encode()
    discarded, _ = await _buried_purchase(pool, user, body)
    replayed, message_id = await _buried_purchase(pool, uuid4(), body)
    done = await cli(settings, "dlq", "discard", str(discarded), "--by", "ops@box")
    assert done.returncode == 0, done.stderr
    done = await cli(settings, "dlq", "dig", str(replayed), "--by", "ops@box")
    assert done.returncode == 0, done.stderr
    async with pool.acquire() as conn:
        audit = await conn.fetch(
            "SELECT actor, action, dead_letter_id FROM telecom.operator_actions ORDER BY id"
        )
        sent = await conn.fetchval(
            "SELECT count(*) FROM telecom.outbox WHERE message_id = $1", message_id
        )
    assert [(a["actor"], a["action"], a["dead_letter_id"]) for a in audit] == [
        ("ops@box", "discard", discarded),
        ("ops@box", "replay", replayed),
    ]
    assert sent == 1
