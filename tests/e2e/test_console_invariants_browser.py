"""An invariant violation in the operator console, in a real headless Chromium against real
`pkgq relay`, `pkgq run` and `pkgq web` processes: the relay's periodic check finds a hold made
by hand on a blocker that does not exist, the overview shows it (from the stored results) with
a link to the holds page, and an operator releases the hold there.

Screenshots go to build/screenshots/ (git-ignored): overview-invariant-violated.png is the
overview with the violation shown."""

from __future__ import annotations

from collections.abc import Callable
from uuid import uuid4

import asyncpg
import pytest
from playwright.async_api import expect

from infra.settings import Settings
from tests.support.observing import fetch
from tests.support.processes import PkgqProcess
from tests.web.client import OPERATOR_PASSWORD
from tests.web.stack import browser, console, shoot, sign_in

pytestmark = pytest.mark.e2e


async def test_the_relay_finds_an_orphaned_hold_the_overview_shows_it_and_an_operator_releases_it(
    settings: Settings, pool: asyncpg.Pool, spawn: Callable[..., PkgqProcess]
) -> None:
    user, blocker = uuid4(), uuid4()
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO telecom.holds (consumer, user_id, blocker, state, attempts, last_error) "
            "VALUES ('usage_record', $1, $2, 'retrying', 3, 'its retry was lost')",
            user,
            blocker,
        )
    # The relay's first round of checks runs as it starts, and stores what it found.
    async with console(settings, spawn) as web, browser() as chromium:
        page = await sign_in(chromium, web.base, "olga", OPERATOR_PASSWORD)
        banner = page.locator("#invariants")
        await expect(banner).to_contain_text("hold_without_way_out", timeout=30_000)
        await expect(banner).to_contain_text(str(blocker))
        await expect(banner).to_contain_text(str(user))
        await expect(page.locator("[data-tile=invariants] b")).to_have_text("1")
        await shoot(page, "overview-invariant-violated")

        await banner.locator("a[href='/holds']").click()
        row = page.locator(f"#holds tr[data-user='{user}']")
        await expect(row).to_contain_text("none")
        await expect(page.locator("#orphaned")).to_be_visible()
        await shoot(page, "holds-orphaned")

        await row.locator("a:has-text('Release')").click()
        await expect(page.locator("main")).to_contain_text("no retry on its way")
        await shoot(page, "hold-release-confirm")
        await page.click("button:has-text('Yes, release the hold')")
        await expect(page.locator("p.flash")).to_contain_text("released the hold")
        assert await page.locator("#orphaned").count() == 0

        await page.click("nav >> text=Overview")
        await expect(page.locator("[data-tile=invariants] b")).to_have_text("0")
        assert await page.locator("#invariants").count() == 0
        await shoot(page, "overview-invariants-clean")

    (audit,) = await fetch(pool, "SELECT actor, action, message_id FROM telecom.operator_actions")
    assert (audit["actor"], audit["action"], audit["message_id"]) == (
        "web:olga",
        "release_hold",
        blocker,
    )
