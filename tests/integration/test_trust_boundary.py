"""The trust boundary, on the real broker: outsiders publish commands, only pkgq publishes its
lifecycle events. The broker refuses a publisher's forged lifecycle event, pkgq buries one that
a loosely provisioned broker let through, and telecom.access stays as pkgq left it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from functools import partial
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
import structlog.testing
from aio_pika.abc import AbstractRobustConnection
from aiormq.exceptions import ChannelAccessRefused, ChannelPreconditionFailed

from consumers.delivery import DeliveryPipeline
from consumers.registry import HANDLERS
from consumers.retry_policy import RetryPolicy
from events.envelope import (
    H_ADDRESS,
    H_GROUP,
    H_SCHEMA_VERSION,
    H_USER_ID,
)
from events.models import (
    AllPackageExpiredEvent,
    PackageActivateEvent,
    PurchasePackage,
    RecordUsage,
)
from events.routes import (
    ALL_EXPIRED,
    PACKAGE_ACTIVATE,
    PACKAGE_PURCHASE,
    UNTRUSTED_PUBLISHER,
    USAGE_RECORD,
    Route,
)
from infra.jobs import Jobs
from infra.postgres import access, addresses, groups, replay
from infra.rabbit.connection import connect
from infra.rabbit.tap import Tap
from infra.settings import Settings
from tests.support.broker_users import (
    broker_user,
    grant,
    set_permissions,
    unique_role_users,
    url_for,
)
from tests.support.deliveries import add_package, publish_as_outsider, raw_for, send
from tests.support.in_process import InProcess
from tests.support.observing import eventually

FROZEN_SEQ = 2**62
"""The x-seq of the forgery docs/explanation/trust.md describes: taken on trust, it would make
every later genuine event look older and freeze the user's access row."""
publish_as = partial(publish_as_outsider, seq=FROZEN_SEQ)
"""Every forgery here carries the frozen x-seq unless it says otherwise."""


@dataclass
class World:
    settings: Settings
    pool: asyncpg.Pool
    amqp: AbstractRobustConnection
    tap: Tap
    package: int

    async def access_row(self, user: UUID) -> dict[str, Any] | None:
        async with self.pool.acquire() as conn:
            row = await access.get_access(conn, user)
        return None if row is None else dict(row)

    async def granted(self, user: UUID) -> bool:
        row = await self.access_row(user)
        return row is not None and bool(row["granted"])

    async def used_up(self, user: UUID) -> None:
        """The user buys one package and uses all of it: the item is consumed, access ends."""
        await send(self.settings, self.amqp, PACKAGE_PURCHASE, purchase(user, self.package))
        await eventually(lambda: self.granted(user))
        await send(
            self.settings,
            self.amqp,
            USAGE_RECORD,
            RecordUsage(user_id=user, upload=1000, download=0),
        )

        async def revoked() -> bool:
            row = await self.access_row(user)
            return row is not None and not row["granted"]

        await eventually(revoked)

    async def untrusted(self, route: Route) -> list[asyncpg.Record]:
        async with self.pool.acquire() as conn:
            return list(
                await conn.fetch(
                    "SELECT message_id, user_id FROM telecom.dead_letters "
                    "WHERE route = $1 AND reason = 'untrusted_publisher'",
                    route.name,
                )
            )


def purchase(user: UUID, package: int) -> PurchasePackage:
    return PurchasePackage(user_id=user, package_id=package)


def forged_activation(user: UUID) -> PackageActivateEvent:
    return PackageActivateEvent(user_id=user, item_id=1, package_id=1, activated_at=0)


def forged_all_expired(user: UUID) -> AllPackageExpiredEvent:
    return AllPackageExpiredEvent(user_id=user, expired_at=0)


@pytest.fixture
async def w(
    running_app: InProcess,
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    tap: Tap,
) -> World:
    """The test's services, with every consumer and the relay running (`running_app`)."""
    return World(settings, pool, amqp, tap, await add_package(pool, 1000))


@pytest.fixture
async def publisher(settings: Settings) -> AsyncIterator[AbstractRobustConnection]:
    """A connection as a second broker user with the definitions' publisher role only."""
    users = unique_role_users()
    async with broker_user(users.publisher) as password:
        await grant(settings, users, users.publisher)
        connection = await connect(
            url_for(settings, users.publisher, password), "pkgq-test-publisher"
        )
        yield connection
        await connection.close()


@pytest.fixture
async def loose_publisher(
    settings: Settings,
) -> AsyncIterator[tuple[str, AbstractRobustConnection]]:
    """A second broker user that may publish anything on the exchange: a broker provisioned
    without the topic permissions, where only pkgq's own check stands."""
    name = f"pkgq-t-{uuid4().hex[:10]}-loose"
    async with broker_user(name) as password:
        await set_permissions(name, "^$", ".*", "^$")
        connection = await connect(url_for(settings, name, password), "pkgq-test-loose")
        yield name, connection
        await connection.close()


