"""A user's queue a page at a time in the operator console, in a real headless Chromium against
real `pkgq run`, `pkgq relay` and `pkgq web` processes: 120 items bought through the broker are
shown 50 to a page in queue order, each page says how many of the total it shows, and its next
link leads through the rest, each item once.

Screenshots go to build/screenshots/ (git-ignored): user-paginated.png is the first page,
user-paginated-last.png the last."""

from __future__ import annotations

from collections.abc import Callable
from uuid import uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from events.models import PurchasePackage
from events.routes import PACKAGE_PURCHASE
from infra.settings import Settings
from tests.e2e.console_support import item_statuses
from tests.support.deliveries import add_package, send
from tests.support.observing import eventually, fetch
from tests.support.processes import PkgqProcess
from tests.web.client import VIEWER_PASSWORD
from tests.web.stack import browser, console, shoot, sign_in

pytestmark = pytest.mark.e2e


async def test_a_user_with_120_items_is_shown_50_to_a_page_with_the_total_and_a_next_link(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    package = await add_package(pool, 1000, name="1 kB")
    user = uuid4()
    async with console(settings, spawn) as web, browser() as chromium:
        for amount in (45, 45, 30):
            purchase = PurchasePackage(user_id=user, package_id=package, amount=amount)
            await send(settings, amqp, PACKAGE_PURCHASE, purchase)

        async def bought_and_one_active() -> bool:
            rows = await fetch(
                pool,
                "SELECT count(*) AS items, count(*) FILTER (WHERE status = 'active') AS active "
                "FROM telecom.package_queue WHERE user_id = $1",
                user,
            )
            return (rows[0]["items"], rows[0]["active"]) == (120, 1)

        await eventually(bought_and_one_active, within=60)
        in_order = [
            r["id"]
            for r in await fetch(
                pool,
                "SELECT id FROM telecom.package_queue WHERE user_id = $1 ORDER BY created_at, id",
                user,
            )
        ]

        page = await sign_in(chromium, web.base, "vic", VIEWER_PASSWORD)
        await page.goto(f"{web.base}/users/{user}")
        pager = page.locator("#pager-top")
        assert "showing 50 of 120 (items 1 to 50 in queue order)" in await pager.inner_text()
        first = await item_statuses(page)
        assert first[0][1] == "active"
        assert await page.locator("#items tr.current").count() == 1
        await shoot(page, "user-paginated")

        shown = [item_id for item_id, _ in first]
        for expected in ("items 51 to 100", "items 101 to 120"):
            await page.click("#pager-top a[rel=next]")
            await page.wait_for_load_state("load")
            assert expected in await page.locator("#pager-top").inner_text()
            shown += [item_id for item_id, _ in await item_statuses(page)]
        assert "showing 20 of 120" in await page.locator("#pager-top").inner_text()
        assert await page.locator("a[rel=next]").count() == 0  # the last page
        assert await page.locator("#pager-top a:has-text('First page')").count() == 1
        await shoot(page, "user-paginated-last")

        assert shown == in_order
