"""Real services for the console's browser tests: `pkgq run`, `pkgq relay` and `pkgq web`
spawned through the CLI (python -m consumers) on the test's database and broker names, and a
headless Chromium from Debian's packages driven by Playwright (never a browser of its own)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from playwright.async_api import Browser, Page, async_playwright

from consumers.web.auth import hash_password
from infra.settings import Settings
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, free_port, http_get
from tests.web.client import OPERATOR_PASSWORD, VIEWER_PASSWORD

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "build" / "screenshots"
"""Build artifacts (git-ignored): one PNG per main page, for a person to look at."""


def web_env(port: int) -> dict[str, str]:
    users = {
        "olga": {"role": "operator", "password": hash_password(OPERATOR_PASSWORD, log_n=10)},
        "vic": {"role": "viewer", "password": hash_password(VIEWER_PASSWORD, log_n=10)},
    }
    return {
        "PKGQ_WEB_PORT": str(port),
        "PKGQ_WEB_SECRET": "browser-test-secret-" + "x" * 20,
        "PKGQ_WEB_USERS": json.dumps(users),
    }


@dataclass
class Console:
    base: str
    processes: list[PkgqProcess]

    def logs(self) -> str:
        return "\n".join(f"--- {p.args}\n{p.logs()[-4000:]}" for p in self.processes)


async def _ready(port: int) -> bool:
    try:
        return (await http_get(port, "/readyz"))[0] == 200
    except OSError:
        return False


@asynccontextmanager
async def console(settings: Settings, spawn: Callable[..., PkgqProcess]) -> AsyncIterator[Console]:
    """The relay, every consumer (with the dead-letter ingester) and the console, all ready."""
    run_port, web_port = free_port(), free_port()
    processes = [
        spawn("relay"),
        spawn("run", PKGQ_HTTP_PORT=str(run_port)),
        spawn("web", **web_env(web_port)),
    ]
    for port in (run_port, web_port):

        async def ready(port: int = port) -> bool:
            return await _ready(port)

        await eventually(ready, within=60)
    yield Console(f"http://127.0.0.1:{web_port}", processes)


@asynccontextmanager
async def browser() -> AsyncIterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        raise AssertionError(f"{CHROMIUM} is missing: run deploy/local/ensure-tools.sh")
    async with async_playwright() as driver:
        found = await driver.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield found
        finally:
            await found.close()


async def sign_in(browser: Browser, base: str, user: str, password: str) -> Page:
    page = await browser.new_page(viewport={"width": 1360, "height": 900})
    page.set_default_timeout(20_000)
    await page.goto(f"{base}/")
    assert "/login" in page.url  # no anonymous access: the overview sends you to sign in
    await page.fill("input[name=user]", user)
    await page.fill("input[name=password]", password)
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{base}/")
    return page


async def shoot(page: Page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    return path


async def reload_until(
    page: Page, check: Callable[[], Awaitable[bool]], within: float = 30
) -> None:
    """Reload the page until `check` holds (the consumers apply things asynchronously)."""

    async def reloaded() -> bool:
        # A navigation a click started (a form's GET, a redirect) finishes first: reloading in
        # its middle is refused by the browser ("not attached to an active page").
        await page.wait_for_load_state("load")
        await page.reload()
        return await check()

    reloaded.__qualname__ = check.__qualname__
    await eventually(reloaded, within=within, every=0.5)
