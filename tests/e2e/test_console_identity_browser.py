"""A message is its own, in the operator console, in a real headless Chromium against real
`pkgq relay`, `pkgq run` and `pkgq web` processes: garbage filed under no user shows the user
its header claimed as a claim, and a hold whose blocker lies buried is released all the same,
the confirmation page and the flash saying what stays behind.

Screenshots go to build/screenshots/ (git-ignored): dead-letter-claimed-user.png,
hold-release-warning.png and holds-released-with-warning.png."""

from __future__ import annotations

from collections.abc import Callable
from uuid import uuid4

import asyncpg
import pytest
from playwright.async_api import expect

from events.envelope import H_USER_ID
from infra.settings import Settings
from tests.support import keys
from tests.support.dead_letters import buried
from tests.support.observing import fetch
from tests.support.processes import PkgqProcess
from tests.web.client import OPERATOR_PASSWORD
from tests.web.stack import browser, console, shoot, sign_in

pytestmark = pytest.mark.e2e


async def test_a_claimed_user_is_shown_as_a_claim_and_a_buried_blockers_hold_is_released_warned(
    settings: Settings, pool: asyncpg.Pool, spawn: Callable[..., PkgqProcess]
) -> None:
    victim, user, blocker = uuid4(), uuid4(), uuid4()
    garbage = await buried(
        pool,
        message_id=str(uuid4()),
        user_id=None,
        body=b"not json",
        content_type="text/plain",
        headers={H_USER_ID: str(victim)},
        reason="wrong_content_type",
        error_type="BadMessageError",
        error_message="content_type is 'text/plain', expected application/json",
        publisher="mallory",
    )
    await buried(pool, message_id=str(blocker), user_id=user)
    await keys.hold(pool, "usage_record", user, blocker, "buried", None, 3, "boom")
    async with console(settings, spawn) as web, browser() as chromium:
        page = await sign_in(chromium, web.base, "olga", OPERATOR_PASSWORD)
        await page.goto(f"{web.base}/dead-letters/{garbage}")
        facts = page.locator("main")
        await expect(facts).to_contain_text("its body names none")
        await expect(facts).to_contain_text(f"header claims {victim}")
        await expect(facts).to_contain_text("a claim, not believed")
        assert await page.locator(f"a[href='/users/{victim}']").count() == 0  # no link to it
        await shoot(page, "dead-letter-claimed-user")

        await page.goto(f"{web.base}/holds/release?consumer=usage_record&user_id={user}")
        await expect(facts).to_contain_text(f"message {blocker} lies buried")
        await expect(facts).to_contain_text("replay or discard its dead letter")
        await shoot(page, "hold-release-warning")
        await page.click("button:has-text('Yes, release the hold')")
        flash = page.locator("p.flash")
        await expect(flash).to_contain_text("released the hold")
        await expect(flash).to_contain_text("lies buried")
        await shoot(page, "holds-released-with-warning")

    # Released: its blocker gone (the consumer's release poll may have dropped it already, with
    # nothing parked behind it).
    held = await fetch(pool, "SELECT blocker FROM telecom.holds WHERE user_id = $1", user)
    assert [r["blocker"] for r in held] in ([], [None])
    letters = await fetch(
        pool,
        "SELECT status::text AS status FROM telecom.dead_letters WHERE message_id = $1",
        str(blocker),
    )
    assert [r["status"] for r in letters] == ["buried"]  # left to be replayed or discarded
