"""The console's gate, in process against real Postgres: no anonymous page, sign-in with hashed
passwords, sessions that expire, viewers who may not act, and forms refused without their CSRF
token."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from uuid import uuid4

import asyncpg
import httpx
import pytest

from consumers.web import auth
from consumers.web.throttle import Limit, LoginThrottle
from infra.settings import Settings
from tests.web.client import (
    OPERATOR_PASSWORD,
    VIEWER_PASSWORD,
    client,
    csrf,
    sign_in,
    web_settings,
)


@pytest.fixture
async def http(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    async with client(settings, pool) as found:
        yield found


@pytest.mark.parametrize("path", ["/", "/dead-letters", "/holds", "/workers", "/audit"])
async def test_every_page_sends_an_anonymous_visitor_to_sign_in(
    http: httpx.AsyncClient, path: str
) -> None:
    reply = await http.get(path)
    assert reply.status_code == 303
    assert reply.headers["location"] == f"/login?next={path}"


async def test_console_pages_forbid_framing_and_foreign_scripts(http: httpx.AsyncClient) -> None:
    page = await http.get("/login")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    assert "set-cookie" in page.headers  # the login form's CSRF token lives in the session
    assert "samesite=strict" in page.headers["set-cookie"].lower()
    assert "httponly" in page.headers["set-cookie"].lower()


async def test_a_wrong_password_or_an_unknown_user_is_refused(http: httpx.AsyncClient) -> None:
    for user, password in [("olga", "not her password"), ("nobody", OPERATOR_PASSWORD)]:
        reply = await sign_in(http, user, password)
        assert reply.status_code == 401
        assert "wrong user name or password" in reply.text
    assert (await http.get("/")).status_code == 303


async def test_signing_in_opens_the_console_where_it_was_asked_for(
    http: httpx.AsyncClient,
) -> None:
    reply = await sign_in(http, "olga", OPERATOR_PASSWORD, next_page="/holds")
    assert reply.status_code == 303
    assert reply.headers["location"] == "/holds"
    page = await http.get("/")
    assert page.status_code == 200
    assert "olga" in page.text
    assert "package_purchase" in page.text


async def test_the_next_page_after_sign_in_stays_on_this_site(http: httpx.AsyncClient) -> None:
    token = await csrf(http, "/login")
    reply = await http.post(
        "/login",
        data={"csrf": token, "user": "vic", "password": VIEWER_PASSWORD, "next": "//evil.test/"},
    )
    assert reply.headers["location"] == "/"


async def test_a_session_expires_after_its_ttl_however_busy(
    http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    await sign_in(http, "vic", VIEWER_PASSWORD)
    assert (await http.get("/holds")).status_code == 200
    signed_in_at = time.time()
    monkeypatch.setattr(time, "time", lambda: signed_in_at + 8 * 3600 + 1)
    assert (await http.get("/holds")).status_code == 303


async def test_removing_a_user_from_the_settings_ends_their_session(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    web = web_settings()
    async with client(settings, pool, web) as http:
        await sign_in(http, "vic", VIEWER_PASSWORD)
        cookie = http.cookies["pkgq_session"]
    without_vic = web_settings(users={"olga": web.users["olga"]})
    async with client(settings, pool, without_vic) as http:
        http.cookies.set("pkgq_session", cookie)
        assert (await http.get("/holds")).status_code == 303


async def test_a_viewer_may_read_but_every_action_is_refused_with_403(
    http: httpx.AsyncClient,
) -> None:
    await sign_in(http, "vic", VIEWER_PASSWORD)
    token = await csrf(http, "/holds")
    assert (await http.get("/dead-letters/confirm?action=replay&id=1")).status_code == 403
    assert (await http.get("/items/1/cancel")).status_code == 403
    assert (await http.get("/routes/usage_record/pause")).status_code == 403
    for path, data in [
        ("/dead-letters/act", {"action": "discard", "ids": "1"}),
        ("/items/1/cancel", {}),
        ("/dead-letters/1/edit-replay", {"body": "{}"}),
        ("/routes/usage_record/pause", {"reason": "x"}),
        ("/routes/usage_record/resume", {}),
    ]:
        reply = await http.post(path, data={"csrf": token, **data})
        assert reply.status_code == 403, path
        assert "only operators may do this" in reply.text


async def test_a_form_without_its_csrf_token_or_with_another_is_refused_with_403(
    http: httpx.AsyncClient,
) -> None:
    no_token = await http.post("/login", data={"user": "olga", "password": OPERATOR_PASSWORD})
    assert no_token.status_code == 403
    await sign_in(http, "olga", OPERATOR_PASSWORD)
    for data in [{}, {"csrf": "forged"}]:
        for path in ("/items/1/cancel", "/routes/usage_record/pause"):
            reply = await http.post(path, data={**data, "reason": "x"})
            assert reply.status_code == 403
            assert "CSRF token" in reply.text
    assert (await http.post("/logout", data={})).status_code == 403
    assert (await http.get("/holds")).status_code == 200  # still signed in


async def test_an_operator_action_on_a_missing_item_or_route_is_404(
    http: httpx.AsyncClient,
) -> None:
    await sign_in(http, "olga", OPERATOR_PASSWORD)
    token = await csrf(http, "/holds")
    reply = await http.post("/items/424242/cancel", data={"csrf": token})
    assert reply.status_code == 404
    assert f"no queue item {424242}" in reply.text
    assert (await http.get(f"/users/{uuid4()}")).status_code == 404
    for path in ("/routes/no_such_route/pause", "/routes/usage_record/explode"):
        assert (await http.get(path)).status_code == 404
        assert (await http.post(path, data={"csrf": token})).status_code == 404


async def test_too_many_wrong_passwords_for_one_name_make_the_next_sign_in_wait(
    http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(5):  # PKGQ_WEB_LOGIN_FAILURES, default 5
        assert (await sign_in(http, "olga", "guess")).status_code == 401
    hashes: list[str] = []
    real_verify = auth.verify_password

    def counted(password: str, stored: str) -> bool:
        hashes.append("hash")
        return real_verify(password, stored)

    monkeypatch.setattr(auth, "verify_password", counted)
    refused = await sign_in(http, "olga", OPERATOR_PASSWORD)  # the right one, too late
    assert refused.status_code == 429
    assert 0 < int(refused.headers["retry-after"]) <= 300
    assert "too many failed sign-ins" in refused.text
    assert hashes == []  # refused before a password hash is spent on it
    assert (await sign_in(http, "vic", VIEWER_PASSWORD)).status_code == 303  # others may
    assert hashes == ["hash"]


async def test_a_throttled_name_may_sign_in_again_once_its_failures_are_out_of_the_window(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    clock = [1000.0]
    throttle = LoginThrottle(Limit(2, 60), Limit(20, 60), clock=lambda: clock[0])
    async with client(settings, pool, login_throttle=throttle) as http:
        for _ in range(2):
            await sign_in(http, "olga", "guess")
        refused = await sign_in(http, "olga", OPERATOR_PASSWORD)
        assert (refused.status_code, refused.headers["retry-after"]) == (429, "60")
        clock[0] += 60
        assert (await sign_in(http, "olga", OPERATOR_PASSWORD)).status_code == 303


async def test_wrong_passwords_for_many_names_from_one_address_make_that_address_wait(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    async with client(settings, pool, web_settings(login_address_failures=3)) as http:
        for name in ["ann", "bob", "cy"]:
            assert (await sign_in(http, name, "guess")).status_code == 401
        assert (await sign_in(http, "olga", OPERATOR_PASSWORD)).status_code == 429
