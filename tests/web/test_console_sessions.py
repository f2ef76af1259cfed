"""Console sessions that end, in process against real Postgres: sign-out ends the session on the
server (a copied cookie opens nothing afterwards), "sign out everywhere" ends every session of
one user, sign-in always starts a new session id, a removed or changed user's sessions end, the
absolute expiry holds, expired rows are pruned, and only a hash of the id is stored."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from uuid import uuid4

import asyncpg
import httpx
import pytest

from consumers.web.app import create_app
from consumers.web.auth import hash_password
from consumers.web.config import WebSettings, WebUser
from consumers.web.dependencies import open_pool
from infra.postgres import retention
from infra.settings import Settings
from tests.web.client import (
    OPERATOR_PASSWORD,
    VIEWER_PASSWORD,
    client,
    csrf,
    sign_in,
    web_settings,
)

COOKIE = "pkgq_session"


@asynccontextmanager
async def browser_with(
    settings: Settings, pool: asyncpg.Pool, cookie: str, web: WebSettings | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """Another browser (a new client) holding a copy of `cookie`."""
    async with client(settings, pool, web) as other:
        other.cookies.set(COOKIE, cookie)
        yield other


async def opens_pages(http: httpx.AsyncClient) -> bool:
    """Whether the client's session opens a console page (else: sent to sign in)."""
    reply = await http.get("/holds")
    assert reply.status_code in (200, 303), reply.text
    if reply.status_code == 303:
        assert reply.headers["location"].startswith("/login")
    return reply.status_code == 200


def sid_of(cookie: str) -> str:
    """The session id inside a signed session cookie (base64 JSON, then timestamp, signature)."""
    payload = cookie.split(".", 1)[0]
    session = json.loads(base64.b64decode(payload + "=" * (-len(payload) % 4)))
    sid = session.get("sid")
    assert isinstance(sid, str), session
    return sid


async def session_rows(pool: asyncpg.Pool, user: str) -> int:
    found = await pool.fetchval(
        "SELECT count(*) FROM telecom.web_sessions WHERE user_name = $1", user
    )
    return int(found)


async def sign_out(http: httpx.AsyncClient, path: str = "/logout") -> httpx.Response:
    return await http.post(path, data={"csrf": await csrf(http, "/holds")})


