"""A message is its own: what an outsider publishes (a second broker user with the publisher
role's permissions only, never guest) under a victim's message_id, or with pkgq's own headers,
or with a version from the future, changes nothing of the victim's messages, and every hold it
causes has a bounded way out. Through the real broker, with the honest publisher (the shop, a
broker user of its own) and the outsider each on a connection as themselves.

Each case failed on the code before messages had an identity of their own:
- a usage record naming the victim with the next schema version was retried every 30 s for
  ever, uncounted, and `pkgq dlq release-hold` refused to release the victim;
- a copy of the victim's failed cancel M with `x-pkgq-expires-at` in the past expired, lifted
  the victim's hold and withdrew M's retry: M was lost and the later cancel applied first;
- a garbage copy of M with `x-user-id` naming the victim was filed under the victim, and its
  discard withdrew M's retry and released the hold: M was lost.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from consumers import operations
from events.envelope import H_CLAIMED, H_EXPIRES_AT, H_USER_ID
from events.identity import message_key
from events.models import RecordUsage
from events.routes import PACKAGE_CANCEL, USAGE_RECORD
from infra.postgres import dead_letters
from infra.settings import Settings
from tests.integration.identity_helpers import (
    Publishers,
    Scene,
    applied_in_order,
    broken,
    cancel,
    cancels_failing_once,
    hold_of,
    statuses,
)
from tests.support.broker_users import publisher_connection
from tests.support.in_process import StartApp
from tests.support.observing import eventually, fetch
from tests.support.processes import cli
from tests.support.queue_items import queue_of


@pytest.fixture
async def publishers(
    settings: Settings,
    amqp: AbstractRobustConnection,  # declares the test's exchanges
) -> AsyncIterator[Publishers]:
    async with (
        publisher_connection(settings, "shop") as shop,
        publisher_connection(settings, "mallory") as mallory,
    ):
        yield Publishers(shop, mallory)


@pytest.fixture
async def scene(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    in_process: StartApp,
    publishers: Publishers,
) -> Scene:
    victim, m, later = uuid4(), uuid4(), uuid4()
    items = await queue_of(pool, victim, 4)  # consumed, active, queued, queued
    tuned = settings.model_copy(update={"release_poll_interval": 0.2})
    app = in_process(tuned, pool, amqp)
    pipelines = {PACKAGE_CANCEL.name: cancels_failing_once(tuned, pool, {m})}
    await app.start_consumers([PACKAGE_CANCEL], pipelines=pipelines, ingest=True)
    await app.start_relay()
    await publishers.shop.publish(settings, PACKAGE_CANCEL, cancel(victim, items[2]), m)

    async def retrying() -> bool:
        hold = await hold_of(pool, PACKAGE_CANCEL.short_name, victim)
        return hold is not None and hold["state"] == "retrying"

    await eventually(retrying)
    await publishers.shop.publish(settings, PACKAGE_CANCEL, cancel(victim, items[3]), later)

    async def parked() -> bool:
        return bool(await fetch(pool, "SELECT 1 FROM telecom.parked WHERE sent_as = $1", later))

    await eventually(parked)
    return Scene(settings, pool, publishers, victim, items, m, later)


async def test_an_outsiders_copy_of_a_failed_cancel_with_pkgqs_expiry_header_withdraws_nothing(
    scene: Scene,
) -> None:
    pool, mallory = scene.pool, scene.publishers.mallory
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    body = cancel(scene.victim, scene.items[2])
    await mallory.publish(
        scene.settings, PACKAGE_CANCEL, body, scene.m, headers={H_EXPIRES_AT: past}
    )
    copy = message_key(scene.m, mallory.name, scene.victim)

    async def copy_parked() -> bool:
        rows = await fetch(pool, "SELECT headers FROM telecom.parked WHERE message_id = $1", copy)
        return bool(rows)

    # The copy is another message of the victim's: parked behind M, its expiry kept as a claim.
    await eventually(copy_parked)
    (row,) = await fetch(pool, "SELECT headers FROM telecom.parked WHERE message_id = $1", copy)
    headers = dead_letters.as_dict(row["headers"])
    assert H_EXPIRES_AT not in headers
    assert headers[H_CLAIMED][H_EXPIRES_AT] == past
    await scene.m_still_waits()
    assert not await fetch(pool, "SELECT 1 FROM telecom.dead_letters WHERE reason = 'expired'")
    await scene.applied()


async def test_discarding_an_outsiders_garbage_under_a_failed_messages_id_withdraws_nothing(
    scene: Scene,
) -> None:
    pool, mallory, victim = scene.pool, scene.publishers.mallory, scene.victim
    await mallory.publish(
        scene.settings,
        PACKAGE_CANCEL,
        b"not json at all",
        scene.m,
        headers={H_USER_ID: str(victim)},
        content_type="text/plain",
    )
    garbage_sql = (
        "SELECT id, user_id, publisher, headers FROM telecom.dead_letters "
        "WHERE reason = 'wrong_content_type'"
    )

    async def garbage_filed() -> bool:
        return bool(await fetch(pool, garbage_sql))

    await eventually(garbage_filed)
    (garbage,) = await fetch(pool, garbage_sql)
    # Filed under no user: the header is a claim, kept as it came.
    assert garbage["user_id"] is None
    assert garbage["publisher"] == mallory.name
    assert dead_letters.as_dict(garbage["headers"])[H_USER_ID] == str(victim)
    shown = await cli(scene.settings, "dlq", "show", str(garbage["id"]), "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["user_id"] is None
    assert json.loads(shown.stdout)["claimed_user_id"] == str(victim)  # shown as a claim
    async with pool.acquire() as conn, conn.transaction():
        assert await dead_letters.discard(conn, [garbage["id"]], "olga") == 1
    await scene.m_still_waits()  # the operator's routine clean-up left M alone
    await scene.applied()
    (still,) = await fetch(pool, "SELECT status::text AS s FROM telecom.dead_letters")
    assert still["s"] == "discarded"  # the operator's decision stands


async def test_an_outsiders_copy_applied_first_never_makes_the_shops_message_a_duplicate(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    in_process: StartApp,
    publishers: Publishers,
) -> None:
    """The outsider learns the message_id of the shop's cancel before it is sent and sends its
    own command under it first: the shop's is still applied (a message is its own)."""
    victim, m = uuid4(), uuid4()
    items = await queue_of(pool, victim, 4)
    app = in_process(settings, pool, amqp)
    await app.start_consumers([PACKAGE_CANCEL])
    await publishers.mallory.publish(settings, PACKAGE_CANCEL, cancel(victim, items[3]), m)

    async def first() -> bool:
        return await statuses(pool, items[3:]) == ["cancelled"]

    await eventually(first)
    await publishers.shop.publish(settings, PACKAGE_CANCEL, cancel(victim, items[2]), m)

    async def second() -> bool:
        return await statuses(pool, items[2:3]) == ["cancelled"]

    await eventually(second)
    keys = {key for _, key in await applied_in_order(pool, victim)}
    assert keys == {
        message_key(m, publishers.mallory.name, victim),
        message_key(m, publishers.shop.name, victim),
    }
    # The shop's resend of it is a duplicate of its own, and changes nothing more.
    await publishers.shop.publish(settings, PACKAGE_CANCEL, cancel(victim, items[2]), m)
    assert len(await applied_in_order(pool, victim)) == 2