async def test_the_broker_refuses_a_publishers_forged_lifecycle_events_and_access_is_unchanged(
    w: World, publisher: AbstractRobustConnection
) -> None:
    consumed, active = uuid4(), uuid4()
    await w.used_up(consumed)
    await send(w.settings, w.amqp, PACKAGE_PURCHASE, purchase(active, w.package))
    await eventually(lambda: w.granted(active))
    before = {user: await w.access_row(user) for user in (consumed, active)}

    with pytest.raises(ChannelAccessRefused):
        await publish_as(publisher, w.settings, PACKAGE_ACTIVATE, forged_activation(consumed))
    with pytest.raises(ChannelAccessRefused):
        await publish_as(publisher, w.settings, ALL_EXPIRED, forged_all_expired(active))

    # The publisher's own commands still go through, and a genuine later event applies: the
    # consumed user's new purchase grants access again (a frozen row would have ignored it).
    await publish_as(publisher, w.settings, PACKAGE_PURCHASE, purchase(consumed, w.package))
    await eventually(lambda: w.granted(consumed))
    assert await w.access_row(active) == before[active]
    assert await w.untrusted(PACKAGE_ACTIVATE) == []


async def test_pkgq_buries_lifecycle_events_another_broker_user_published_as_untrusted(
    w: World, loose_publisher: tuple[str, AbstractRobustConnection]
) -> None:
    name, connection = loose_publisher
    consumed, active = uuid4(), uuid4()
    await w.used_up(consumed)
    await send(w.settings, w.amqp, PACKAGE_PURCHASE, purchase(active, w.package))
    await eventually(lambda: w.granted(active))
    before = await w.access_row(consumed), await w.access_row(active)

    # With and without its own (broker-validated) user_id: neither is pkgq's.
    forged = [
        await publish_as(connection, w.settings, PACKAGE_ACTIVATE, forged_activation(consumed)),
        await publish_as(
            connection, w.settings, PACKAGE_ACTIVATE, forged_activation(consumed), user_id=name
        ),
    ]
    revoking = await publish_as(connection, w.settings, ALL_EXPIRED, forged_all_expired(active))

    async def buried() -> bool:
        return len(await w.untrusted(PACKAGE_ACTIVATE)) == 2 and bool(
            await w.untrusted(ALL_EXPIRED)
        )

    await eventually(buried)
    assert sorted(str(r["message_id"]) for r in await w.untrusted(PACKAGE_ACTIVATE)) == sorted(
        forged
    )
    assert [str(r["message_id"]) for r in await w.untrusted(ALL_EXPIRED)] == [revoking]
    assert (await w.access_row(consumed), await w.access_row(active)) == before
    async with w.pool.acquire() as conn:  # buried before being believed: nothing applied
        applied = await conn.fetchval(
            "SELECT count(*) FROM telecom.inbox WHERE sent_as = ANY($1::uuid[])",
            [UUID(m) for m in [*forged, revoking]],
        )
    assert applied == 0

    # An operator cannot launder them into pkgq's own events by a replay.
    async with w.pool.acquire() as conn, conn.transaction():
        ids = [r["id"] for r in await conn.fetch("SELECT id FROM telecom.dead_letters")]
        results = await replay.replay(conn, ids, "ops", pkgq_user=w.settings.amqp_user, force=True)
    assert len(results) == 3
    assert not any(r.replayed for r in results)

    # Inbound commands from the same outsider are taken, and genuine events still apply.
    await publish_as(connection, w.settings, PACKAGE_PURCHASE, purchase(consumed, w.package))
    await eventually(lambda: w.granted(consumed))


async def test_no_publisher_can_claim_pkgqs_user_id(
    w: World, loose_publisher: tuple[str, AbstractRobustConnection]
) -> None:
    _, connection = loose_publisher
    with pytest.raises(ChannelPreconditionFailed):
        await publish_as(
            connection,
            w.settings,
            PACKAGE_ACTIVATE,
            forged_activation(uuid4()),
            user_id=w.settings.amqp_user,
        )


async def test_the_relays_lifecycle_events_carry_pkgqs_user_id_and_are_applied(w: World) -> None:
    user = uuid4()
    await send(w.settings, w.amqp, PACKAGE_PURCHASE, purchase(user, w.package))
    await eventually(lambda: w.granted(user))
    activations = [
        t
        for t in w.tap.seen
        if t.routing_key == PACKAGE_ACTIVATE.name and t.json().get("user_id") == str(user)
    ]
    assert [t.publisher for t in activations] == [w.settings.amqp_user]
    assert await w.untrusted(PACKAGE_ACTIVATE) == []


