"""JSON nested thousands deep, end to end: an outsider (a second broker user with the publisher
role only) publishes garbage 3,000 brackets deep under a victim's x-user-id. It is filed as
invalid_json with its depth in the error, and every place that shows it or another stored body
as deep (the dead letter's console page and its edit form, the victim's timeline and queue
pages, the audit page, `pkgq dlq show`, `pkgq user history`, `pkgq find`) answers
with it as text, where each used to answer 500 or die with a RecursionError."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import httpx
import pytest
from aio_pika.abc import AbstractRobustConnection

from events.envelope import H_USER_ID
from events.models import PurchasePackage
from events.routes import PACKAGE_PURCHASE, PACKAGE_QUEUING, USAGE_RECORD
from infra.settings import Settings
from tests.support.broker_users import Publisher, publisher_connection
from tests.support.deliveries import add_package, send
from tests.support.in_process import InProcess
from tests.support.observing import eventually, fetch
from tests.support.processes import cli
from tests.web.client import client, sign_in

DEPTH = 3000
GARBAGE = b"[" * (DEPTH - 1) + b'{"user_id": '
"""Invalid JSON 3,000 deep: json.loads raises RecursionError on it, not ValueError."""
STORED = ("[" * DEPTH + "]" * DEPTH).encode()
"""Valid JSON as deep, as a body stored before pkgq bounded the depth at the door."""


@pytest.fixture
async def outsider(settings: Settings) -> AsyncIterator[Publisher]:
    """A second broker user with the definitions' publisher role only."""
    async with publisher_connection(settings, "deep") as publisher:
        yield publisher


async def publish_garbage(outsider: Publisher, settings: Settings, victim: UUID) -> UUID:
    message_id = uuid4()
    headers = {H_USER_ID: str(victim)}
    await outsider.publish(settings, USAGE_RECORD, GARBAGE, message_id, headers=headers)
    return message_id


async def filed(pool: asyncpg.Pool, message_id: UUID) -> dict[str, Any]:
    async def found() -> bool:
        return bool(await rows_for(pool, message_id))

    await eventually(found, within=20)
    [row] = await rows_for(pool, message_id)
    return row


async def rows_for(pool: asyncpg.Pool, message_id: UUID) -> list[dict[str, Any]]:
    return await fetch(
        pool,
        "SELECT id, reason, error_message, body FROM telecom.dead_letters WHERE message_id = $1",
        str(message_id),
    )


async def store_deep_bodies(pool: asyncpg.Pool, victim: UUID) -> None:
    """What the victim's timeline, queue and audit pages show, stored as deep as the garbage:
    an outbox row's body (scheduled a year ahead: the relay leaves it), and an operator action's
    detail (jsonb, which Postgres stores thousands deep)."""
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO telecom.outbox (message_id, route, message_type, schema_version, user_id,"
            " body, available_at) VALUES ($1, $2, $3, 1, $4, $5, now() + interval '1 year')",
            uuid4(),
            PACKAGE_QUEUING.name,
            PACKAGE_QUEUING.message_type,
            victim,
            STORED,
        )
        await conn.execute(
            "INSERT INTO telecom.operator_actions (actor, action, user_id, message_id, detail)"
            " VALUES ('olga', 'edit_replay', $1, $2, $3::text::jsonb)",
            victim,
            uuid4(),
            '{"edited_body": ' + STORED.decode() + "}",
        )


@contextlib.contextmanager
def as_in_the_console_process() -> Iterator[None]:
    """Python's own recursion limit, as in `pkgq web`, which never connects to the broker: this
    test's process connected, and a connection raises the limit for pamqp's deep headers
    (infra/rabbit/connection.py), under which json.loads reads 3,000 levels (and crashes the
    process on a few hundred thousand)."""
    raised = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        yield
    finally:
        sys.setrecursionlimit(raised)


async def answers(http: httpx.AsyncClient, path: str, *params: tuple[str, str]) -> str:
    page = await http.get(path, params=dict(params))
    assert page.status_code == 200, f"{path}: {page.status_code} {page.text[:300]}"
    return page.text


async def victim_with_a_package(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> UUID:
    """A user pkgq knows (its queue page answers), through pkgq's own publisher."""
    victim = uuid4()
    package = await add_package(pool, 1000)
    purchase = PurchasePackage(user_id=victim, package_id=package)
    await send(settings, amqp, PACKAGE_PURCHASE, purchase)

    async def bought() -> bool:
        sql = "SELECT 1 FROM telecom.package_queue WHERE user_id = $1"
        return bool(await fetch(pool, sql, victim))

    await eventually(bought)
    return victim


async def test_garbage_nested_3000_deep_is_filed_as_invalid_json_and_shown_as_text_everywhere(
    running_app: InProcess,
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    outsider: Publisher,
) -> None:
    victim = await victim_with_a_package(settings, pool, amqp)
    message_id = await publish_garbage(outsider, settings, victim)
    dead = await filed(pool, message_id)
    assert dead["reason"] == "invalid_json"
    assert f"nested {DEPTH} deep" in dead["error_message"]
    assert bytes(dead["body"]) == GARBAGE
    await store_deep_bodies(pool, victim)

    async with client(settings, pool) as http:
        assert (await sign_in(http)).status_code == 303
        with as_in_the_console_process():
            page = await answers(http, f"/dead-letters/{dead['id']}")
            edit = await answers(http, f"/dead-letters/{dead['id']}/edit")
            timeline = await answers(http, f"/users/{victim}/timeline")
            for path in (f"/users/{victim}", "/audit"):
                await answers(http, path)
            await answers(http, "/messages", ("message_id", str(message_id)))
    assert GARBAGE.decode()[:200] in page
    assert GARBAGE.decode()[:200] in edit
    assert '<tr data-source="outbox" data-kind="scheduled"' in timeline
    assert "<code>[[[[" in timeline  # the outbox row's body, as text, cut

    shown = await cli(settings, "dlq", "show", str(dead["id"]), "--json")
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert json.loads(shown.stdout)["body"] == GARBAGE.decode()
    printed = await cli(settings, "dlq", "show", str(dead["id"]), COLUMNS="200")
    assert printed.returncode == 0, printed.stderr[-2000:]
    assert "[[[[" in printed.stdout

    history = await cli(settings, "user", "history", str(victim), "--json")
    assert history.returncode == 0, history.stderr[-2000:]
    entries = {(e["source"], e["kind"]): e for e in json.loads(history.stdout)["entries"]}
    assert entries["outbox", "scheduled"]["body"].startswith("[[[[")  # as text, on one line
    assert entries["operator", "edit_replay"]["detail"]["text"].startswith(
        '{"actor": "olga", "edited_body": [[['
    )
    table = await cli(settings, "user", "history", str(victim), COLUMNS="200")
    assert table.returncode == 0, table.stderr[-2000:]
    assert "outbox scheduled" in table.stdout

    found = await cli(settings, "find", str(message_id), "--json")
    assert found.returncode == 0, found.stderr[-2000:]
    assert "dead_letter" in {p["place"] for p in json.loads(found.stdout)}
