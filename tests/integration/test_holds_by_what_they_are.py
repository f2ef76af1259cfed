"""Holds released by what they are: a hold is (consumer, user, blocker), its blocker known by the
message's key (events/identity.py: message_id, first publisher, user), and every release matches
it, never a message_id alone. User A's hold waits on message M; user B has
a message with the same id M (anyone may publish a message_id they know). Whatever becomes of
B's M (its dead letter discarded or replayed, its retry expired in the outbox or on the broker,
its group cancelled), A's hold stays, and B's own hold on M is released as before."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import asyncpg

from consumers import ingest
from events.decoding import RawDelivery
from events.envelope import H_ATTEMPT, H_GROUP, H_PUBLISHER
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.jobs import Jobs
from infra.postgres import dead_letters, groups, outbox, replay
from infra.settings import Settings
from tests.support.dead_letters import buried
from tests.support.in_process import InProcess
from tests.support.keys import blocker_key
from tests.support.keys import hold as hold_row
from tests.support.observing import eventually, fetch

CONSUMER = USAGE_RECORD.short_name
PUBLISHER = "guest"
"""Who first published the messages whose retries the tests leave in the outbox."""


async def hold(
    pool: asyncpg.Pool,
    user: UUID,
    blocker: UUID,
    consumer: str = CONSUMER,
    publisher: str | None = None,
) -> None:
    """`user` held behind the message `blocker` for `user` (by its key); publisher None: the
    one tests/support/dead_letters files its letters with (nobody vouched for it)."""
    await hold_row(pool, consumer, user, blocker, publisher=publisher)


async def holds_now(pool: asyncpg.Pool) -> dict[tuple[str, UUID], tuple[UUID | None, str]]:
    rows = await fetch(pool, "SELECT consumer, user_id, blocker, state FROM telecom.holds")
    return {(r["consumer"], r["user_id"]): (r["blocker"], r["state"]) for r in rows}


def usage(user: UUID) -> bytes:
    return RecordUsage(user_id=user, upload=1, download=0).model_dump_json().encode()


async def retry_row(
    pool: asyncpg.Pool,
    user: UUID,
    message_id: UUID,
    expires_in: float,
    group: UUID | None = None,
) -> None:
    """User's pending retry of `message_id` (first published by PUBLISHER) on the usage route,
    its TTL running out then; a member of `group` (a retry keeps its group's mark) if given."""
    marks = {H_GROUP: str(group)} if group is not None else {}
    async with pool.acquire() as conn:
        await outbox.enqueue(
            conn,
            [
                outbox.OutboxMessage(
                    route=USAGE_RECORD.name,
                    message_type=USAGE_RECORD.message_type,
                    schema_version=1,
                    body=usage(user),
                    user_id=user,
                    message_id=message_id,
                    headers={H_ATTEMPT: 2, H_PUBLISHER: PUBLISHER, **marks},
                    expires_at=datetime.now(UTC) + timedelta(seconds=expires_in),
                    cancel_key=outbox.retry_key(CONSUMER, blocker_key(message_id, user, PUBLISHER)),
                    dedup_key=f"retry:{CONSUMER}:{message_id}:{user}",
                )
            ],
        )


async def test_discarding_another_users_dead_letter_of_the_same_message_id_leaves_a_hold(
    pool: asyncpg.Pool,
) -> None:
    a, b, m = uuid4(), uuid4(), uuid4()
    await hold(pool, a, m)
    await hold(pool, b, m)
    theirs = await buried(pool, message_id=str(m), user_id=b)
    async with pool.acquire() as conn, conn.transaction():
        assert await dead_letters.discard(conn, [theirs], "ops") == 1
    assert await holds_now(pool) == {
        (CONSUMER, a): (m, "buried"),
        (CONSUMER, b): (None, "releasing"),
    }


async def test_replaying_another_users_dead_letter_of_the_same_message_id_leaves_a_hold(
    pool: asyncpg.Pool,
) -> None:
    a, b, m = uuid4(), uuid4(), uuid4()
    await hold(pool, a, m)
    await hold(pool, b, m)
    theirs = await buried(pool, message_id=str(m), user_id=b, body=usage(b))
    async with pool.acquire() as conn, conn.transaction():
        (result,) = await replay.replay(conn, [theirs], "ops", pkgq_user="pkgq")
    assert result.replayed
    assert await holds_now(pool) == {
        (CONSUMER, a): (m, "buried"),  # still waits for its own dead letter
        (CONSUMER, b): (m, "retrying"),  # waits for the replay
    }


async def test_another_users_retry_expired_before_it_was_published_leaves_a_hold(
    fast: Settings, pool: asyncpg.Pool, app: InProcess
) -> None:
    a, b, m = uuid4(), uuid4(), uuid4()
    await hold(pool, a, m, publisher=PUBLISHER)
    await hold(pool, b, m, publisher=PUBLISHER)
    await retry_row(pool, b, m, expires_in=-1)  # the relay expires it instead of sending it

    async def expired() -> bool:
        return bool(
            await fetch(
                pool,
                "SELECT 1 FROM telecom.dead_letters WHERE message_uuid = $1 AND source = 'relay'",
                m,
            )
        )

    await eventually(expired)
    assert await holds_now(pool) == {
        (CONSUMER, a): (m, "buried"),
        (CONSUMER, b): (None, "releasing"),
    }


async def test_another_users_retry_expired_on_the_broker_leaves_a_hold(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    a, b, m = uuid4(), uuid4(), uuid4()
    await hold(pool, a, m, publisher=PUBLISHER)
    await hold(pool, b, m, publisher=PUBLISHER)
    await hold(
        pool, b, m, consumer="package_purchase", publisher=PUBLISHER
    )  # B's hold on M on another route
    await retry_row(pool, b, m, expires_in=0)  # sent with a TTL the broker ran out
    expired = RawDelivery(
        body=usage(b),
        message_id=str(m),
        message_type=USAGE_RECORD.message_type,
        content_type="application/json",
        timestamp=None,
        headers={"x-death": [{"reason": "expired", "queue": "q", "count": 1}]},
        routing_key=USAGE_RECORD.name,
        publisher=settings.amqp_user,  # pkgq's own retry: its marks are believed
    )
    await ingest.make_ingester(pool, settings.amqp_user)([expired])
    assert await holds_now(pool) == {
        (CONSUMER, a): (m, "buried"),
        (CONSUMER, b): (None, "releasing"),
        ("package_purchase", b): (m, "buried"),
    }


async def test_cancelling_a_group_whose_member_has_another_users_blocker_id_leaves_a_hold(
    pool: asyncpg.Pool,
) -> None:
    b = uuid4()
    group = await Jobs(pool).publish_group(
        USAGE_RECORD, [RecordUsage(user_id=b, upload=1, download=0)], name="g", delay=3600
    )
    (m,) = group.message_ids  # B's member, still in the outbox
    a = uuid4()
    await hold(pool, a, m, publisher=PUBLISHER)
    await hold(pool, b, m, publisher=PUBLISHER)
    # B's member failed once: its retry waits
    await retry_row(pool, b, m, expires_in=3600, group=group.group_id)
    async with pool.acquire() as conn, conn.transaction():
        cancelled = await groups.cancel_group(conn, group.group_id, "ops")
    assert cancelled is not None
    assert (cancelled.withdrawn, cancelled.disarmed) == (1, 0)
    assert await holds_now(pool) == {
        (CONSUMER, a): (m, "buried"),
        (CONSUMER, b): (None, "releasing"),
    }


async def test_cancelling_a_group_withdraws_no_other_users_retry_under_a_members_id(
    pool: asyncpg.Pool,
) -> None:
    """C's message under the id of B's member (another user's, so another message) waits for
    its retry: the group's cancel withdraws only what carries the group's mark, B's member."""
    b, c = uuid4(), uuid4()
    group = await Jobs(pool).publish_group(
        USAGE_RECORD, [RecordUsage(user_id=b, upload=1, download=0)], name="g", delay=3600
    )
    (m,) = group.message_ids
    await hold_row(pool, CONSUMER, c, m, "retrying", publisher=PUBLISHER)
    await retry_row(pool, c, m, expires_in=3600)  # no group mark: not the group's
    async with pool.acquire() as conn, conn.transaction():
        cancelled = await groups.cancel_group(conn, group.group_id, "ops")
    assert cancelled is not None
    assert cancelled.withdrawn == 1  # B's member
    assert await holds_now(pool) == {(CONSUMER, c): (m, "retrying")}  # still held, by its own
    left = await fetch(pool, "SELECT user_id FROM telecom.outbox WHERE message_id = $1", m)
    assert [r["user_id"] for r in left] == [c]  # C's retry is still on its way
