"""The invariants in the console, in process against real Postgres: the overview shows a
violation from the checks' stored results (it never runs them itself) with a link to the holds
page; the holds page marks an orphaned hold, and an operator releases it behind a confirmation,
CSRF-checked and audited, after which `pkgq doctor` is clean."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from html import unescape
from urllib.parse import unquote
from uuid import UUID, uuid4

import asyncpg
import httpx
import pytest

from consumers.cli import exit_codes
from infra.postgres import invariants
from infra.settings import Settings
from tests.support.dead_letters import buried
from tests.support.observing import fetch
from tests.support.processes import cli
from tests.web.client import VIEWER_PASSWORD, client, csrf_of, form_value, sign_in


@pytest.fixture
async def http(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    async with client(settings, pool) as found:
        assert (await sign_in(found)).status_code == 303  # olga, the operator
        yield found


async def orphaned_hold(pool: asyncpg.Pool, state: str = "retrying") -> tuple[UUID, UUID]:
    user, blocker = uuid4(), uuid4()
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO telecom.holds (consumer, user_id, blocker, state, attempts) "
            "VALUES ('usage_record', $1, $2, $3, 4)",
            user,
            blocker,
            state,
        )
    return user, blocker


async def check_and_store(pool: asyncpg.Pool) -> None:
    """What the relay does every PKGQ_INVARIANT_CHECK_INTERVAL."""
    async with pool.acquire() as conn:
        await invariants.check_and_store(conn)


async def test_the_overview_shows_a_violation_the_checks_stored_with_a_link_to_the_holds_page(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    before = await http.get("/overview/live")
    assert 'id="invariants"' not in before.text
    assert "(not checked yet)" in before.text

    user, blocker = await orphaned_hold(pool)
    unchecked = await http.get("/overview/live")
    assert 'id="invariants"' not in unchecked.text  # the page reads results, never checks

    await check_and_store(pool)
    page = await http.get("/")
    assert page.status_code == 200
    banner = re.search(r'<div class="error invariants" role="alert" id="invariants">(.*?)</div>',
                       page.text, re.S)  # fmt: skip
    assert banner is not None, page.text
    found = unescape(banner.group(1))
    assert '<li data-check="hold_without_way_out">' in found
    assert "<b>1</b>" in found
    assert '<a href="/holds">See the holds page</a>' in found
    assert f"consumer <code>usage_record</code>, user_id <code>{user}</code>" in found
    assert f"blocker <code>{blocker}</code>" in found
    tile = re.search(r'<div class="tile bad" data-tile="invariants">(.*?)</div>', page.text, re.S)
    assert tile is not None
    assert "<b>1</b>" in tile.group(1)


async def test_the_holds_page_marks_an_orphaned_hold_and_offers_operators_its_release(
    settings: Settings, http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    user, _ = await orphaned_hold(pool)
    fine_user, fine_blocker = uuid4(), uuid4()
    await buried(pool, message_id=str(fine_blocker), user_id=fine_user)
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO telecom.holds (consumer, user_id, blocker, state) "
            "VALUES ('usage_record', $1, $2, 'buried')",
            fine_user,
            fine_blocker,
        )
    page = await http.get("/holds")
    assert 'id="orphaned"' in page.text
    release = f'href="/holds/release?consumer=usage_record&amp;user_id={user}"'
    assert release in page.text
    fine = re.search(rf'<tr data-user="{fine_user}">(.*?)</tr>', page.text, re.S)
    assert fine is not None
    assert "Release" not in fine.group(1)  # its buried dead letter is its way out

    async with client(settings, pool) as viewer:
        assert (await sign_in(viewer, "vic", VIEWER_PASSWORD)).status_code == 303
        seen = await viewer.get("/holds")
        assert 'id="orphaned"' in seen.text
        assert "Release…" not in seen.text
        denied = await viewer.get(f"/holds/release?consumer=usage_record&user_id={user}")
        assert denied.status_code == 403


async def test_an_operator_releases_an_orphaned_hold_from_the_console_audited_and_doctor_is_clean(
    settings: Settings, http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    user, blocker = await orphaned_hold(pool)
    await check_and_store(pool)
    confirm = await http.get(f"/holds/release?consumer=usage_record&user_id={user}")
    assert confirm.status_code == 200
    assert "no retry on its way and no buried dead letter" in confirm.text
    form = {
        "csrf": csrf_of(confirm.text),
        **{k: form_value(confirm.text, k) for k in ("consumer", "user_id", "blocker")},
    }
    assert form["blocker"] == str(blocker)

    forged = await http.post("/holds/release", data={**form, "csrf": "forged"})
    assert forged.status_code == 403
    assert (await fetch(pool, "SELECT blocker FROM telecom.holds"))[0]["blocker"] == blocker

    done = await http.post("/holds/release", data=form)
    assert done.status_code == 303
    assert done.headers["location"].startswith("/holds?done=released%20the%20hold")
    (hold,) = await fetch(pool, "SELECT blocker, state FROM telecom.holds")
    assert (hold["blocker"], hold["state"]) == (None, "releasing")  # for the release poll
    (audit,) = await fetch(pool, "SELECT *, detail::text AS detail FROM telecom.operator_actions")
    assert (audit["actor"], audit["action"], audit["user_id"], audit["message_id"]) == (
        "web:olga",
        "release_hold",
        user,
        blocker,
    )
    assert json.loads(audit["detail"])["consumer"] == "usage_record"
    assert "release_hold" in (await http.get("/audit")).text

    # The stored result followed the release: the overview is clean without waiting for a relay.
    assert 'id="invariants"' not in (await http.get("/overview/live")).text
    clean = await cli(settings, "doctor")
    assert clean.returncode == exit_codes.OK, clean.stdout

    again = await http.post("/holds/release", data=form)  # posted twice: nothing more happens
    assert again.status_code == 409
    assert len(await fetch(pool, "SELECT id FROM telecom.operator_actions")) == 1


async def test_a_hold_with_a_buried_blocker_is_released_from_the_console_with_a_warning(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    user, blocker = uuid4(), uuid4()
    await buried(pool, message_id=str(blocker), user_id=user)
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO telecom.holds (consumer, user_id, blocker, state) "
            "VALUES ('usage_record', $1, $2, 'buried')",
            user,
            blocker,
        )
    confirm = await http.get(f"/holds/release?consumer=usage_record&user_id={user}")
    assert confirm.status_code == 200
    assert f"message {blocker} lies buried" in confirm.text  # the warning
    assert "replay or discard its" in confirm.text  # the usual way out, named
    assert 'action="/holds/release"' in confirm.text  # and the release, all the same
    csrf = csrf_of((await http.get("/holds")).text)
    released = await http.post(
        "/holds/release",
        data={
            "csrf": csrf,
            "consumer": "usage_record",
            "user_id": str(user),
            "blocker": str(blocker),
        },
    )
    assert released.status_code == 303
    assert "lies buried" in unquote(released.headers["location"])
    assert (await fetch(pool, "SELECT blocker FROM telecom.holds"))[0]["blocker"] is None
    (letter,) = await fetch(pool, "SELECT status::text AS status FROM telecom.dead_letters")
    assert letter["status"] == "buried"
    missing = await http.get(f"/holds/release?consumer=package_cancel&user_id={user}")
    assert missing.status_code == 404
