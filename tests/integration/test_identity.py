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
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import hypothesis
import pytest
from aio_pika.abc import AbstractRobustConnection
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from consumers import operations
from consumers.delivery import DeliveryPipeline
from consumers.handlers import usage_record
from consumers.retry_policy import RetryPolicy
from consumers.runner import handler_for
from consumers.unit_of_work import HandlerContext
from domain.delivery import Fate
from events.decoding import RawDelivery
from events.envelope import (
    CONTENT_TYPE,
    H_CLAIMED,
    H_EXPIRES_AT,
    H_SCHEMA_VERSION,
    H_USER_ID,
)
from events.identity import message_key
from events.models import CancelPackage, RecordUsage
from events.routes import PACKAGE_CANCEL, USAGE_RECORD
from infra.postgres import dead_letters, invariants, replay
from infra.postgres.pool import Conn
from infra.settings import Settings
from tests.support import keys
from tests.support.broker_users import Publisher, publisher_connection
from tests.support.in_process import StartApp
from tests.support.observing import eventually, fetch
from tests.support.processes import cli
from tests.support.queue_items import queue_of

RETRY_AFTER_S = 4.0
"""How long the victim's failed cancel waits for its retry: long enough for the outsider to
act meanwhile."""


@dataclass
class Publishers:
    shop: Publisher
    """The honest publisher of the victim's commands."""
    mallory: Publisher
    """The outsider: the same role's permissions, nothing more."""


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


def cancel(user: UUID, item_id: int) -> bytes:
    return CancelPackage(user_id=user, item_id=item_id).model_dump_json().encode()


def cancels_failing_once(
    settings: Settings, pool: asyncpg.Pool, once: set[UUID]
) -> DeliveryPipeline:
    """The cancel route, whose handler fails the first attempt of each message in `once`."""
    real = handler_for(settings, PACKAGE_CANCEL)

    async def handler(ctx: HandlerContext, body: Any) -> None:
        if ctx.envelope.message_id in once:
            once.discard(ctx.envelope.message_id)
            raise RuntimeError("the refund service timed out (injected)")
        await real(ctx, body)

    return DeliveryPipeline(
        pool,
        PACKAGE_CANCEL,
        handler,
        RetryPolicy(max_attempts=5, backoff=lambda _: RETRY_AFTER_S),
        max_body_bytes=settings.max_body_bytes,
        trusted_publisher=settings.amqp_user,
    )


async def statuses(pool: asyncpg.Pool, items: list[int]) -> list[str]:
    rows = await fetch(
        pool,
        "SELECT status::text AS status FROM telecom.package_queue WHERE id = ANY($1::bigint[]) "
        "ORDER BY array_position($1::bigint[], id)",
        items,
    )
    return [r["status"] for r in rows]


async def applied_in_order(pool: asyncpg.Pool, victim: UUID) -> list[tuple[UUID, UUID]]:
    """The victim's cancels the consumer applied, as (message_id, key), in the order applied."""
    rows = await fetch(
        pool,
        "SELECT sent_as, message_id AS key FROM telecom.inbox "
        "WHERE consumer = 'package_cancel' AND user_id = $1 ORDER BY processed_at, message_id",
        victim,
    )
    return [(r["sent_as"], r["key"]) for r in rows]


async def hold_of(pool: asyncpg.Pool, consumer: str, user: UUID) -> dict[str, Any] | None:
    rows = await fetch(
        pool,
        "SELECT blocker, blocker_key, state, attempts FROM telecom.holds "
        "WHERE consumer = $1 AND user_id = $2",
        consumer,
        user,
    )
    return rows[0] if rows else None


async def broken(pool: asyncpg.Pool) -> dict[str, int]:
    async with pool.acquire() as conn:
        results = await invariants.run_all(conn)
    return {r.check: r.violations for r in results if not r.ok}


@dataclass
class Scene:
    """The victim's cancel M (from the shop) failed once and waits for its retry; the victim's
    later cancel L is parked behind it."""

    settings: Settings
    pool: asyncpg.Pool
    publishers: Publishers
    victim: UUID
    items: list[int]
    m: UUID
    later: UUID

    def key(self, message_id: UUID) -> UUID:
        """The key of the shop's message `message_id` for the victim."""
        return message_key(message_id, self.publishers.shop.name, self.victim)

    async def m_still_waits(self) -> None:
        """M still holds the victim, with its own retry on its way."""
        hold = await hold_of(self.pool, PACKAGE_CANCEL.short_name, self.victim)
        assert hold is not None
        assert (hold["blocker"], hold["state"]) == (self.m, "retrying")
        retry = f"retry:{PACKAGE_CANCEL.short_name}:{self.key(self.m)}"
        assert await fetch(self.pool, "SELECT 1 FROM telecom.outbox WHERE cancel_key = $1", retry)

    async def applied(self, *, in_order: bool = True) -> None:
        """M and L are applied, each once (M first unless told otherwise), nothing is left held
        and every doctor check holds."""

        async def both() -> bool:
            return await statuses(self.pool, self.items[2:]) == ["cancelled", "cancelled"]

        await eventually(both, within=30)
        keys = [key for _, key in await applied_in_order(self.pool, self.victim)]
        assert keys.count(self.key(self.m)) == 1
        assert keys.count(self.key(self.later)) == 1
        if in_order:
            assert keys.index(self.key(self.m)) < keys.index(self.key(self.later))

        async def settled() -> bool:
            return await hold_of(self.pool, PACKAGE_CANCEL.short_name, self.victim) is None

        await eventually(settled)
        assert await broken(self.pool) == {}


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


