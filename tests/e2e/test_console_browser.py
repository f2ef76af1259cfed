"""The operator console in a real headless Chromium (Debian's), against real `pkgq run`,
`pkgq relay` and `pkgq web` processes: sign in, see and act on dead letters that real malformed
messages produced, cancel a user's active item; viewers and forged forms are refused.

Each test saves screenshots of the pages it visits to build/screenshots/ (git-ignored)."""

from __future__ import annotations

import json
from collections.abc import Callable
from uuid import uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection
from playwright.async_api import expect

from events.envelope import H_SCHEMA_VERSION, H_USER_ID
from events.models import PurchasePackage
from events.routes import PACKAGE_PURCHASE
from infra.postgres import dead_letters, holds
from infra.settings import Settings
from tests.e2e.console_support import (
    dead_letter_status,
    item_statuses,
    malformed_purchase,
)
from tests.support import keys
from tests.support.dead_letters import buried_id, consumer_dead_letter
from tests.support.deliveries import add_package, send
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess
from tests.web.client import OPERATOR_PASSWORD, VIEWER_PASSWORD
from tests.web.stack import browser, console, reload_until, shoot, sign_in

pytestmark = pytest.mark.e2e


async def test_an_operator_signs_in_watches_the_overview_refresh_and_sees_the_dead_letter(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    package = await add_package(pool, 1000)
    user = uuid4()
    async with console(settings, spawn) as web, browser() as chromium:
        page = await sign_in(chromium, web.base, "olga", OPERATOR_PASSWORD)
        assert (
            await page.inner_text("header .who") == "olga operator\nSign out\nSign out everywhere"
        )
        purchases = "#live tr[data-route='package_purchase']"
        assert await page.locator(f"{purchases} a.bad").count() == 0
        message_id = await malformed_purchase(settings, amqp, user, package)
        dead = await buried_id(pool, message_id)
        # The overview refreshes itself: the buried message and `pkgq run`'s consumer (from
        # the broker's management API) appear without a reload.
        await page.wait_for_selector(f"{purchases} a.bad:has-text('1')", timeout=30_000)
        # (A locator, not wait_for_function: the page's CSP forbids evaluating strings.)
        consumers = page.locator(f"{purchases} td[data-col=consumers]")
        await expect(consumers).not_to_have_text("0", timeout=30_000)
        await shoot(page, "overview")

        await page.click("nav >> text=Dead letters")
        row = page.locator(f"#letters tr:has(a[href='/dead-letters/{dead}'])")
        assert "schema_invalid" in await row.inner_text()
        await shoot(page, "dead-letters")

        await page.fill("input[name=user_id]", str(uuid4()))
        await page.click("form.filters button[type=submit]")
        assert await page.locator(f"#letters a[href='/dead-letters/{dead}']").count() == 0
        await page.fill("input[name=user_id]", str(user))
        await page.click("form.filters button[type=submit]")
        assert await page.locator(f"#letters a[href='/dead-letters/{dead}']").count() == 1

        await page.click(f"#letters a[href='/dead-letters/{dead}']")
        assert '"amount": "2"' in await page.inner_text("#body")
        assert message_id in await page.inner_text("dl.facts")
        assert "x-user-id" in await page.inner_text("main")
        await shoot(page, "dead-letter")

        await page.click("nav >> text=Holds")
        await shoot(page, "holds")
        await page.click("nav >> text=Workers")
        assert await page.locator(".pill.alive").count() >= 2  # the relay and `pkgq run`
        await shoot(page, "workers")


async def test_a_dead_letter_whose_cause_was_fixed_is_replayed_from_the_console_and_applied(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    existing = await add_package(pool, 1000, name="existing")
    missing = existing + 1  # not in the catalog yet: the purchase breaks a domain rule
    user = uuid4()
    async with console(settings, spawn) as web, browser() as chromium:
        await send(
            settings, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=missing)
        )

        async def buried() -> bool:
            async with pool.acquire() as conn:
                return bool(
                    await conn.fetchval(
                        "SELECT count(*) FROM telecom.dead_letters WHERE user_id = $1 "
                        "AND reason = 'domain_rule' AND status = 'buried'",
                        user,
                    )
                )

        await eventually(buried)
        assert await add_package(pool, 2000, name="added later") == missing  # the fix

        page = await sign_in(chromium, web.base, "olga", OPERATOR_PASSWORD)
        await page.goto(f"{web.base}/dead-letters?user_id={user}")
        await page.click("#letters tbody a[href^='/dead-letters/']")
        await page.click("text=Replay…")
        assert "Replay 1 dead letter?" in await page.inner_text("h1")
        await shoot(page, "replay-confirm")
        await page.click("button:has-text('Yes, replay 1')")
        assert "replayed 1 dead letter(s)" in await page.inner_text(".flash")
        # replayed, or superseded already if the running consumer applied it that fast
        assert {"replayed", "superseded"} & set((await page.inner_text("h1 .pill")).split())
        assert "web:olga" in await page.inner_text("dl.facts")  # who replayed it

        await page.goto(f"{web.base}/users/{user}")

        async def active() -> bool:
            return [s for _, s in await item_statuses(page)] == ["active"]

        await reload_until(page, active)
        assert "added later" in await page.inner_text("#items")
        await shoot(page, "user-after-replay")

        # Applied: its dead letter is superseded, and offers no replay any more.
        dead = await pool.fetchval("SELECT id FROM telecom.dead_letters WHERE user_id = $1", user)
        await page.goto(f"{web.base}/dead-letters/{dead}")
        assert await page.inner_text("h1 .pill") == "superseded"
        assert "never replayed" in await page.inner_text("dl.facts")
        assert await page.locator("text=Replay…").count() == 0
        await shoot(page, "dead-letter-superseded")


async def test_a_schema_invalid_message_is_edited_validated_replayed_and_queued_in_order(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    first = await add_package(pool, 1000, name="first")
    later = await add_package(pool, 1000, name="later")
    user = uuid4()
    async with console(settings, spawn) as web, browser() as chromium:
        await send(
            settings, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=first)
        )
        message_id = await malformed_purchase(settings, amqp, user, later)
        dead = await buried_id(pool, message_id)
        page = await sign_in(chromium, web.base, "olga", OPERATOR_PASSWORD)
        await page.goto(f"{web.base}/dead-letters/{dead}")
        await page.click("text=Edit and replay…")

        # Still invalid: refused with the model's reason, nothing replayed.
        body = {"user_id": str(user), "package_id": later, "amount": 0}
        await page.fill("textarea[name=body]", json.dumps(body))
        await page.click("button:has-text('Validate…')")
        assert "amount: Input should be greater than or equal to 1" in await page.inner_text(
            ".error"
        )
        await shoot(page, "edit-invalid")

        body["amount"] = 2
        await page.fill("textarea[name=body]", json.dumps(body))
        await page.click("button:has-text('Validate…')")
        assert '"amount": 2' in await page.inner_text("#edited")
        await shoot(page, "edit-confirm")
        await page.click("button:has-text('Yes, replay the edited message')")
        assert "original is kept for audit" in await page.inner_text(".flash")
        assert '"amount": "2"' in await page.inner_text("#body")  # the stored original

        await page.goto(f"{web.base}/users/{user}")

        async def queued_behind() -> bool:
            return [s for _, s in await item_statuses(page)] == ["active", "in_queue", "in_queue"]

        await reload_until(page, queued_behind)
        items = await page.inner_text("#items tbody")
        assert items.index("first") < items.index("later")
        assert "edit_replay" in await page.inner_text("main")
        await shoot(page, "user-after-edit")
    async with pool.acquire() as conn:
        audit = await conn.fetchrow(
            "SELECT actor, detail::text AS detail FROM telecom.operator_actions "
            "WHERE action = 'edit_replay' AND dead_letter_id = $1",
            dead,
        )
    assert audit is not None
    assert audit["actor"] == "web:olga"
    detail = json.loads(audit["detail"])
    assert json.loads(detail["original_body"])["amount"] == "2"
    assert detail["edited_body"]["amount"] == 2


async def test_cancelling_a_users_active_item_in_the_console_activates_the_next(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    package = await add_package(pool, 1000, name="monthly")
    user = uuid4()
    async with console(settings, spawn) as web, browser() as chromium:
        await send(
            settings,
            amqp,
            PACKAGE_PURCHASE,
            PurchasePackage(user_id=user, package_id=package, amount=2),
        )
        page = await sign_in(chromium, web.base, "olga", OPERATOR_PASSWORD)
        await page.click("nav >> text=Users")
        await page.fill("input[name=user_id]", str(user))
        async with page.expect_navigation():
            await page.click("button:has-text('Open')")

        async def one_active() -> bool:
            return [s for _, s in await item_statuses(page)] == ["active", "in_queue"]

        await reload_until(page, one_active)
        (first, _), (second, _) = await item_statuses(page)
        await shoot(page, "user")
        await page.click(f"tr[data-item='{first}'] >> text=Cancel…")
        assert f"Cancel item {first}?" in await page.inner_text("h1")
        await page.fill("input[name=reason]", "refund #42")
        await shoot(page, "cancel-confirm")
        await page.click(f"button:has-text('Yes, cancel item {first}')")
        assert f"cancel of item {first} sent" in await page.inner_text(".flash")

        async def next_active() -> bool:
            return await item_statuses(page) == [(first, "cancelled"), (second, "active")]

        await reload_until(page, next_active)
        assert "granted" in await page.inner_text("#access")
        await page.click("nav >> text=Audit")
        assert "refund #42" in await page.inner_text("main")
        await shoot(page, "audit")
    async with pool.acquire() as conn:
        audited = await conn.fetchrow(
            "SELECT operator, reason FROM telecom.item_audit WHERE item_id = $1", first
        )
    assert audited is not None
    assert (audited["operator"], audited["reason"]) == ("web:olga", "refund #42")


async def test_a_viewer_may_look_but_a_replay_is_refused_with_403(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    package = await add_package(pool, 1000)
    user = uuid4()
    async with console(settings, spawn) as web, browser() as chromium:
        dead = await buried_id(pool, await malformed_purchase(settings, amqp, user, package))
        page = await sign_in(chromium, web.base, "vic", VIEWER_PASSWORD)
        await page.goto(f"{web.base}/dead-letters/{dead}")
        assert await page.locator("text=Replay…").count() == 0  # no buttons for a viewer
        reply = await page.goto(f"{web.base}/dead-letters/confirm?action=replay&id={dead}")
        assert reply is not None
        assert reply.status == 403
        assert "only operators" in await page.inner_text(".error")
        await shoot(page, "viewer-refused")
        # Straight to the action, with the viewer's own valid CSRF token: still refused.
        await page.goto(f"{web.base}/dead-letters/{dead}")
        csrf = await page.get_attribute("input[name=csrf]", "value")
        posted = await page.request.post(
            f"{web.base}/dead-letters/act",
            form={"csrf": csrf or "", "action": "replay", "ids": str(dead)},
        )
        assert posted.status == 403
    assert await dead_letter_status(pool, dead) == "buried"


async def test_a_form_posted_without_its_csrf_token_is_refused_with_403(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    package = await add_package(pool, 1000)
    user = uuid4()
    async with console(settings, spawn) as web, browser() as chromium:
        dead = await buried_id(pool, await malformed_purchase(settings, amqp, user, package))
        page = await sign_in(chromium, web.base, "olga", OPERATOR_PASSWORD)
        await page.goto(f"{web.base}/dead-letters/confirm?action=discard&id={dead}")
        await shoot(page, "discard-confirm")
        # The confirmation form as the browser would send it, minus its CSRF token.
        await page.evaluate(
            "document.querySelector('form[action=\"/dead-letters/act\"] input[name=csrf]').remove()"
        )
        await page.click("button:has-text('Yes, discard 1')")
        assert "missing CSRF token" in await page.inner_text(".error")
        await shoot(page, "csrf-refused")
        forged = await page.request.post(
            f"{web.base}/dead-letters/act",
            form={"csrf": "forged", "action": "discard", "ids": str(dead)},
        )
        assert forged.status == 403
        no_token_login = await page.request.post(
            f"{web.base}/login", form={"user": "olga", "password": OPERATOR_PASSWORD}
        )
        assert no_token_login.status == 403
    assert await dead_letter_status(pool, dead) == "buried"


async def test_an_edited_replay_of_a_held_message_goes_first_and_its_parked_messages_follow(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    edited = await add_package(pool, 1000, name="edited")
    after = await add_package(pool, 1000, name="parked")
    later = await add_package(pool, 1000, name="sent while held")
    user = uuid4()
    blocker, parked = uuid4(), uuid4()
    headers = {H_SCHEMA_VERSION: 1, H_USER_ID: str(user)}
    # As the purchase consumer leaves a message that used up its retries: buried, holding its
    # user, with the user's next purchase parked behind it.
    async with pool.acquire() as conn:
        dead = await dead_letters.bury(
            conn,
            consumer_dead_letter(
                PACKAGE_PURCHASE.name,
                message_id=str(blocker),
                user_id=user,
                body=json.dumps(
                    {"user_id": str(user), "package_id": edited, "amount": "1"}
                ).encode(),
                headers=headers,
                error_type="ValidationError",
                error_message="amount: Input should be a valid integer",
                attempts=3,
            ),
        )
        await keys.hold(conn, "package_purchase", user, blocker, "buried", None, 3, "amount")
        await holds.park_many(
            conn,
            "package_purchase",
            [
                holds.NewParked(
                    user,
                    parked,
                    keys.blocker_key(parked, user),  # as the drain will know it
                    PACKAGE_PURCHASE.name,
                    PACKAGE_PURCHASE.message_type,
                    PurchasePackage(user_id=user, package_id=after).model_dump_json().encode(),
                    headers,
                )
            ],
        )
    async with console(settings, spawn) as web, browser() as chromium:
        # A purchase that arrives now is parked behind the buried one too.
        body_later = PurchasePackage(user_id=user, package_id=later)
        await send(settings, amqp, PACKAGE_PURCHASE, body_later)
        page = await sign_in(chromium, web.base, "olga", OPERATOR_PASSWORD)
        await page.goto(f"{web.base}/holds")

        async def both_parked() -> bool:
            return await page.locator(f"#parked tr[data-user='{user}']").count() == 2

        await reload_until(page, both_parked)
        assert "buried" in await page.inner_text(f"#holds tr[data-user='{user}']")
        await shoot(page, "holds")

        await page.goto(f"{web.base}/dead-letters/{dead}/edit")
        body = {"user_id": str(user), "package_id": edited, "amount": 1}
        await page.fill("textarea[name=body]", json.dumps(body))
        await page.click("button:has-text('Validate…')")
        await page.click("button:has-text('Yes, replay the edited message')")
        assert {"replayed", "superseded"} & set((await page.inner_text("h1 .pill")).split())

        await page.goto(f"{web.base}/users/{user}")

        async def in_order() -> bool:
            return [s for _, s in await item_statuses(page)] == ["active", "in_queue", "in_queue"]

        await reload_until(page, in_order)
        names = await page.locator("#items tbody tr[data-item] td:nth-child(2)").all_inner_texts()
        assert names == ["edited", "parked", "sent while held"]  # in the user's order
        await shoot(page, "user-after-held-replay")
        await page.goto(f"{web.base}/holds")
        assert await page.locator(f"tr[data-user='{user}']").count() == 0
