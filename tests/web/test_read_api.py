"""The read API (GetCurrentPackage, GetAllMyPackages, access) against real Postgres, with the
real consumers and relay making each lifecycle state."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import httpx
import pytest
from aio_pika.abc import AbstractRobustConnection
from pydantic import BaseModel

from consumers.web.api import Access, CurrentPackage, Packages
from consumers.web.dependencies import open_pool
from events.models import PurchasePackage, RecordUsage
from events.routes import PACKAGE_PURCHASE, USAGE_RECORD
from infra.settings import Settings
from tests.support.deliveries import add_package, send
from tests.support.in_process import InProcess
from tests.support.observing import eventually
from tests.web.client import bearer, client, web_settings


@pytest.fixture
async def http(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    async with client(settings, pool) as found:
        yield found


@pytest.fixture
async def running(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> AsyncIterator[InProcess]:
    app = InProcess(settings, pool, amqp)
    await app.start_consumers()
    await app.start_relay()
    yield app
    await app.close()


MODELS: dict[str, type[BaseModel]] = {
    "current": CurrentPackage,
    "packages": Packages,
    "access": Access,
}


async def _get(http: httpx.AsyncClient, user: UUID, what: str) -> dict[str, Any]:
    """A 200 answer, held to the model its OpenAPI document promises (strictly: no field
    missing, none extra)."""
    reply = await http.get(f"/api/v1/users/{user}/{what}", headers=bearer())
    assert reply.status_code == 200, reply.text
    found: dict[str, Any] = reply.json()
    MODELS[what].model_validate(found)
    return found


async def _until(http: httpx.AsyncClient, user: UUID, state: str, item: int | None) -> None:
    """Wait for the API to report `state` (on `item`, if given)."""

    async def reached() -> bool:
        reply = await http.get(f"/api/v1/users/{user}/current", headers=bearer())
        if reply.status_code != 200:
            return False
        body = reply.json()
        if body["state"] != state or (item is not None and body["item"]["id"] != item):
            return False
        # An active item is granted once package_activate has been applied too.
        return state != "active" or bool(body["access_granted"])

    await eventually(reached)


async def test_current_package_follows_the_lifecycle_from_activation_to_all_expired(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    running: InProcess,
    http: httpx.AsyncClient,
) -> None:
    package = await add_package(pool, 1000, timedelta(hours=1), name="1 kB / 1 h")
    user = uuid4()
    await send(
        settings,
        amqp,
        PACKAGE_PURCHASE,
        PurchasePackage(user_id=user, package_id=package, amount=2),
    )
    await _until(http, user, "active", None)
    first = await _get(http, user, "current")
    first_id = first["item"]["id"]
    assert first["access_granted"] is True
    assert first["queued"] == 1
    assert first["item"]["package"] == "1 kB / 1 h"
    assert first["item"]["traffic_limit"] == 1000
    assert first["item"]["duration_s"] == 3600
    assert first["traffic_used"] == 0
    assert first["traffic_remaining"] == 1000
    assert first["expire_at"] is not None
    assert first["access"]["granted"] is True
    assert first["access"]["item_id"] == first_id

    await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=300, download=100))

    async def used() -> bool:
        return bool((await _get(http, user, "current"))["traffic_used"] == 400)

    await eventually(used)
    now = await _get(http, user, "current")
    assert now["traffic_remaining"] == 600
    assert now["state"] == "active"

    await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=600, download=0))
    await _until(http, user, "active", first_id + 1)
    second = await _get(http, user, "current")
    assert second["queued"] == 0
    assert second["access_granted"] is True
    listed = await _get(http, user, "packages")
    assert [(p["id"], p["status"]) for p in listed["packages"]] == [
        (first_id, "consumed"),
        (first_id + 1, "active"),
    ]
    assert listed["current_item_id"] == first_id + 1

    await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=1000, download=0))
    await _until(http, user, "none", None)
    done = await _get(http, user, "current")
    assert done["item"] is None
    assert done["access_granted"] is False  # from the items, at once

    async def read_model_revoked() -> bool:  # the all_expired consumer's row follows
        access = (await _get(http, user, "current"))["access"]
        return bool(access["granted"] is False)

    await eventually(read_model_revoked)
    listed = await _get(http, user, "packages")
    assert [p["status"] for p in listed["packages"]] == ["consumed", "consumed"]
    assert listed["current_item_id"] is None
    access = await _get(http, user, "access")
    assert access["access"]["granted"] is False


async def test_an_item_past_its_expire_at_is_reported_expired_before_its_timer_has_run(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    running: InProcess,
    http: httpx.AsyncClient,
) -> None:
    package = await add_package(pool, 1000, timedelta(hours=1))
    user = uuid4()
    await send(settings, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package))
    await _until(http, user, "active", None)
    # The clock moves past expire_at; the item's timer is an hour away, so nothing has run.
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE telecom.package_queue SET expire_at = now() - interval '1 second' "
            "WHERE user_id = $1 AND status = 'active'",
            user,
        )
        await conn.execute(  # the read model carries the item's expire_at
            "UPDATE telecom.access SET expire_at = now() - interval '1 second' WHERE user_id = $1",
            user,
        )
        stored = await conn.fetchval(
            "SELECT status::text FROM telecom.package_queue WHERE user_id = $1", user
        )
    assert stored == "active"

    current = await _get(http, user, "current")
    assert current["state"] == "expired"
    assert current["access_granted"] is False
    assert current["item"]["status"] == "consumed"
    assert current["item"]["expired_by_time_pending_timer"] is True
    assert current["traffic_remaining"] == 0
    access = await _get(http, user, "access")
    assert access["access"]["granted"] is True  # the stored row: all_expired has not run
    assert access["access"]["granted_now"] is False  # but the clock says it is over
    listed = await _get(http, user, "packages")
    assert listed["current_item_id"] is None
    assert listed["packages"][0]["status"] == "consumed"


async def test_purchased_items_waiting_for_activation_are_reported_queued(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    http: httpx.AsyncClient,
) -> None:
    app = InProcess(settings, pool, amqp)
    await app.start_consumers([PACKAGE_PURCHASE])  # nobody activates
    try:
        package = await add_package(pool, 1000)
        user = uuid4()
        await send(
            settings,
            amqp,
            PACKAGE_PURCHASE,
            PurchasePackage(user_id=user, package_id=package, amount=3),
        )
        await _until(http, user, "queued", None)
    finally:
        await app.close()
    current = await _get(http, user, "current")
    assert current["queued"] == 3
    assert current["item"] is None
    assert current["access_granted"] is False
    assert current["access"] is None
    listed = await _get(http, user, "packages")
    assert [p["status"] for p in listed["packages"]] == ["in_queue"] * 3


@pytest.mark.parametrize("what", ["current", "packages", "access"])
async def test_an_unknown_user_is_404(http: httpx.AsyncClient, what: str) -> None:
    reply = await http.get(f"/api/v1/users/{uuid4()}/{what}", headers=bearer())
    assert reply.status_code == 404
    assert "unknown user" in reply.json()["detail"]


@pytest.mark.parametrize("bad", ["not-a-uuid", "12345", "8f6f7c1e-3d4e-4c1a-9d62-0b7f2c1f5a1"])
@pytest.mark.parametrize("what", ["current", "packages", "access"])
async def test_a_malformed_user_id_is_422(http: httpx.AsyncClient, what: str, bad: str) -> None:
    reply = await http.get(f"/api/v1/users/{bad}/{what}", headers=bearer())
    assert reply.status_code == 422
    assert reply.json()["detail"][0]["loc"] == ["path", "user_id"]


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic b2xnYTpvbGdh"}],
    ids=["none", "wrong-token", "not-bearer"],
)
async def test_the_api_refuses_anonymous_callers_with_401(
    http: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    reply = await http.get(f"/api/v1/users/{uuid4()}/current", headers=headers)
    assert reply.status_code == 401
    assert reply.headers["www-authenticate"] == "Bearer"


async def test_each_read_is_one_statement_on_the_apps_long_lived_pool(settings: Settings) -> None:
    statements: list[str] = []
    web = web_settings()
    pool = await open_pool(settings, web, query_logger=lambda q: statements.append(q.query))
    try:
        known = uuid4()
        async with pool.acquire() as conn:
            await conn.execute("INSERT INTO telecom.queue_users (user_id) VALUES ($1)", known)
        async with client(settings, pool, web) as http:
            for user, status in ((known, 200), (uuid4(), 404)):
                for what in ("current", "packages", "access"):
                    statements.clear()
                    reply = await http.get(f"/api/v1/users/{user}/{what}", headers=bearer())
                    assert reply.status_code == status
                    assert len(statements) == 1, statements  # no reset, no second query
        assert pool.get_size() == 1  # the same connection served every request
    finally:
        await pool.close()
