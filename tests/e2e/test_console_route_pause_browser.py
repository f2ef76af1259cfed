"""An operator pauses a route from the console (real Chromium, real `pkgq run`, `pkgq relay`
and `pkgq web`): the route's consumers leave the broker, its messages pile up there in order,
and resuming drains them in that order; both are on the audit page."""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection
from playwright.async_api import Page

from events.models import PurchasePackage
from events.routes import PACKAGE_PURCHASE
from infra.rabbit.management import passive_figures
from infra.rabbit.topology import route_queues
from infra.settings import Settings
from tests.support.deliveries import add_package, send
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess
from tests.web.client import OPERATOR_PASSWORD
from tests.web.stack import browser, console, shoot, sign_in

pytestmark = pytest.mark.e2e
ROW = "#live tr[data-route='package_purchase']"


async def _queue(settings: Settings, amqp: AbstractRobustConnection) -> tuple[int, int]:
    """(ready messages, consumers) of the purchase route's queue."""
    name = route_queues(settings, PACKAGE_PURCHASE.name)[0][0]
    figures = (await passive_figures(amqp, [name]))[name]
    assert figures is not None
    return figures


async def _packages_of(pool: asyncpg.Pool, user: UUID) -> list[int]:
    """The user's items' packages, in queue order."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT package_id FROM telecom.package_queue WHERE user_id = $1 "
            "ORDER BY created_at, id",
            user,
        )
    return [r["package_id"] for r in rows]


async def _confirm(page: Page, action: str, reason: str) -> None:
    await page.click(f"{ROW} a[data-action={action}]")
    assert f"{action.capitalize()} the consumption of package_purchase?" in await page.inner_text(
        "h1"
    )
    await page.fill("input[name=reason]", reason)
    await shoot(page, f"route-{action}-confirm")
    await page.click(f"button[data-confirm={action}]")
    await page.wait_for_selector(".flash")


async def test_a_route_paused_in_the_console_keeps_its_messages_on_the_broker_and_resumed_drains_them_in_order(  # noqa: E501
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    packages = [await add_package(pool, 1000, name=f"p{k}") for k in range(6)]
    user = uuid4()
    async with console(settings, spawn) as web, browser() as chromium:

        async def consumed() -> bool:
            return (await _queue(settings, amqp))[1] == 1

        await eventually(consumed, within=60)
        page = await sign_in(chromium, web.base, "olga", OPERATOR_PASSWORD)
        await _confirm(page, "pause", "catalog migration")
        assert "package_purchase paused" in await page.inner_text(".flash")
        assert "paused" in await page.inner_text(f"{ROW} td[data-col=state]")
        assert "catalog migration" in await page.inner_text("#paused-routes")

        async def unsubscribed() -> bool:
            return (await _queue(settings, amqp))[1] == 0

        await eventually(unsubscribed)  # `pkgq run` obeyed the row in Postgres
        for package in packages:
            await send(
                settings, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package)
            )
        assert await _queue(settings, amqp) == (len(packages), 0)  # piled up on the broker
        assert await _packages_of(pool, user) == []
        await shoot(page, "route-paused-overview")

        await _confirm(page, "resume", "migration done")
        assert "package_purchase resumed" in await page.inner_text(".flash")

        async def drained() -> bool:
            return len(await _packages_of(pool, user)) == len(packages)

        await eventually(drained, within=30)
        assert await _packages_of(pool, user) == packages  # in the order they were sent
        assert (await _queue(settings, amqp))[0] == 0

        await page.click("nav >> text=Audit")
        audit = await page.inner_text("main")
        assert "pause_route" in audit
        assert "resume_route" in audit
        await shoot(page, "route-pause-audit")
