"""GetAllMyPackages a page at a time (`/api/v1/users/{id}/packages?limit=&after=`) against real
Postgres: a keyset on the queue order (created_at, id), so every item comes exactly once across
the pages, in queue order, with the user's total, whatever the page size and whatever is bought
meanwhile; limits and cursors out of range are refused with 422."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import httpx
import pytest

from consumers.queue_view import PAGE_DEFAULT, PAGE_MAX
from consumers.web.api import Packages
from consumers.web.dependencies import open_pool
from infra.settings import Settings
from tests.support.queue_items import BOUGHT_AT, queue_of
from tests.web.client import bearer, client, web_settings


@pytest.fixture
async def http(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    async with client(settings, pool) as found:
        yield found


async def _page(http: httpx.AsyncClient, user: UUID, **params: Any) -> dict[str, Any]:
    """A 200 page, held to the model the OpenAPI document promises."""
    reply = await http.get(f"/api/v1/users/{user}/packages", params=params, headers=bearer())
    assert reply.status_code == 200, reply.text
    found: dict[str, Any] = reply.json()
    Packages.model_validate(found)
    return found


async def _all_pages(http: httpx.AsyncClient, user: UUID, limit: int) -> list[dict[str, Any]]:
    pages = [await _page(http, user, limit=limit)]
    while pages[-1]["next"] is not None:
        pages.append(await _page(http, user, limit=limit, after=pages[-1]["next"]))
        assert len(pages) <= 200, "the pages never end"
    return pages


async def test_120_items_read_50_at_a_time_come_each_once_in_queue_order_with_the_total(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    user = uuid4()
    in_order = await queue_of(pool, user, 120)
    assert in_order != sorted(in_order)  # queue order is not id order here

    pages = await _all_pages(http, user, 50)

    assert [len(p["packages"]) for p in pages] == [50, 50, 20]
    assert [i["id"] for p in pages for i in p["packages"]] == in_order
    assert {p["total"] for p in pages} == {120}
    assert pages[-1]["next"] is None
    active = [i["id"] for p in pages for i in p["packages"] if i["status"] == "active"]
    assert len(active) == 1
    # The current item is named on every page, also those it is not on.
    assert {p["current_item_id"] for p in pages} == set(active)


@pytest.mark.parametrize("limit", [1, 7, 40, 119, 120, 121, PAGE_MAX])
async def test_every_page_size_yields_the_same_items_in_the_same_order(
    http: httpx.AsyncClient, pool: asyncpg.Pool, limit: int
) -> None:
    user = uuid4()
    in_order = await queue_of(pool, user, 120)

    pages = await _all_pages(http, user, limit)

    assert [i["id"] for p in pages for i in p["packages"]] == in_order
    assert len(pages) == -(-120 // limit)  # no empty last page
    assert all(len(p["packages"]) == limit for p in pages[:-1])


async def test_without_a_limit_a_page_holds_the_default_and_says_where_to_go_on(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    user = uuid4()
    in_order = await queue_of(pool, user, 120)

    first = await _page(http, user)
    rest = await _page(http, user, after=first["next"])

    assert len(first["packages"]) == PAGE_DEFAULT == 100
    assert [i["id"] for i in first["packages"] + rest["packages"]] == in_order
    assert rest["next"] is None


async def test_items_bought_between_two_pages_neither_shift_nor_repeat_what_follows(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    user = uuid4()
    before = await queue_of(pool, user, 60)
    first = await _page(http, user, limit=25)

    bought = await queue_of(pool, user, 6, bought_at=BOUGHT_AT + timedelta(hours=1))
    rest = await _all_pages_after(http, user, first["next"], 25)

    seen = [i["id"] for i in first["packages"]] + [i["id"] for p in rest for i in p["packages"]]
    assert seen == before + bought
    assert rest[-1]["total"] == 66


async def _all_pages_after(
    http: httpx.AsyncClient, user: UUID, after: str, limit: int
) -> list[dict[str, Any]]:
    pages = [await _page(http, user, limit=limit, after=after)]
    while pages[-1]["next"] is not None:
        pages.append(await _page(http, user, limit=limit, after=pages[-1]["next"]))
    return pages


async def test_a_user_without_items_gets_an_empty_last_page_and_a_total_of_0(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    user = uuid4()
    async with pool.acquire() as conn:
        await conn.execute("INSERT INTO telecom.queue_users (user_id) VALUES ($1)", user)

    page = await _page(http, user, limit=10)

    assert (page["packages"], page["total"], page["next"], page["current_item_id"]) == (
        [],
        0,
        None,
        None,
    )


@pytest.mark.parametrize("limit", ["0", "-1", str(PAGE_MAX + 1), "10000000000000000000", "x", ""])
async def test_a_limit_out_of_range_is_refused_with_422(
    http: httpx.AsyncClient, pool: asyncpg.Pool, limit: str
) -> None:
    user = uuid4()
    await queue_of(pool, user, 3)
    reply = await http.get(
        f"/api/v1/users/{user}/packages", params={"limit": limit}, headers=bearer()
    )
    assert reply.status_code == 422, reply.text
    assert reply.json()["detail"][0]["loc"] == ["query", "limit"]


@pytest.mark.parametrize(
    "after",
    [
        "",
        "abc",
        "1.2.3",
        "-5.1",
        "1704110400000000",
        "1704110400000000.x",
        "9999999999999999999.1",  # a time past the year 9999
        "1704110400000000.9999999999999999999",  # an id past a bigint
        "1" * 41,
    ],
)
async def test_a_cursor_this_api_did_not_give_out_is_refused_with_422(
    http: httpx.AsyncClient, pool: asyncpg.Pool, after: str
) -> None:
    user = uuid4()
    await queue_of(pool, user, 3)
    reply = await http.get(
        f"/api/v1/users/{user}/packages", params={"after": after}, headers=bearer()
    )
    assert reply.status_code == 422, reply.text
    assert reply.json()["detail"][0]["loc"] == ["query", "after"]


async def test_a_page_after_a_cursor_is_one_statement_on_the_apps_pool(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    user = uuid4()
    await queue_of(pool, user, 30)
    statements: list[str] = []
    web = web_settings()
    app_pool = await open_pool(settings, web, query_logger=lambda q: statements.append(q.query))
    try:
        async with client(settings, app_pool, web) as http:
            first = await _page(http, user, limit=10)
            statements.clear()
            second = await _page(http, user, limit=10, after=first["next"])
        assert len(statements) == 1, statements
        assert len(second["packages"]) == 10
    finally:
        await app_pool.close()