async def test_a_cookie_copied_before_sign_out_is_refused_after_it(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    async with client(settings, pool) as http:
        await sign_in(http, "olga", OPERATOR_PASSWORD)
        copied = http.cookies[COOKIE]
        async with browser_with(settings, pool, copied) as thief:
            assert await opens_pages(thief)  # the copy works while the session lasts
        reply = await sign_out(http)
        assert (reply.status_code, reply.headers["location"]) == (303, "/login")
        assert not await opens_pages(http)
    async with browser_with(settings, pool, copied) as thief:
        assert not await opens_pages(thief)
        api = await thief.get(f"/api/v1/users/{uuid4()}/current")
        assert api.status_code == 401  # nor does the copy open the read API
        token = await csrf(thief, "/login")
        refused = await thief.post("/routes/usage_record/pause", data={"csrf": token})
        assert refused.status_code == 303  # an action too: off to sign in, nothing done
    assert await session_rows(pool, "olga") == 0


async def test_sign_out_everywhere_ends_every_session_of_the_user_and_no_one_elses(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    async with (
        client(settings, pool) as laptop,
        client(settings, pool) as phone,
        client(settings, pool) as colleague,
    ):
        await sign_in(laptop, "olga", OPERATOR_PASSWORD)
        await sign_in(phone, "olga", OPERATOR_PASSWORD)
        await sign_in(colleague, "vic", VIEWER_PASSWORD)
        copied = phone.cookies[COOKIE]
        page = await phone.get("/holds")
        assert 'formaction="/logout/everywhere"' in page.text  # the header's button
        reply = await sign_out(phone, "/logout/everywhere")
        assert reply.status_code == 303
        assert reply.headers["location"].startswith("/login?done=")
        notice = await phone.get(reply.headers["location"])
        assert "olga signed out everywhere (2 session(s) ended)" in notice.text
        assert not await opens_pages(laptop)
        assert not await opens_pages(phone)
        assert await opens_pages(colleague)
    async with browser_with(settings, pool, copied) as thief:
        assert not await opens_pages(thief)
    assert await session_rows(pool, "olga") == 0
    assert await session_rows(pool, "vic") == 1


async def test_sign_out_everywhere_without_its_csrf_token_ends_nothing(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    async with client(settings, pool) as http:
        await sign_in(http, "olga", OPERATOR_PASSWORD)
        for data in [{}, {"csrf": "forged"}]:
            reply = await http.post("/logout/everywhere", data=data)
            assert reply.status_code == 403
            assert "CSRF token" in reply.text
        assert await opens_pages(http)
    assert await session_rows(pool, "olga") == 1


async def test_a_session_id_planted_before_sign_in_never_becomes_a_signed_in_session(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    async with client(settings, pool) as victim:
        await victim.get("/login")  # an anonymous session: the login form's CSRF token
        planted = victim.cookies[COOKIE]  # what an attacker could have set in the browser
        await sign_in(victim, "olga", OPERATOR_PASSWORD)
        assert await opens_pages(victim)
    async with browser_with(settings, pool, planted) as attacker:
        assert not await opens_pages(attacker)


async def test_signing_in_again_rotates_the_session_id_and_ends_the_one_before(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    async with client(settings, pool) as http:
        await sign_in(http, "olga", OPERATOR_PASSWORD)
        first = http.cookies[COOKIE]
        await sign_in(http, "olga", OPERATOR_PASSWORD)
        second = http.cookies[COOKIE]
        assert sid_of(first) != sid_of(second)
        assert await opens_pages(http)
    async with browser_with(settings, pool, first) as old:
        assert not await opens_pages(old)
    async with browser_with(settings, pool, second) as new:
        assert await opens_pages(new)
    assert await session_rows(pool, "olga") == 1


async def test_only_the_sha256_of_the_session_id_is_stored(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    async with client(settings, pool) as http:
        await sign_in(http, "vic", VIEWER_PASSWORD)
        sid = sid_of(http.cookies[COOKIE])
    rows = await pool.fetch("SELECT id_hash, user_name, role FROM telecom.web_sessions")
    assert [dict(r) for r in rows] == [
        {"id_hash": hashlib.sha256(sid.encode()).digest(), "user_name": "vic", "role": "viewer"}
    ]
    dump = str([dict(r) for r in await pool.fetch("SELECT * FROM telecom.web_sessions")])
    assert sid not in dump


async def test_a_user_removed_from_the_settings_has_their_session_ended_for_good(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    web = web_settings()
    async with client(settings, pool, web) as http:
        await sign_in(http, "vic", VIEWER_PASSWORD)
        cookie = http.cookies[COOKIE]
    without_vic = web_settings(users={"olga": web.users["olga"]})
    async with browser_with(settings, pool, cookie, without_vic) as removed:
        assert not await opens_pages(removed)
    assert await session_rows(pool, "vic") == 0
    async with browser_with(settings, pool, cookie, web) as added_back:
        assert not await opens_pages(added_back)  # the session ended; it does not come back


async def test_a_user_removed_while_away_finds_no_session_when_added_back(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    web = web_settings()
    async with client(settings, pool, web) as http:
        await sign_in(http, "olga", OPERATOR_PASSWORD)
        cookie = http.cookies[COOKIE]
    async with client(settings, pool, web) as http:
        await sign_in(http, "vic", VIEWER_PASSWORD)
        vics = http.cookies[COOKIE]
    # A console starts without vic (and never sees vic's cookie), then one with vic again.
    without_vic = create_app(settings, web_settings(users={"olga": web.users["olga"]}), pool)
    async with without_vic.router.lifespan_context(without_vic):
        pass
    assert await session_rows(pool, "vic") == 0
    assert await session_rows(pool, "olga") == 1
    async with browser_with(settings, pool, vics, web) as added_back:
        assert not await opens_pages(added_back)
    async with browser_with(settings, pool, cookie, web) as olga:
        assert await opens_pages(olga)


@pytest.mark.parametrize("change", ["role", "password"])
async def test_a_changed_role_or_password_ends_the_users_session(
    settings: Settings, pool: asyncpg.Pool, change: str
) -> None:
    web = web_settings()
    async with client(settings, pool, web) as http:
        await sign_in(http, "vic", VIEWER_PASSWORD)
        cookie = http.cookies[COOKIE]
    vic = (
        WebUser(role="operator", password=web.users["vic"].password)
        if change == "role"
        else WebUser(role="viewer", password=hash_password("a new one", log_n=10))
    )
    changed = web_settings(users={**web.users, "vic": vic})
    async with browser_with(settings, pool, cookie, changed) as http:
        assert not await opens_pages(http)
    assert await session_rows(pool, "vic") == 0


async def test_a_session_is_refused_past_its_ttl_however_busy(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    async with client(settings, pool) as http:
        await sign_in(http, "vic", VIEWER_PASSWORD)
        assert await opens_pages(http)
        # Eight hours and a second later (the default PKGQ_WEB_SESSION_TTL), by the server's
        # clock: the session's row is moved back in time.
        await pool.execute(
            "UPDATE telecom.web_sessions SET signed_in_at = signed_in_at - interval '8h 1s', "
            "expires_at = expires_at - interval '8h 1s'"
        )
        assert not await opens_pages(http)


async def test_a_lowered_ttl_applies_to_sessions_signed_in_before(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    async with client(settings, pool) as http:
        await sign_in(http, "vic", VIEWER_PASSWORD)
        cookie = http.cookies[COOKIE]
    await pool.execute(
        "UPDATE telecom.web_sessions SET signed_in_at = signed_in_at - interval '2 minutes'"
    )
    async with browser_with(settings, pool, cookie) as default_ttl:
        assert await opens_pages(default_ttl)
    async with browser_with(settings, pool, cookie, web_settings(session_ttl=60)) as short:
        assert not await opens_pages(short)


async def test_retention_prunes_expired_sessions_and_keeps_live_ones(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    for user, password in [("vic", VIEWER_PASSWORD), ("olga", OPERATOR_PASSWORD)]:
        async with client(settings, pool) as http:
            await sign_in(http, user, password)
    await pool.execute(
        "UPDATE telecom.web_sessions SET expires_at = now() - interval '1 second' "
        "WHERE user_name = 'vic'"
    )
    pruned = await retention.prune(pool, retention_s=7 * 86400, batch_size=100)
    assert pruned["web_sessions"] == 1
    assert (await session_rows(pool, "vic"), await session_rows(pool, "olga")) == (0, 1)


async def test_a_console_request_looks_its_session_up_with_one_read(
    settings: Settings,
) -> None:
    statements: list[str] = []
    web = web_settings()
    pool = await open_pool(settings, web, query_logger=lambda q: statements.append(q.query))
    try:
        async with client(settings, pool, web) as http:
            await sign_in(http, "vic", VIEWER_PASSWORD)
            statements.clear()
            reply = await http.get(f"/api/v1/users/{uuid4()}/current")
            assert reply.status_code == 404  # signed in: the read ran, and found nobody
        assert len(statements) == 2, statements  # the session, then the read
        assert "FROM telecom.web_sessions" in statements[0]
        assert statements[0].lstrip().startswith("SELECT")  # a read: no write per request
    finally:
        await pool.close()
