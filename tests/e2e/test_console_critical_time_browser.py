"""The overview's critical time (p50 and p99 of the last hour, per route) in a real headless
Chromium (Debian's) against real `pkgq relay`, `pkgq run` and `pkgq web` processes: purchases
published 90 seconds before pkgq sees them wait in (60 s, 120 s] by the console's buckets, and
the page says the figures are approximate.

The screenshot goes to build/screenshots/ (git-ignored): overview-critical-time.png."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection
from playwright.async_api import expect

from events.envelope import H_SCHEMA_VERSION, H_USER_ID
from events.models import PurchasePackage
from events.routes import PACKAGE_PURCHASE
from infra.rabbit.publisher import Publisher, build_message
from infra.settings import Settings
from tests.support.deliveries import add_package
from tests.support.observing import fetch
from tests.support.processes import PkgqProcess
from tests.web.client import VIEWER_PASSWORD
from tests.web.stack import browser, console, reload_until, shoot, sign_in

pytestmark = pytest.mark.e2e

PURCHASES = 3


def seconds_shown(text: str) -> float:
    """A duration as the overview prints it (`850 ms`, `91.2 s`, `3 min`, `6 h`)."""
    value, unit = text.split()
    return float(value) * {"ms": 0.001, "s": 1.0, "min": 60.0, "h": 3600.0}[unit]


async def test_the_overview_shows_each_routes_critical_p50_and_p99_of_the_last_hour(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    package = await add_package(pool, 1000)
    async with console(settings, spawn) as web, browser() as chromium:
        publisher = await Publisher.open(amqp, settings.exchange, user_id=settings.amqp_user)
        try:
            for _ in range(PURCHASES):
                body = PurchasePackage(user_id=uuid4(), package_id=package)
                message = build_message(
                    body.model_dump_json().encode(),
                    message_id=uuid4(),
                    message_type=PACKAGE_PURCHASE.message_type,
                    headers={
                        H_SCHEMA_VERSION: PACKAGE_PURCHASE.schema_version,
                        H_USER_ID: str(body.user_id),
                    },
                    timestamp=datetime.now(UTC) - timedelta(seconds=90),
                )
                await publisher.publish(message, PACKAGE_PURCHASE.name)
        finally:
            await publisher.close()

        page = await sign_in(chromium, web.base, "vic", VIEWER_PASSWORD)
        row = page.locator("tr[data-route=package_purchase]")
        p50 = row.locator("td[data-col=critical-p50]")
        p99 = row.locator("td[data-col=critical-p99]")

        async def activated() -> bool:
            found = await fetch(pool, "SELECT count(*) AS n FROM telecom.access WHERE granted")
            return bool(found[0]["n"] == PURCHASES)

        await reload_until(page, activated, within=60)
        await page.reload()
        # Every purchase waited 90-something seconds: both figures within (60 s, 120 s].
        for cell in (p50, p99):
            shown = seconds_shown(await cell.inner_text())
            assert 60 < shown <= 120, shown
        # Their activations were published by the relay just before: far below a minute.
        activation = page.locator("tr[data-route=package_activate] td[data-col=critical-p99]")
        assert seconds_shown(await activation.inner_text()) < 60
        # A route nothing was applied on in the hour shows a dash, not a zero.
        await expect(
            page.locator("tr[data-route=quota_adjust] td[data-col=critical-p50]")
        ).to_have_text("\N{EN DASH}")
        await expect(page.locator("#critical-note")).to_contain_text("approximate")
        await shoot(page, "overview-critical-time")