async def pending_retry(conn: Conn, m: UUID, user: UUID, publisher: str) -> None:
    """A retry of `publisher`'s message `m` for `user`, pending in the outbox."""
    await conn.execute(
        "INSERT INTO telecom.outbox (message_id, route, message_type, schema_version,"
        " user_id, body, headers, cancel_key) VALUES ($1, $2, $3, 1, $4, '{}', $5::jsonb, $6)",
        m,
        USAGE_RECORD.name,
        USAGE_RECORD.message_type,
        user,
        {"x-pkgq-publisher": publisher},
        f"retry:{USAGE_RECORD.short_name}:{message_key(m, publisher, user)}",
    )


async def test_doctor_reports_a_hold_retried_past_every_bound_and_one_only_another_copy_would_free(
    pool: asyncpg.Pool,
) -> None:
    looping, fooled, other = uuid4(), uuid4(), uuid4()
    m = uuid4()
    consumer = USAGE_RECORD.short_name
    async with pool.acquire() as conn:
        # Retried 10,000 times and still retrying: past any bound pkgq sets.
        await keys.hold(conn, consumer, looping, m, "retrying", "billing", attempts=10_000)
        await pending_retry(conn, m, looping, "billing")
        # Waits on M from billing; the only retry of M pending is another user's copy.
        await keys.hold(conn, consumer, fooled, m, "retrying", "billing", attempts=1)
        await pending_retry(conn, m, other, "mallory")
        results = {
            r.check: r
            for r in await invariants.run_all(conn, graces=invariants.Graces(attempts_bound=25))
        }
    past = results["hold_past_its_bound"]
    assert past.violations == 1
    assert past.sample[0]["user_id"] == str(looping)
    # Both pending retries of M are other messages than the one the hold waits on: another
    # user's (looping's, billing's) and another user's from another publisher (mallory's).
    another = results["hold_waits_on_another_copy"]
    assert another.violations == 2
    assert {r["user_id"] for r in another.sample} == {str(fooled)}
    assert {(r["retry_user_id"], r["retry_publisher"]) for r in another.sample} == {
        (str(looping), "billing"),
        (str(other), "mallory"),
    }
    # ... which is, in the first place, a hold without a way out of its own.
    assert [r["user_id"] for r in results["hold_without_way_out"].sample] == [str(fooled)]


@hypothesis.settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    message_id=st.uuids(),
    publisher=st.one_of(st.none(), st.text(max_size=40).filter(lambda t: "\x00" not in t)),
    user=st.one_of(st.none(), st.uuids()),
)
async def test_postgres_and_pkgq_work_out_the_same_key_for_any_identity(
    pool: asyncpg.Pool, message_id: UUID, publisher: str | None, user: UUID | None
) -> None:
    """The migration keyed the rows before it in SQL, pkgq keys every message in Python: the
    two must agree, or a hold made before the upgrade would never be released after it."""
    async with pool.acquire() as conn:
        in_sql = await conn.fetchval(
            "SELECT telecom.message_key($1, $2, $3)", message_id, publisher, user
        )
    assert in_sql == message_key(message_id, publisher, user)


def flaky_usage(pool: asyncpg.Pool, failing: set[UUID]) -> DeliveryPipeline:
    """The usage route whose handler refuses the messages in `failing` as a data error Postgres
    would refuse every time (buried at once, holding its user)."""

    async def handler(ctx: HandlerContext, body: RecordUsage) -> None:
        if ctx.envelope.message_id in failing:
            raise asyncpg.exceptions.NumericValueOutOfRangeError("bigint out of range")
        await usage_record.handle(ctx, body)

    return DeliveryPipeline(
        pool, USAGE_RECORD, handler, RetryPolicy(max_attempts=3), max_body_bytes=2**20
    )


def usage_delivery(user: UUID, message_id: UUID, upload: int) -> RawDelivery:
    return RawDelivery(
        body=RecordUsage(user_id=user, upload=upload, download=0).model_dump_json().encode(),
        message_id=str(message_id),
        message_type=USAGE_RECORD.message_type,
        content_type=CONTENT_TYPE,
        timestamp=None,
        headers={H_SCHEMA_VERSION: USAGE_RECORD.schema_version},
        publisher="billing",
    )


async def unbilled(pool: asyncpg.Pool, user: UUID) -> int:
    rows = await fetch(
        pool, "SELECT unbilled_upload FROM telecom.queue_users WHERE user_id = $1", user
    )
    return int(rows[0]["unbilled_upload"]) if rows else 0


