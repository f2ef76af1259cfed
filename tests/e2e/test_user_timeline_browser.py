"""A user's story in the operator console, in a real headless Chromium against real `pkgq run`,
`pkgq relay` and `pkgq web` processes: a purchase, its activation, billed usage, a purchase that
fails and is dead-lettered, its replay from the console once fixed, and a cancel from the
console all show on the user's timeline in the order they happened, each message linked to the
search that finds it; the search box on the Users page finds the failed message in each place
it is kept, linked to the user's timeline and its dead letter.

Screenshots go to build/screenshots/ (git-ignored): user-timeline.png,
find-user-and-message.png (the search box) and message-search.png (what it found)."""

from __future__ import annotations

from collections.abc import Callable
from uuid import uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from events.models import PurchasePackage, RecordUsage
from events.routes import PACKAGE_PURCHASE, USAGE_RECORD
from infra.settings import Settings
from tests.e2e.console_support import item_statuses
from tests.support.deliveries import add_package, send
from tests.support.observing import eventually, fetch
from tests.support.processes import PkgqProcess
from tests.web.client import OPERATOR_PASSWORD
from tests.web.stack import browser, console, reload_until, shoot, sign_in

pytestmark = pytest.mark.e2e

MILESTONES = [
    ("item", "created"),  # the purchase applied
    ("activation", "activated"),
    ("usage", "billed"),
    ("dead_letter", "dead_lettered"),  # the failed purchase
    ("operator", "replay"),
    ("audit", "cancel"),
]


async def test_a_users_timeline_shows_purchase_activation_usage_failure_replay_and_cancel_in_order(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    package = await add_package(pool, 10_000, name="10 kB")
    missing = package + 1  # not in the catalog yet: that purchase breaks a domain rule
    user = uuid4()

    async def count(sql: str) -> int:
        return int((await fetch(pool, sql, user))[0]["n"])

    async with console(settings, spawn) as web, browser() as chromium:
        bought = PurchasePackage(user_id=user, package_id=package, amount=2)
        await send(settings, amqp, PACKAGE_PURCHASE, bought)

        async def active() -> bool:
            return (
                await count(
                    "SELECT count(*) AS n FROM telecom.package_queue "
                    "WHERE user_id = $1 AND status = 'active'"
                )
                == 1
            )

        await eventually(active, within=60)
        usage = RecordUsage(user_id=user, upload=100, download=200, usage_id="bill-1")
        await send(settings, amqp, USAGE_RECORD, usage)

        async def billed() -> bool:
            return bool(
                await count("SELECT count(*) AS n FROM telecom.usage_billed WHERE user_id = $1")
            )

        await eventually(billed, within=60)
        failing = PurchasePackage(user_id=user, package_id=missing)
        failed_id = await send(settings, amqp, PACKAGE_PURCHASE, failing)

        async def buried() -> bool:
            return (
                await count(
                    "SELECT count(*) AS n FROM telecom.dead_letters WHERE user_id = $1 "
                    "AND status = 'buried'"
                )
                == 1
            )

        await eventually(buried, within=60)
        assert await add_package(pool, 2000, name="added later") == missing  # the fix

        page = await sign_in(chromium, web.base, "olga", OPERATOR_PASSWORD)
        await page.goto(f"{web.base}/dead-letters?user_id={user}")
        await page.click("#letters tbody a[href^='/dead-letters/']")
        await page.click("text=Replay…")
        await page.click("button:has-text('Yes, replay 1')")
        assert "replayed 1 dead letter(s)" in await page.inner_text(".flash")

        await page.goto(f"{web.base}/users/{user}")

        async def three_items() -> bool:
            return len(await item_statuses(page)) == 3

        await reload_until(page, three_items, within=60)
        (first, status), *_ = await item_statuses(page)
        assert status == "active"
        await page.click(f"tr[data-item='{first}'] >> text=Cancel…")
        await page.fill("input[name=reason]", "refund #7")
        await page.click(f"button:has-text('Yes, cancel item {first}')")

        async def cancelled() -> bool:
            return (first, "cancelled") in await item_statuses(page)

        await reload_until(page, cancelled, within=60)
        await page.click("#timeline-link")
        await page.wait_for_url(f"{web.base}/users/{user}/timeline")
        shown = await page.eval_on_selector_all(
            "#timeline tbody tr",
            "rows => rows.map(r => [r.dataset.source, r.dataset.kind, r.innerText])",
        )
        oldest_first = [(source, kind) for source, kind, _ in reversed(shown)]
        assert set(MILESTONES) <= set(oldest_first), oldest_first
        where = [oldest_first.index(m) for m in MILESTONES]
        assert where == sorted(where), list(zip(MILESTONES, where, strict=True))
        text = await page.inner_text("#timeline")
        assert "refund #7" in text  # the cancel's reason, from the item audit
        assert "same transaction as" in text  # an event linked to the message that caused it
        assert str(user) not in await page.inner_text("#timeline tbody")  # bodies summarized
        await shoot(page, "user-timeline")

        failed_row = page.locator("#timeline tr[data-kind='dead_lettered']")
        assert await failed_row.locator(f"a[href='/messages?message_id={failed_id}']").count()
        # the search box on the Users page finds it wherever it is
        await page.click("nav >> text=Users")
        await page.fill("input[name=message_id]", str(failed_id))
        await shoot(page, "find-user-and-message")
        async with page.expect_navigation():
            await page.click("button:has-text('Find')")
        places = await page.eval_on_selector_all(
            "#places tbody tr", "rows => rows.map(r => r.dataset.place)"
        )
        assert {"dead_letter", "operator", "outbox", "inbox"} <= set(places), places
        dead = await pool.fetchval("SELECT id FROM telecom.dead_letters WHERE user_id = $1", user)
        link = page.locator(f"#places tr[data-place='dead_letter'] a[href='/dead-letters/{dead}']")
        assert await link.count() == 1
        await shoot(page, "message-search")
