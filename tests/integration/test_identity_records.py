"""A message is its own in what Postgres keeps of it: its key (message_id, publisher, user) is
worked out alike in SQL and in pkgq; `pkgq doctor` names a hold retried past every bound and one
that only another copy's retry would free; a dead letter is a record an operator's decision
stands on, which a consumer remembers the message by once the inbox has forgotten it; and a
parked message is its own row, which an outsider's copy under its id never takes with it.
Through the route's processor and Postgres directly, against the test's own database.
"""

from __future__ import annotations

from uuid import UUID, uuid4

import asyncpg
import hypothesis
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from consumers.delivery import DeliveryPipeline
from consumers.handlers import usage_record
from consumers.retry_policy import RetryPolicy
from consumers.unit_of_work import HandlerContext
from domain.delivery import Fate
from events.decoding import RawDelivery
from events.envelope import CONTENT_TYPE, H_SCHEMA_VERSION
from events.identity import message_key
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.postgres import dead_letters, invariants, replay
from infra.postgres.pool import Conn
from tests.support import keys
from tests.support.observing import fetch


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
