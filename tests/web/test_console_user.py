"""A user's queue in the console, in process against real Postgres: the items in queue order,
and a quota adjustment through its confirmation step into the outbox (as the CLI does)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from uuid import UUID, uuid4

import asyncpg
import httpx
import pytest

from infra.postgres import queue_repo
from infra.postgres.pool import Conn
from infra.settings import Settings
from tests.support.deliveries import add_package
from tests.support.queue_items import queue_of
from tests.web.client import client, csrf_of, form_value, sign_in


@pytest.fixture
async def http(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    async with client(settings, pool) as found:
        assert (await sign_in(found)).status_code == 303
        yield found


async def _items(pool: asyncpg.Pool, user: UUID, statuses: list[str]) -> list[int]:
    package = await add_package(pool, 1000, name="plan")
    async with pool.acquire() as conn:
        await conn.execute("INSERT INTO telecom.queue_users (user_id) VALUES ($1)", user)
        return [
            await conn.fetchval(
                "INSERT INTO telecom.package_queue (user_id, package_id, status, package_name, "
                "traffic_limit, created_at) VALUES ($1, $2, $3::telecom.package_status, 'plan', "
                "1000, now() + $4 * interval '1 second') RETURNING id",
                user,
                package,
                status,
                n,
            )
            for n, status in enumerate(statuses)
        ]


async def test_the_user_page_lists_every_item_in_queue_order_with_the_current_one(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    user = uuid4()
    ids = await _items(pool, user, ["consumed", "active", "in_queue"])
    page = await http.get(f"/users/{user}")
    assert page.status_code == 200
    rows = re.findall(r'<tr data-item="(\d+)" data-status="(\w+)" class="(\w*)">', page.text)
    assert rows == [
        (str(ids[0]), "consumed", ""),
        (str(ids[1]), "active", "current"),
        (str(ids[2]), "in_queue", ""),
    ]


async def test_a_quota_adjustment_is_confirmed_then_put_in_the_outbox_with_who_and_why(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    user = uuid4()
    (item,) = await _items(pool, user, ["active"])
    confirm = await http.get(f"/items/{item}/adjust")
    assert confirm.status_code == 200
    assert f"Adjust the quota of item {item}?" in confirm.text
    token = csrf_of(confirm.text)

    bad = await http.post(f"/items/{item}/adjust", data={"csrf": token, "delta": "x"})
    assert bad.status_code == 422
    done = await http.post(
        f"/items/{item}/adjust",
        data={"csrf": token, "delta": "-250", "reason": "goodwill"},
    )
    assert done.status_code == 303
    assert done.headers["location"].startswith(f"/users/{user}?done=")
    async with pool.acquire() as conn:
        bodies = await conn.fetch(
            "SELECT body FROM telecom.outbox WHERE route = 'telecom.quota_adjust'"
        )
    assert [json.loads(bytes(b["body"])) for b in bodies] == [
        {
            "user_id": str(user),
            "item_id": item,
            "delta": -250,
            "reason": "goodwill",
            "operator": "web:olga",
        }
    ]


async def test_a_confirmation_form_posted_twice_sends_its_command_once(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    user = uuid4()
    (item,) = await _items(pool, user, ["active"])
    confirm = await http.get(f"/items/{item}/adjust")
    token, command = csrf_of(confirm.text), form_value(confirm.text, "command_id")
    form = {"csrf": token, "command_id": command, "delta": "100"}
    first = await http.post(f"/items/{item}/adjust", data=form)
    again = await http.post(f"/items/{item}/adjust", data=form)  # a double click, a resubmit
    assert (first.status_code, again.status_code) == (303, 303)
    assert "sent%20already" in again.headers["location"]
    async with pool.acquire() as conn:
        sent = await conn.fetch(
            "SELECT message_id FROM telecom.outbox WHERE route = 'telecom.quota_adjust'"
        )
        audited = await conn.fetchval(
            "SELECT count(*) FROM telecom.operator_actions WHERE action = 'adjust_quota'"
        )
    assert [str(r["message_id"]) for r in sent] == [command]
    assert audited == 1


@pytest.mark.parametrize(("action", "fields"), [("cancel", {}), ("adjust", {"delta": "100"})])
async def test_an_item_action_reads_the_items_owner_once_also_when_posted_twice(
    http: httpx.AsyncClient,
    pool: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch,
    action: str,
    fields: dict[str, str],
) -> None:
    user = uuid4()
    (item,) = await _items(pool, user, ["active"])
    confirm = await http.get(f"/items/{item}/{action}")
    token, command = csrf_of(confirm.text), form_value(confirm.text, "command_id")
    reads: list[int] = []
    item_owner = queue_repo.item_owner

    async def counted(conn: Conn, item_id: int) -> UUID | None:
        reads.append(item_id)
        return await item_owner(conn, item_id)

    monkeypatch.setattr(queue_repo, "item_owner", counted)
    form = {"csrf": token, "command_id": command, **fields}
    first = await http.post(f"/items/{item}/{action}", data=form)
    assert (first.status_code, reads) == (303, [item])
    again = await http.post(f"/items/{item}/{action}", data=form)  # sent already: rolled back
    assert (again.status_code, reads) == (303, [item, item])
    for reply in (first, again):
        assert reply.headers["location"].startswith(f"/users/{user}?done=")
    async with pool.acquire() as conn:
        bodies = await conn.fetch("SELECT body FROM telecom.outbox")
    assert [json.loads(bytes(b["body"]))["user_id"] for b in bodies] == [str(user)]


def _rows(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr data-item="(\d+)"', html)]


def _next(html: str) -> str | None:
    found = re.search(r'<a class="button" rel="next" href="([^"]+)"', html)
    return found.group(1).replace("&amp;", "&") if found else None


async def test_a_user_page_of_120_items_shows_50_of_120_and_its_next_pages_show_the_rest(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    user = uuid4()
    in_order = await queue_of(pool, user, 120)

    first = await http.get(f"/users/{user}")
    assert first.status_code == 200
    assert "showing 50 of 120 (items 1 to 50 in queue order)" in first.text
    assert "First page" not in first.text
    shown, pages, target = _rows(first.text), [first.text], _next(first.text)
    while target is not None:
        page = await http.get(target)
        assert page.status_code == 200
        shown += _rows(page.text)
        pages.append(page.text)
        target = _next(page.text)
        assert len(pages) <= 5, "the pages never end"

    assert shown == in_order
    assert "showing 50 of 120 (items 51 to 100 in queue order)" in pages[1]
    assert "showing 20 of 120 (items 101 to 120 in queue order)" in pages[2]
    assert f'href="/users/{user}">« First page' in pages[2]
    assert len(pages) == 3


async def test_a_user_page_keeps_its_page_size_in_the_next_link(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    user = uuid4()
    in_order = await queue_of(pool, user, 12)
    first = await http.get(f"/users/{user}", params={"limit": "5"})
    target = _next(first.text)
    assert target is not None
    assert "limit=5" in target
    second = await http.get(target)
    assert _rows(first.text) + _rows(second.text) == in_order[:10]
    assert "showing 5 of 12 (items 6 to 10 in queue order)" in second.text


@pytest.mark.parametrize(
    "params",
    [
        {"limit": "0"},
        {"limit": "1001"},
        {"limit": "x"},
        {"after": "nope"},
        {"after": "9" * 19 + ".1"},
    ],
)
async def test_a_user_page_out_of_range_is_refused_with_422(
    http: httpx.AsyncClient, pool: asyncpg.Pool, params: dict[str, str]
) -> None:
    user = uuid4()
    await queue_of(pool, user, 3)
    page = await http.get(f"/users/{user}", params=params)
    assert page.status_code == 422
    assert "limit must be" in page.text or "after:" in page.text
