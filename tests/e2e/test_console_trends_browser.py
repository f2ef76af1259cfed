"""The overview's trend charts in a real headless Chromium (Debian's) against real `pkgq relay`,
`pkgq run` and `pkgq web` processes: purchases go through the stack (applied, and their
follow-ups on other routes), two are refused and buried; the charts of the last hour and of the
last day are drawn by the vendored uPlot from what the relay snapshotted and what the counters
say now, with the counts the JSON endpoint answers, and the page's strict CSP is never violated.

Screenshots go to build/screenshots/ (git-ignored): overview-trends-hour.png and
overview-trends-day.png."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection
from playwright.async_api import ConsoleMessage, Page, expect

from events.models import PurchasePackage
from events.routes import PACKAGE_PURCHASE, ROUTES
from infra.settings import Settings
from tests.e2e.console_support import malformed_purchase
from tests.support.deliveries import Sending, add_package
from tests.support.observing import eventually, fetch
from tests.support.processes import PkgqProcess
from tests.web.client import VIEWER_PASSWORD
from tests.web.stack import browser, console, shoot, sign_in

pytestmark = pytest.mark.e2e

APPLIED = 4
"""Purchases applied; each also queues and activates its item (two more routes)."""


async def _charted(page: Page, route: str) -> dict[str, Any]:
    """The data the route's chart was given (uPlot's own copy), by series label ("buckets":
    the x values), and the window."""
    found: dict[str, Any] = await page.evaluate(
        """(route) => {
            const t = window.pkgqTrends;
            const chart = t && t.charts[route];
            if (!chart) return {};
            return {window: t.last.window, ...Object.fromEntries(chart.series.map(
                (s, i) => [i === 0 ? "buckets" : s.label, chart.data[i]]))};
        }""",
        route,
    )
    return found


def _total(found: dict[str, Any], series: str) -> int:
    return sum(v or 0 for v in found.get(series) or [])


async def test_the_overview_charts_each_routes_traffic_over_the_hour_and_the_day(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    package = await add_package(pool, 1000)
    async with console(settings, spawn) as web, browser() as chromium:
        async with Sending(settings, amqp) as sending:
            for _ in range(APPLIED):
                body = PurchasePackage(user_id=uuid4(), package_id=package)
                await sending.send(PACKAGE_PURCHASE, body)
        for _ in range(2):  # refused: `amount` is a string; buried at once
            await malformed_purchase(settings, amqp, uuid4(), package)

        page = await sign_in(chromium, web.base, "vic", VIEWER_PASSWORD)
        refused: list[str] = []

        def seen(message: ConsoleMessage) -> None:
            if message.type == "error" or "Content Security Policy" in message.text:
                refused.append(message.text)

        page.on("console", seen)
        page.on("pageerror", lambda error: refused.append(f"script error: {error}"))
        await page.reload()  # with the listeners on from the start

        async def purchases_charted() -> bool:
            found = await _charted(page, "package_purchase")
            activated = await _charted(page, "package_activate")
            return (
                _total(found, "processed") == APPLIED
                and _total(found, "dead-lettered") == 2
                and _total(activated, "processed") == APPLIED
            )

        await eventually(purchases_charted, within=60, every=0.5)
        hour = await _charted(page, "package_purchase")
        assert hour["window"] == "1h"
        assert len(hour["buckets"]) == 60
        assert _total(hour, "failed") == 2  # buried at once: failed, and dead-lettered
        assert await page.locator("#trend-charts .trend canvas").count() == len(ROUTES)
        card = page.locator("#trend-charts .trend[data-route=package_purchase] h3")
        await expect(card).to_contain_text(f"{APPLIED} processed, 2 failed")
        # The endpoint the chart polls says the same (the page's session, as a viewer).
        answer = await (await page.request.get(f"{web.base}/overview/trends?window=1h")).json()
        (purchases,) = [r for r in answer["routes"] if r["short"] == "package_purchase"]
        assert (sum(purchases["processed"]), sum(purchases["dead_lettered"])) == (APPLIED, 2)
        # Pointing at the last bucket shows its values on the card: the chart's own last
        # bucket, read as it is pointed at (the traffic may straddle a minute, and the chart
        # redraws every 3 s, a new minute's bucket appearing at the right).
        over = page.locator("#trend-charts .trend[data-route=package_purchase] .u-over")
        box = await over.bounding_box()
        assert box is not None
        shown: list[str] = []

        async def last_bucket_shown() -> bool:
            await over.hover(position={"x": box["width"] - 2, "y": box["height"] / 2})
            last = await _charted(page, "package_purchase")
            # As the card shows a value: none is an en dash (uPlot's gap), a count as it is.
            values = [
                "\N{EN DASH}" if last[name][-1] is None else f"{last[name][-1]:g}"
                for name in ("processed", "failed", "dead-lettered")
            ]
            text = await card.inner_text()
            shown[:] = [text]
            return f"UTC: {values[0]} processed, {values[1]} failed, {values[2]} dead-lettered" in (
                text
            )

        await eventually(last_bucket_shown, within=20, every=0.5)
        assert "UTC: " in shown[0]
        await shoot(page, "overview-trends-hour")

        await page.click("#trends button[data-window='1d']")

        async def day_charted() -> bool:
            found = await _charted(page, "package_purchase")
            return found.get("window") == "1d" and _total(found, "processed") == APPLIED

        await eventually(day_charted, within=30, every=0.5)
        day = await _charted(page, "package_purchase")
        assert len(day["buckets"]) == 288
        assert day["buckets"][1] - day["buckets"][0] == 300
        await expect(page.locator("#trends button[data-window='1d']")).to_have_class("button on")
        await shoot(page, "overview-trends-day")

    # The relay snapshotted the minute it started in (what the counts before now are told from).
    snapshots = await fetch(pool, "SELECT DISTINCT route FROM telecom.route_minutes")
    assert {r["route"] for r in snapshots} == set(ROUTES)
    assert refused == []
