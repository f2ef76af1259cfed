"""Console sessions that end, in a real headless Chromium (Debian's) against a real `pkgq web`:
a session cookie copied before "Sign out" opens nothing afterwards, in another browser context;
"Sign out everywhere" ends the session in every other context of the user; a cookie from before
the sign-in never becomes a signed-in session.

Each test saves screenshots of the pages it visits to build/screenshots/ (git-ignored)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from playwright.async_api import Browser, BrowserContext, Cookie, Page

from infra.settings import Settings
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, free_port, http_get
from tests.web.client import OPERATOR_PASSWORD, VIEWER_PASSWORD
from tests.web.stack import browser, shoot, sign_in, web_env

pytestmark = pytest.mark.e2e


@asynccontextmanager
async def console_alone(spawn: Callable[..., PkgqProcess]) -> AsyncIterator[str]:
    """`pkgq web` by itself (sessions need no consumer or relay), ready; its base URL."""
    port = free_port()
    spawn("web", **web_env(port))

    async def ready() -> bool:
        try:
            return (await http_get(port, "/readyz"))[0] == 200
        except OSError:
            return False

    await eventually(ready, within=60)
    yield f"http://127.0.0.1:{port}"


async def with_cookies(
    chromium: Browser, base: str, cookies: list[Cookie]
) -> tuple[BrowserContext, Page]:
    """A new browser context (no state shared with any other) holding copies of `cookies`,
    set for the console's URL by name and value: what someone who copied them could do."""
    context = await chromium.new_context(viewport={"width": 1360, "height": 900})
    await context.add_cookies(
        [{"name": c["name"], "value": c["value"], "url": base} for c in cookies]
    )
    page = await context.new_page()
    page.set_default_timeout(20_000)
    return context, page


async def refused(page: Page, base: str, path: str = "/holds") -> bool:
    """Whether opening `path` sends this context to the sign-in form."""
    await page.goto(f"{base}{path}")
    return page.url.startswith(f"{base}/login") and await page.locator("form.login").count() == 1


async def test_a_session_cookie_copied_before_sign_out_is_refused_after_it(
    settings: Settings, spawn: Callable[..., PkgqProcess]
) -> None:
    async with console_alone(spawn) as base, browser() as chromium:
        page = await sign_in(chromium, base, "olga", OPERATOR_PASSWORD)
        copied = await page.context.cookies()
        assert [c["name"] for c in copied] == ["pkgq_session"]
        thief_context, thief = await with_cookies(chromium, base, copied)
        assert not await refused(thief, base)  # the copy works while the session lasts
        await page.click("header .who button:text-is('Sign out')")
        await page.wait_for_url(f"{base}/login")
        await thief.goto(f"{base}/holds")
        assert thief.url == f"{base}/login?next=/holds"
        await shoot(thief, "sessions-copied-cookie-after-sign-out")
        assert await thief.locator("header nav").count() == 0  # nothing of the console shown
        assert await refused(thief, base, "/audit")
        await thief_context.close()
        # A fresh copy of what the signed-out browser now holds opens nothing either.
        _, again = await with_cookies(chromium, base, await page.context.cookies())
        assert await refused(again, base)


async def test_sign_out_everywhere_ends_the_session_in_every_browser_of_the_user(
    settings: Settings, spawn: Callable[..., PkgqProcess]
) -> None:
    async with console_alone(spawn) as base, browser() as chromium:
        laptop = await sign_in(chromium, base, "olga", OPERATOR_PASSWORD)
        phone = await sign_in(chromium, base, "olga", OPERATOR_PASSWORD)
        colleague = await sign_in(chromium, base, "vic", VIEWER_PASSWORD)
        await shoot(phone, "sessions-header")
        await phone.click("header .who button:text-is('Sign out everywhere')")
        await phone.wait_for_url(f"{base}/login?done=*")
        notice = phone.locator("p.flash")
        assert await notice.inner_text() == "olga signed out everywhere (2 session(s) ended)"
        await shoot(phone, "sessions-signed-out-everywhere")
        assert await refused(laptop, base)
        assert await refused(phone, base)
        assert not await refused(colleague, base)


async def test_a_cookie_from_before_sign_in_never_becomes_a_signed_in_session(
    settings: Settings, spawn: Callable[..., PkgqProcess]
) -> None:
    async with console_alone(spawn) as base, browser() as chromium:
        page = await chromium.new_page(viewport={"width": 1360, "height": 900})
        await page.goto(f"{base}/login")
        planted = await page.context.cookies()  # what someone could have set beforehand
        assert [c["name"] for c in planted] == ["pkgq_session"]
        await page.fill("input[name=user]", "olga")
        await page.fill("input[name=password]", OPERATOR_PASSWORD)
        await page.click("button[type=submit]")
        await page.wait_for_url(f"{base}/")
        signed_in = await page.context.cookies()
        assert signed_in[0]["value"] != planted[0]["value"]
        _, attacker = await with_cookies(chromium, base, planted)
        assert await refused(attacker, base)
        assert not await refused(page, base)
