"""The console's dead letters in process against real Postgres: the list's filters (route,
reason, user, time), and a group's discard going through its confirmation step to every id it
listed, recorded with who did it."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import asyncpg
import httpx
import pytest

from events.routes import PACKAGE_PURCHASE, ROUTES, USAGE_RECORD, Route
from infra.settings import Settings
from tests.support.dead_letters import buried
from tests.web.client import client, csrf_of, form_value, sign_in


@pytest.fixture
async def http(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    async with client(settings, pool) as found:
        assert (await sign_in(found)).status_code == 303
        yield found


async def _bury(pool: asyncpg.Pool, route: Route, user: UUID, reason: str, failed: datetime) -> int:
    return await buried(
        pool,
        route.name,
        user_id=user,
        reason=reason,
        error_type="BadMessageError",
        error_message=f"{reason} happened",
        first_failed_at=failed,
    )


def _listed(page: httpx.Response) -> set[int]:
    return {int(i) for i in re.findall(r'<td><a href="/dead-letters/(\d+)">', page.text)}


async def test_the_list_filters_by_route_reason_user_and_time(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    alice, bob = uuid4(), uuid4()
    now = datetime.now(UTC)
    old = await _bury(pool, PACKAGE_PURCHASE, alice, "schema_invalid", now - timedelta(days=2))
    usage = await _bury(pool, USAGE_RECORD, alice, "domain_rule", now)
    bobs = await _bury(pool, PACKAGE_PURCHASE, bob, "domain_rule", now)
    async with pool.acquire() as conn:  # last_failed_at is when it was filed: move the old one
        await conn.execute(
            "UPDATE telecom.dead_letters SET last_failed_at = first_failed_at WHERE id = $1", old
        )

    assert _listed(await http.get("/dead-letters")) == {old, usage, bobs}
    assert _listed(await http.get(f"/dead-letters?route={USAGE_RECORD.name}")) == {usage}
    assert _listed(await http.get("/dead-letters?reason=schema_inv")) == {old}
    assert _listed(await http.get(f"/dead-letters?user_id={bob}")) == {bobs}
    since = (now - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    assert _listed(await http.get(f"/dead-letters?since={since}")) == {usage, bobs}
    assert _listed(await http.get(f"/dead-letters?until={since}")) == {old}
    assert (await http.get("/dead-letters?user_id=nope")).status_code == 422
    assert (await http.get("/dead-letters?since=yesterday")).status_code == 422


async def test_the_list_reads_its_route_as_the_cli_does_short_name_or_a_422_naming_the_known(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    now = datetime.now(UTC)
    usage = await _bury(pool, USAGE_RECORD, uuid4(), "domain_rule", now)
    await _bury(pool, PACKAGE_PURCHASE, uuid4(), "domain_rule", now)
    assert _listed(await http.get(f"/dead-letters?route={USAGE_RECORD.short_name}")) == {usage}
    unknown = await http.get("/dead-letters?route=nope")
    assert unknown.status_code == 422
    known = ", ".join(route.short_name for route in ROUTES.values())
    assert f"unknown route 'nope'; known routes: {known}" in html.unescape(unknown.text)


async def test_a_groups_discard_confirms_the_ids_it_will_touch_and_records_who(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    now = datetime.now(UTC)
    group = [await _bury(pool, PACKAGE_PURCHASE, uuid4(), "domain_rule", now) for _ in range(3)]
    other = await _bury(pool, USAGE_RECORD, uuid4(), "schema_invalid", now)
    async with pool.acquire() as conn:
        key = await conn.fetchval(
            "SELECT group_key FROM telecom.dead_letters WHERE id = $1", group[0]
        )

    confirm = await http.get(f"/dead-letters/confirm?action=discard&group={key}")
    assert confirm.status_code == 200
    assert "Discard 3 dead letters?" in confirm.text
    ids, token = form_value(confirm.text, "ids"), csrf_of(confirm.text)
    assert sorted(int(i) for i in ids.split(",")) == sorted(group)

    done = await http.post(
        "/dead-letters/act", data={"csrf": token, "action": "discard", "ids": ids}
    )
    assert done.status_code == 303
    assert "discarded+3+dead+letter" in done.headers["location"]
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT id, status::text AS status, discarded_by FROM telecom.dead_letters ORDER BY id"
        )
        audit = await conn.fetchrow(
            "SELECT actor, action, detail::text AS detail FROM telecom.operator_actions"
        )
    states = {r["id"]: (r["status"], r["discarded_by"]) for r in rows}
    assert all(states[i] == ("discarded", "web:olga") for i in group)
    assert states[other] == ("buried", None)
    assert audit is not None
    assert (audit["actor"], audit["action"]) == ("web:olga", "discard")


async def test_message_data_is_shown_as_text_never_as_markup(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    script = "<script>alert(1)</script>"
    dead = await buried(
        pool,
        PACKAGE_PURCHASE.name,
        user_id=None,
        message_type=script,
        body=b'{"note": "<img src=x onerror=alert(2)>"}',
        headers={"x-evil": script},
        reason="schema_invalid",
        error_type="BadMessageError",
        error_message=script,
        traceback=script,
    )
    for path in (f"/dead-letters/{dead}", "/dead-letters"):
        page = await http.get(path)
        assert page.status_code == 200
        assert "<script>alert" not in page.text
        assert "<img src=x" not in page.text
    detail = await http.get(f"/dead-letters/{dead}")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in detail.text
