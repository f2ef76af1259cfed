"""A paced bulk replay in the operator console, in a real headless Chromium against real
`pkgq relay`, `pkgq run` and `pkgq web` processes: the dead-letter page's bulk replay takes a
rate, the run goes on in the background, its page shows what was sent, what failed again, what
is left, the rate and the estimated end while it refreshes, and the list of runs links to it.

Screenshots go to build/screenshots/ (git-ignored): replay-confirm-rate.png, replay-run.png
(running), replay-run-done.png and replay-runs.png."""

from __future__ import annotations

from collections.abc import Callable

import asyncpg
import pytest
from playwright.async_api import expect

from events.routes import USAGE_RECORD
from infra.settings import Settings
from tests.support.dead_letters import buried
from tests.support.observing import fetch
from tests.support.processes import PkgqProcess
from tests.web.client import OPERATOR_PASSWORD
from tests.web.stack import browser, console, reload_until, shoot, sign_in

pytestmark = pytest.mark.e2e

LETTERS = 30


async def test_a_bulk_replay_at_a_rate_shows_its_progress_page_until_it_is_done(
    settings: Settings, pool: asyncpg.Pool, spawn: Callable[..., PkgqProcess]
) -> None:
    ids = [await buried(pool) for _ in range(LETTERS)]
    async with console(settings, spawn) as web, browser() as chromium:
        page = await sign_in(chromium, web.base, "olga", OPERATOR_PASSWORD)
        await page.goto(f"{web.base}/dead-letters/confirm?action=replay&route={USAGE_RECORD.name}")
        rate = page.locator("input[name='rate']")
        await expect(rate).to_be_visible()
        await rate.fill("10")
        await shoot(page, "replay-confirm-rate")
        await page.click(f"button:has-text('Yes, replay {LETTERS}')")
        await page.wait_for_url(f"{web.base}/dead-letters/replays/*")
        for field in ("sent", "failed-again", "left", "rate", "ends"):
            await expect(page.locator(f"td#{field}")).to_be_visible()
        await shoot(page, "replay-run")
        heading = page.locator("h1")

        async def done() -> bool:
            return "done" in await heading.inner_text()

        await reload_until(page, done, within=90)
        await expect(page.locator("td#sent")).to_have_text(f"{LETTERS} of {LETTERS}")
        await expect(page.locator("td#left")).to_have_text("0")
        await shoot(page, "replay-run-done")
        run_page = page.url
        await page.goto(f"{web.base}/dead-letters/replays")
        await expect(page.locator(f"a[href='{run_page.removeprefix(web.base)}']")).to_be_visible()
        await shoot(page, "replay-runs")

    sent = await fetch(pool, "SELECT dedup_key FROM telecom.outbox WHERE dedup_key LIKE 'replay:%'")
    assert sorted(int(r["dedup_key"].split(":")[1]) for r in sent) == sorted(ids)
