"""The console's app in the test's event loop, on the test's pool, behind an httpx client."""

from __future__ import annotations

import functools
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import httpx

from consumers.web.app import create_app
from consumers.web.auth import hash_password
from consumers.web.config import WebSettings, WebToken, WebUser
from consumers.web.throttle import LoginThrottle
from infra.settings import Settings

VIEWER_TOKEN = "viewer-token-" + "v" * 40
OPERATOR_PASSWORD = "operator-password"
VIEWER_PASSWORD = "viewer-password"


@functools.cache
def hashed(password: str) -> str:
    """A cheap hash of `password`, the same in every app of a run: each app a test makes is
    another replica of one console, configured alike (a session remembers the hash it was
    signed in with, and a changed one ends it)."""
    return hash_password(password, log_n=10)


def web_settings(**overrides: object) -> WebSettings:
    """Two users (olga the operator, vic the viewer) and a viewer token, with cheap hashes."""
    import hashlib

    values: dict[str, object] = {
        "secret": "s" * 40,
        "users": {
            "olga": WebUser(role="operator", password=hashed(OPERATOR_PASSWORD)),
            "vic": WebUser(role="viewer", password=hashed(VIEWER_PASSWORD)),
        },
        "tokens": {
            "node-mgmt": WebToken(
                role="viewer", sha256=hashlib.sha256(VIEWER_TOKEN.encode()).hexdigest()
            )
        },
    }
    values.update(overrides)
    return WebSettings(**values)  # type: ignore[arg-type]  # keys are WebSettings fields


@asynccontextmanager
async def client(
    settings: Settings,
    pool: asyncpg.Pool,
    web: WebSettings | None = None,
    *,
    login_throttle: LoginThrottle | None = None,
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, web or web_settings(), pool)
    if login_throttle is not None:  # e.g. one on a clock the test moves
        app.state.login_throttle = login_throttle
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://console") as http:
        yield http


def form_value(page: str, name: str) -> str:
    """The value of the hidden field `name` in a console page's form."""
    found = re.search(rf'name="{name}" value="([^"]*)"', page)
    assert found is not None, f"no field {name!r} in: {page}"
    return found.group(1)


def csrf_of(page: str) -> str:
    """The CSRF token a console page's form carries."""
    return form_value(page, "csrf")


async def csrf(http: httpx.AsyncClient, path: str) -> str:
    """The CSRF token of the form on the page at `path`."""
    return csrf_of((await http.get(path)).text)


async def sign_in(
    http: httpx.AsyncClient,
    user: str = "olga",
    password: str = OPERATOR_PASSWORD,
    *,
    next_page: str | None = None,
) -> httpx.Response:
    """Sign in through the login form (olga, the operator, by default); the redirect."""
    data = {"csrf": await csrf(http, "/login"), "user": user, "password": password}
    if next_page is not None:
        data["next"] = next_page
    return await http.post("/login", data=data)


def bearer(token: str = VIEWER_TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