async def test_an_operators_discard_stands_after_the_inbox_forgot_and_the_message_comes_again(
    pool: asyncpg.Pool,
) -> None:
    user, m = uuid4(), uuid4()
    failing = {m}
    pipe = flaky_usage(pool, failing)
    assert [r.fate for r in await pipe.process_batch([usage_delivery(user, m, 5)])] == [
        Fate.DEAD_LETTERED
    ]
    (letter,) = await fetch(
        pool, "SELECT id FROM telecom.dead_letters WHERE message_id = $1", str(m)
    )
    async with pool.acquire() as conn, conn.transaction():
        assert await dead_letters.discard(conn, [letter["id"]], "olga") == 1
    await fetch(pool, "DELETE FROM telecom.inbox RETURNING 1")  # retention, long after
    failing.clear()  # it would apply now: the discard must keep it from doing so
    assert [r.fate for r in await pipe.process_batch([usage_delivery(user, m, 5)])] == [
        Fate.DUPLICATE
    ]
    assert await unbilled(pool, user) == 0
    (still,) = await fetch(pool, "SELECT status::text AS s FROM telecom.dead_letters")
    assert still["s"] == "discarded"


async def test_a_message_applied_after_its_burial_is_never_applied_again_after_the_inbox_forgot(
    pool: asyncpg.Pool,
) -> None:
    user, m = uuid4(), uuid4()
    failing = {m}
    pipe = flaky_usage(pool, failing)
    await pipe.process_batch([usage_delivery(user, m, 5)])  # buried
    failing.clear()
    async with pool.acquire() as conn, conn.transaction():  # released, then sent again: applied
        (filed,) = await conn.fetch("SELECT id FROM telecom.dead_letters")
        await replay.replay(conn, [filed["id"]], "olga", pkgq_user="pkgq")
    (row,) = await fetch(pool, "SELECT headers FROM telecom.outbox WHERE message_id = $1", m)
    again = usage_delivery(user, m, 5)
    resent = RawDelivery(
        again.body, again.message_id, again.message_type, again.content_type, None,
        {**dead_letters.as_dict(row["headers"])}, publisher="pkgq",
    )  # fmt: skip
    assert [r.fate for r in await pipe.process_batch([resent])] == [Fate.ACKED]
    assert await unbilled(pool, user) == 5
    (status,) = await fetch(pool, "SELECT status::text AS s FROM telecom.dead_letters")
    assert status["s"] == "superseded"
    await fetch(pool, "DELETE FROM telecom.inbox RETURNING 1")  # retention, long after
    assert [r.fate for r in await pipe.process_batch([usage_delivery(user, m, 5)])] == [
        Fate.DUPLICATE
    ]
    assert await unbilled(pool, user) == 5  # once


async def test_an_outsiders_parked_copy_that_no_longer_decodes_takes_no_one_elses_parked_message(
    pool: asyncpg.Pool,
) -> None:
    """The honest M2 waits parked behind its user's buried blocker; an outsider's copy of M2's
    id waits behind another user's. The copy's row stops decoding (as after an upgrade that
    reads it otherwise): drained, it is buried, and only its own row leaves the lot."""
    honest_user, other_user = uuid4(), uuid4()
    x, y, m2 = uuid4(), uuid4(), uuid4()
    failing = {x, y}
    pipe = flaky_usage(pool, failing)
    await pipe.process_batch([usage_delivery(honest_user, x, 1), usage_delivery(other_user, y, 1)])
    copy = usage_delivery(other_user, m2, 4)
    copy = RawDelivery(
        copy.body, copy.message_id, copy.message_type, copy.content_type, None, copy.headers,
        publisher="mallory",
    )  # fmt: skip
    fates = await pipe.process_batch([usage_delivery(honest_user, m2, 2), copy])
    assert [r.fate for r in fates] == [Fate.PARKED, Fate.PARKED]
    await fetch(
        pool, "UPDATE telecom.parked SET body = 'no longer json' WHERE user_id = $1 RETURNING 1",
        other_user,
    )  # fmt: skip
    failing.clear()
    (y_letter,) = await fetch(
        pool, "SELECT id FROM telecom.dead_letters WHERE message_id = $1", str(y)
    )
    async with pool.acquire() as conn, conn.transaction():
        await dead_letters.discard(conn, [y_letter["id"]], "olga")  # the other user goes on
    pipe._polled_at = -1e9
    await pipe.drain_parked()
    still = await fetch(pool, "SELECT user_id, sent_as FROM telecom.parked")
    assert [(r["user_id"], r["sent_as"]) for r in still] == [(honest_user, m2)]
    (x_letter,) = await fetch(
        pool, "SELECT id FROM telecom.dead_letters WHERE message_id = $1", str(x)
    )
    async with pool.acquire() as conn, conn.transaction():
        await dead_letters.discard(conn, [x_letter["id"]], "olga")
    pipe._polled_at = -1e9
    await pipe.drain_parked()
    assert await unbilled(pool, honest_user) == 2  # M2, applied once
    assert not await fetch(pool, "SELECT 1 FROM telecom.parked")
