"""Usage records of versions 1 and 2 through real `pkgq run` and `pkgq relay` processes: each
billed once, a version 2 record resent under new message_ids billed once, and a dead letter
filed as version 1 (by the previous release) replayed and billed after the upgrade."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from events.envelope import H_SCHEMA_VERSION, H_USER_ID
from events.models import PurchasePackage
from events.routes import PACKAGE_PURCHASE, USAGE_RECORD
from infra.settings import Settings
from tests.support.dead_letters import buried
from tests.support.deliveries import add_package, send, send_raw
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, cli

pytestmark = pytest.mark.e2e


def v1(user: UUID, upload: int) -> bytes:
    return json.dumps({"user_id": str(user), "upload": upload, "download": 0}).encode()


def v2(user: UUID, upload: int, usage_id: str, recorded_at: int | None = None) -> bytes:
    body = {"user_id": str(user), "upload": upload, "download": 0, "usage_id": usage_id}
    if recorded_at is not None:
        body["recorded_at"] = recorded_at
    return json.dumps(body).encode()


async def used(pool: asyncpg.Pool, user: UUID) -> int:
    async with pool.acquire() as conn:
        total: int = await conn.fetchval(
            "SELECT coalesce(sum(upload), 0) FROM telecom.package_queue WHERE user_id = $1", user
        )
    return total


async def applied(pool: asyncpg.Pool) -> int:
    async with pool.acquire() as conn:
        count: int = await conn.fetchval(
            "SELECT count(*) FROM telecom.inbox WHERE consumer = 'usage_record'"
        )
    return count


async def test_v1_and_v2_usage_interleaved_each_bill_once_and_a_resent_v2_record_bills_once(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    package = await add_package(pool, 10_000, timedelta(days=1))
    users = [uuid4() for _ in range(3)]
    spawn("relay")
    spawn("run")
    for user in users:
        await send(
            settings, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package)
        )

    async def active() -> bool:
        async with pool.acquire() as conn:
            n = await conn.fetchval(
                "SELECT count(*) FROM telecom.package_queue WHERE status = 'active'"
            )
        return bool(n == len(users))

    await eventually(active)
    sent = 0
    for user in users:
        # Interleaved versions; "a" comes back three times and "b" once, each time under a
        # new message_id, as a billing system's retries and re-runs send them.
        for version, body in (
            (1, v1(user, 1)),
            (2, v2(user, 10, "a", 1_764_115_200)),
            (1, v1(user, 100)),
            (2, v2(user, 1000, "b")),
            (2, v2(user, 10, "a", 1_764_115_200)),
            (1, v1(user, 100)),  # a v1 resend under a new message_id: v1 cannot tell
            (2, v2(user, 10, "a")),
            (2, v2(user, 1000, "b")),
            (2, v2(user, 10, "a", 1_764_115_200)),
        ):
            headers = {H_SCHEMA_VERSION: version, H_USER_ID: str(user)}
            await send_raw(settings, amqp, USAGE_RECORD, body, headers=headers)
            sent += 1

    async def all_applied() -> bool:
        return await applied(pool) == sent

    await eventually(all_applied)
    for user in users:
        assert await used(pool, user) == 1 + 10 + 100 + 1000 + 100
    async with pool.acquire() as conn:
        billed = await conn.fetch(
            "SELECT user_id, usage_id, upload, item_id, recorded_at FROM telecom.usage_billed "
            "ORDER BY user_id, usage_id"
        )
        letters = await conn.fetchval("SELECT count(*) FROM telecom.dead_letters")
    assert letters == 0
    assert sorted((r["user_id"], r["usage_id"], r["upload"]) for r in billed) == sorted(
        (u, i, n) for u in users for i, n in (("a", 10), ("b", 1000))
    )
    assert all(r["item_id"] is not None for r in billed)
    assert {r["recorded_at"].timestamp() for r in billed if r["usage_id"] == "a"} == {1_764_115_200}


async def test_a_dead_letter_filed_as_v1_by_the_previous_release_replays_and_bills_once_upgraded(
    settings: Settings,
    pool: asyncpg.Pool,
    spawn: Callable[..., PkgqProcess],
) -> None:
    user = uuid4()
    message_id = str(uuid4())
    dead_id = await buried(
        pool,
        message_id=message_id,
        user_id=user,
        body=v1(user, 77),
        headers={H_SCHEMA_VERSION: 1, H_USER_ID: str(user)},
    )
    spawn("relay")
    spawn("run")
    out = await cli(settings, "dlq", "dig", str(dead_id))
    assert out.returncode == 0, out.stderr

    async def billed() -> bool:
        async with pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT unbilled_upload FROM telecom.queue_users WHERE user_id = $1", user
            )
        return row is not None and row["unbilled_upload"] == 77

    await eventually(billed)
    async with pool.acquire() as conn:
        status = await conn.fetchval(
            "SELECT status FROM telecom.dead_letters WHERE id = $1", dead_id
        )
    assert status == "superseded"  # applied since: never replayed again