async def test_a_newer_version_from_an_outsider_holds_the_victim_for_a_bounded_time_only(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    in_process: StartApp,
    publishers: Publishers,
) -> None:
    victim, future, honest = uuid4(), uuid4(), uuid4()
    tuned = settings.model_copy(
        update={
            "newer_version_retry": 0.3,
            "newer_version_deferrals": 3,
            "release_poll_interval": 0.2,
        }
    )
    app = in_process(tuned, pool, amqp)
    await app.start_consumers([USAGE_RECORD])
    await app.start_relay()
    usage = RecordUsage(user_id=victim, upload=5, download=0).model_dump_json().encode()
    await publishers.mallory.publish(
        settings, USAGE_RECORD, usage, future, version=USAGE_RECORD.schema_version + 1
    )

    async def held() -> bool:
        return await hold_of(pool, USAGE_RECORD.short_name, victim) is not None

    await eventually(held)
    await publishers.shop.publish(settings, USAGE_RECORD, usage, honest)

    async def buried() -> bool:
        rows = await fetch(
            pool,
            "SELECT 1 FROM telecom.dead_letters WHERE message_id = $1 "
            "AND reason = 'unknown_version' AND status = 'buried'",
            str(future),
        )
        return bool(rows)

    # Deferred three times (counted in Postgres), then buried holding the victim: replayable
    # once a pkgq that knows the version runs.
    await eventually(buried, within=30)
    hold = await hold_of(pool, USAGE_RECORD.short_name, victim)
    assert hold is not None
    assert (hold["blocker"], hold["state"], hold["attempts"]) == (future, "buried", 4)
    assert not await fetch(pool, "SELECT 1 FROM telecom.inbox WHERE sent_as = $1", honest)
    assert await broken(pool) == {}

    # An operator may always let the victim's honest records go, warned of what is pending.
    async with pool.acquire() as conn, conn.transaction():
        found = await operations.release_hold(conn, USAGE_RECORD.short_name, victim, "olga")
    assert found.buried
    assert found.release_warning is not None
    assert "lies buried" in found.release_warning

    async def applied() -> bool:
        return bool(await fetch(pool, "SELECT 1 FROM telecom.inbox WHERE sent_as = $1", honest))

    await eventually(applied)


async def test_an_operator_releases_a_hold_whose_retry_is_pending_with_a_warning_not_a_refusal(
    scene: Scene,
) -> None:
    async with scene.pool.acquire() as conn, conn.transaction():
        found = await operations.release_hold(conn, PACKAGE_CANCEL.short_name, scene.victim, "olga")
    assert found.pending_retry
    assert found.release_warning is not None
    assert "out of order" in found.release_warning
    # Released: L goes at once; M's retry still comes and is applied (after it): nothing lost.
    await scene.applied(in_order=False)