async def test_an_untrusted_message_neither_fails_pkgqs_job_nor_overwrites_its_dead_letter(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    # Without the broker: deliveries as the consumer receives them, with their user_id.
    pipeline = DeliveryPipeline(
        pool,
        PACKAGE_ACTIVATE,
        HANDLERS[PACKAGE_ACTIVATE.name],
        RetryPolicy(max_attempts=1),
        max_body_bytes=2**20,
        trusted_publisher=settings.amqp_user,
    )
    user = uuid4()
    queued = await Jobs(pool).publish(ALL_EXPIRED, forged_all_expired(user), address="ops:42")
    genuine = replace(
        raw_for(PACKAGE_ACTIVATE, forged_activation(user)),
        headers={H_SCHEMA_VERSION: 0},  # pkgq's own, but undecodable: buried as bad input
        publisher=settings.amqp_user,
    )
    await pipeline.process_batch([genuine])
    forged = replace(
        raw_for(PACKAGE_ACTIVATE, forged_activation(user)),
        message_id=genuine.message_id,
        headers={H_SCHEMA_VERSION: 1, H_ADDRESS: "ops:42", H_USER_ID: str(user)},
        publisher="mallory",
    )
    forged_for_job = replace(forged, message_id=str(queued.message_id), body=forged.body + b" ")
    await pipeline.process_batch([forged, forged_for_job])

    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT message_id, reason FROM telecom.dead_letters ORDER BY id",
        )
        state = await addresses.address_state(conn, "ops:42")
    assert [(r["message_id"], r["reason"]) for r in rows] == [
        (genuine.message_id, "unsupported_version"),
        (genuine.message_id, UNTRUSTED_PUBLISHER),
        (str(queued.message_id), UNTRUSTED_PUBLISHER),
    ]
    assert state is not None
    assert state.state == "queued"


async def test_an_outsiders_forged_address_and_group_headers_join_nothing_and_it_is_applied(
    w: World, publisher: AbstractRobustConnection
) -> None:
    # pkgq's own jobs, an address and a one-member group, both due in an hour: their genuine
    # messages stay in the outbox for the whole test.
    jobs = Jobs(w.pool)
    addressed = await jobs.publish(
        PACKAGE_PURCHASE, purchase(uuid4(), w.package), address="ops:tls-42", delay=3600
    )
    group = await jobs.publish_group(
        PACKAGE_PURCHASE, [purchase(uuid4(), w.package)], name="nightly", delay=3600
    )
    (member,) = group.message_ids

    # An outsider (the publisher role) sends commands that claim those jobs: their message_ids
    # and headers saying they are the addressed message and the group's member.
    forged: dict[UUID, UUID] = {}
    with structlog.testing.capture_logs() as logs:
        await _publish_forged_marks(
            w, publisher, addressed.message_id, member, group.group_id, forged
        )
        # Still applied: the commands are inbound, anyone may send them.
        for user in forged:
            await eventually(partial(w.granted, user))
    ignored = [e for e in logs if e["event"] == "outsider_job_marks_ignored"]
    assert sorted((e["message_id"], tuple(e["headers"])) for e in ignored) == sorted(
        [(str(addressed.message_id), (H_ADDRESS,)), (str(member), (H_GROUP,))]
    )
    async with w.pool.acquire() as conn:
        address = await addresses.address_state(conn, "ops:tls-42")
        summary = await groups.group_summary(conn, group.group_id)
        member_state = await conn.fetchval(
            "SELECT state FROM telecom.group_members WHERE message_id = $1", member
        )
    # But neither finished pkgq's job: the address still waits for its own message, and the
    # group's member is still pending, the group open, nothing done.
    assert address is not None
    assert address.state == "queued"
    assert summary is not None
    assert (summary["state"], summary["done"], summary["failed"]) == ("open", 0, 0)
    assert member_state == "pending"


async def _publish_forged_marks(
    w: World,
    publisher: AbstractRobustConnection,
    addressed: UUID,
    member: UUID,
    group_id: UUID,
    forged: dict[UUID, UUID],
) -> None:
    """Purchases for new users, under the message_ids of pkgq's addressed and grouped jobs and
    with their job marks; `forged` gets user -> message_id."""
    for message_id, marks in (
        (addressed, {H_ADDRESS: "ops:tls-42"}),
        (member, {H_GROUP: str(group_id)}),
    ):
        user = uuid4()
        forged[user] = message_id
        await publish_as(
            publisher,
            w.settings,
            PACKAGE_PURCHASE,
            purchase(user, w.package),
            seq=None,
            message_id=message_id,
            marks=marks,
        )
