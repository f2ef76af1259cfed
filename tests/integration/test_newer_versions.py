"""A message of a schema version newer than this pkgq knows is left for a newer pkgq: held in its
user's order and retried, never buried, never counted. Against the test's own database, calling
the route's pipeline directly (an old pod), then a pipeline that knows the version (a new pod).
"""

from __future__ import annotations

import dataclasses
import json
from uuid import UUID, uuid4

import asyncpg

from consumers.delivery import DeliveryPipeline
from consumers.handlers import usage_record
from consumers.retry_policy import RetryPolicy
from domain.delivery import Fate
from events.decoding import RawDelivery
from events.envelope import CONTENT_TYPE, H_SCHEMA_VERSION, H_USER_ID
from events.routes import USAGE_RECORD
from events.versions import Previous
from infra.postgres import invariants
from tests.support.keys import attempts_counted, delivery_key
from tests.support.observing import fetch

NEWER = USAGE_RECORD.schema_version + 1
NO_GRACE = invariants.Graces(outbox_s=0.0, attempts_s=0.0)


def usage(user: UUID, message_id: UUID, upload: int, version: int) -> RawDelivery:
    body: dict[str, object] = {"user_id": str(user), "upload": upload, "download": 0}
    if version >= 2:
        body["usage_id"] = f"cdr-{message_id}"
    return RawDelivery(
        body=json.dumps(body).encode(),
        message_id=str(message_id),
        message_type=USAGE_RECORD.message_type,
        content_type=CONTENT_TYPE,
        timestamp=None,
        headers={H_SCHEMA_VERSION: version, H_USER_ID: str(user)},
    )


def pod(pool: asyncpg.Pool, *, knows: int = USAGE_RECORD.schema_version) -> DeliveryPipeline:
    """The usage route as a pkgq that knows versions up to `knows` (its bodies are read as the
    current model: the "newer" version here only adds nothing)."""
    route = USAGE_RECORD
    if knows != route.schema_version:
        route = dataclasses.replace(
            route,
            schema_version=knows,
            previous=Previous(knows - 1, route.model, lambda body: body),
        )
    policy = RetryPolicy(max_attempts=2, backoff=lambda _: 60.0, newer_version_s=45.0)
    return DeliveryPipeline(pool, route, usage_record.handle, policy, max_body_bytes=2**20)


async def test_an_old_pod_holds_a_newer_message_counting_each_deferral_and_a_new_pod_applies_them_in_order(  # noqa: E501
    pool: asyncpg.Pool,
) -> None:
    user, first, second = uuid4(), uuid4(), uuid4()
    key = delivery_key(usage(user, first, 5, NEWER), user)
    old = pod(pool)
    fates = [
        r.fate
        for r in await old.process_batch(
            [usage(user, first, 5, NEWER), usage(user, second, 7, USAGE_RECORD.schema_version)]
        )
    ]
    assert fates == [Fate.RETRIED, Fate.PARKED]
    assert await fetch(pool, "SELECT * FROM telecom.dead_letters") == []
    # each deferral is counted (after PKGQ_NEWER_VERSION_DEFERRALS it is buried)
    assert await attempts_counted(pool, USAGE_RECORD.short_name, key) == 1
    (retry,) = await fetch(
        pool,
        "SELECT schema_version, body, headers, available_at - now() AS wait "
        "FROM telecom.outbox WHERE message_id = $1",
        first,
    )
    assert retry["schema_version"] == NEWER
    assert json.loads(bytes(retry["body"])) == json.loads(usage(user, first, 5, NEWER).body)
    assert retry["headers"][H_SCHEMA_VERSION] == NEWER
    assert 40 <= retry["wait"].total_seconds() <= 46

    # The retry reaches an old pod again (a rolling update takes a while): held once more.
    again = await old.process_batch([usage(user, first, 5, NEWER)])
    assert [r.fate for r in again] == [Fate.RETRIED]
    assert await fetch(pool, "SELECT * FROM telecom.dead_letters") == []
    assert await attempts_counted(pool, USAGE_RECORD.short_name, key) == 2
    # One pending retry of it at a time: the earlier one is replaced, not doubled.
    (pending,) = await fetch(
        pool,
        "SELECT count(*) AS n FROM telecom.outbox WHERE message_id = $1 AND published_at IS NULL",
        first,
    )
    assert pending["n"] == 1

    # Then a new pod: it applies the newer message, and the parked one after it.
    new = pod(pool, knows=NEWER)
    assert [r.fate for r in await new.process_batch([usage(user, first, 5, NEWER)])] == [Fate.ACKED]
    new._polled_at = -1e9
    await new.drain_parked()
    assert await fetch(pool, "SELECT * FROM telecom.parked") == []
    (billed,) = await fetch(
        pool, "SELECT unbilled_upload FROM telecom.queue_users WHERE user_id = $1", user
    )
    assert billed["unbilled_upload"] == 12
    async with pool.acquire() as conn:
        broken = [r.check for r in await invariants.run_all(conn, graces=NO_GRACE) if not r.ok]
    assert broken == []


async def test_the_previous_version_is_applied_beside_the_current_one_for_the_same_user(
    pool: asyncpg.Pool,
) -> None:
    user = uuid4()
    batch = [usage(user, uuid4(), 1, 1), usage(user, uuid4(), 2, 2), usage(user, uuid4(), 4, 1)]
    assert [r.fate for r in await pod(pool).process_batch(batch)] == [Fate.ACKED] * 3
    (billed,) = await fetch(
        pool, "SELECT unbilled_upload FROM telecom.queue_users WHERE user_id = $1", user
    )
    assert billed["unbilled_upload"] == 7


async def test_a_version_older_than_the_previous_is_buried_as_unsupported(
    pool: asyncpg.Pool,
) -> None:
    user, message = uuid4(), uuid4()
    results = await pod(pool).process_batch([usage(user, message, 1, 0)])
    assert [r.fate for r in results] == [Fate.DEAD_LETTERED]
    (letter,) = await fetch(pool, "SELECT reason FROM telecom.dead_letters")
    assert letter["reason"] == "unsupported_version"
