"""The failure path against a model: arbitrary interleavings of deliveries (with hostile
headers), duplicates, failures of every kind (handler, permanent, domain rule, a transient
blip), expiries, relayed retries, replays, discards and drains, run through the real pipeline
and writer on the test's own database. After every step:

- every invariant `pkgq doctor` checks holds (with no grace: nothing here is in flight);
- a message waiting for its retry holds its user (per-user order);
- every failure of a message moved its count by exactly one (since its last replay): no header
  value plays a part;
- every message delivered so far is applied, pending in the outbox, parked or dead-lettered;
- what was applied was applied once: each message bills its own power of two, and the user's
  unbilled upload is the sum over the messages in the inbox.

PKGQ_MODEL_EXAMPLES scales it (CI runs the default).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import hypothesis
from hypothesis import HealthCheck, example, given
from hypothesis import strategies as st

from consumers import operations
from consumers.delivery import DeliveryPipeline
from consumers.handler_errors import Bury
from consumers.handlers import usage_record
from consumers.retry_policy import RetryPolicy
from consumers.unit_of_work import HandlerContext
from events.decoding import RawDelivery
from events.envelope import (
    CONTENT_TYPE,
    H_ATTEMPT,
    H_EXPIRES_AT,
    H_REPLAY_GENERATION,
    H_SCHEMA_VERSION,
    H_USER_ID,
)
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.postgres import invariants
from tests.support.observing import fetch

EXAMPLES = int(os.environ.get("PKGQ_MODEL_EXAMPLES", "20"))
MESSAGES = 6
PKGQ = "pkgq"
NO_GRACE = invariants.Graces(outbox_s=0.0, attempts_s=0.0)

Behaviour = str  # ok | handler | permanent | rule | blip
FAILING = ("handler", "permanent", "rule")


@dataclass
class Model:
    users: list[UUID]
    ids: list[UUID]
    plan: dict[UUID, list[Behaviour]] = field(default_factory=dict)
    """How the handler behaves on each message's next runs, in order (then `ok`)."""
    failures: Counter[UUID] = field(default_factory=Counter)
    """Failures the handler raised per message since its last replay."""
    delivered: set[UUID] = field(default_factory=set)

    def user_of(self, m: int) -> UUID:
        return self.users[m % len(self.users)]


def handler_for(model: Model) -> Any:
    async def handler(ctx: HandlerContext, body: RecordUsage) -> None:
        planned = model.plan.get(ctx.envelope.message_id)
        behaviour = planned.pop(0) if planned else "ok"
        if behaviour == "blip":
            raise asyncpg.exceptions.DeadlockDetectedError("deadlock detected (injected)")
        if behaviour in FAILING:
            model.failures[ctx.envelope.message_id] += 1
            if behaviour == "handler":
                raise RuntimeError("billing backend refused (injected)")
            if behaviour == "permanent":
                raise asyncpg.exceptions.NumericValueOutOfRangeError("bigint out of range")
            raise Bury("refused_by_model")
        await usage_record.handle(ctx, body)

    return handler


def raw(model: Model, m: int, headers: dict[str, Any], publisher: str) -> RawDelivery:
    user = model.user_of(m)
    body = RecordUsage(user_id=user, upload=2**m, download=0)
    return RawDelivery(
        body=body.model_dump_json().encode(),
        message_id=str(model.ids[m]),
        message_type=USAGE_RECORD.message_type,
        content_type=CONTENT_TYPE,
        timestamp=None,
        headers={H_SCHEMA_VERSION: USAGE_RECORD.schema_version, H_USER_ID: str(user), **headers},
        publisher=publisher,
    )


hostile_headers = st.fixed_dictionaries(
    {},
    optional={
        H_ATTEMPT: st.one_of(st.integers(-(2**40), 2**40), st.text(max_size=5), st.none()),
        H_REPLAY_GENERATION: st.integers(-5, 2**33),
    },
)
steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("deliver"),
            st.lists(  # one batch, a message possibly twice (a resend, a redelivery)
                st.tuples(
                    st.integers(0, MESSAGES - 1),
                    st.sampled_from(["ok", "handler", "handler", "permanent", "rule", "blip"]),
                    hostile_headers,
                ),
                min_size=1,
                max_size=4,
            ),
        ),
        st.tuples(
            st.just("relay"), st.integers(0, MESSAGES - 1), st.sampled_from(["ok", "handler"])
        ),
        st.tuples(st.just("expire"), st.integers(0, MESSAGES - 1)),
        st.tuples(st.just("replay"), st.integers(0, MESSAGES - 1)),
        st.tuples(st.just("discard"), st.integers(0, MESSAGES - 1)),
        st.tuples(st.just("drain")),
    ),
    min_size=1,
    max_size=18,
)


async def run_step(
    pool: asyncpg.Pool, pipe: DeliveryPipeline, model: Model, step: tuple[Any, ...]
) -> None:
    kind, *args = step
    if kind == "deliver":
        (batch,) = args
        for m, behaviour, _ in batch:
            model.plan.setdefault(model.ids[m], []).append(behaviour)
            model.delivered.add(model.ids[m])
        await pipe.process_batch([raw(model, m, headers, "billing") for m, _, headers in batch])
    elif kind == "relay":  # the relay publishes the message's pending retry or replay
        m, behaviour = args
        rows = await fetch(
            pool,
            "UPDATE telecom.outbox SET published_at = now() WHERE id = (SELECT min(id) "
            "FROM telecom.outbox WHERE message_id = $1 AND published_at IS NULL) RETURNING headers",
            model.ids[m],
        )
        if rows:
            model.plan.setdefault(model.ids[m], []).append(behaviour)
            await pipe.process_batch([raw(model, m, dict(rows[0]["headers"]), PKGQ)])
    elif kind == "expire":  # pkgq's copy, taken after its TTL
        (m,) = args
        model.delivered.add(model.ids[m])
        past = (datetime.now(UTC) - timedelta(seconds=5)).isoformat()
        await pipe.process_batch([raw(model, m, {H_EXPIRES_AT: past}, PKGQ)])
    elif kind in ("replay", "discard"):
        (m,) = args
        buried = await fetch(
            pool,
            "SELECT id FROM telecom.dead_letters WHERE message_uuid = $1 AND status = 'buried'",
            model.ids[m],
        )
        if buried:
            async with pool.acquire() as conn, conn.transaction():
                if kind == "replay":
                    await operations.replay_batch(
                        conn, [buried[0]["id"]], "model", pkgq_user="pkgq"
                    )
                    model.failures[model.ids[m]] = 0  # a replay starts the count over
                else:
                    await operations.discard_batch(conn, [buried[0]["id"]], "model")
    pipe._polled_at = -1e9  # the release poll, without its once-a-second pause
    await pipe.drain_parked()


async def check(pool: asyncpg.Pool, model: Model, where: str) -> None:
    async with pool.acquire() as conn:
        results = await invariants.run_all(conn, graces=NO_GRACE)
    broken = {r.check: r.sample for r in results if not r.ok}
    assert not broken, f"{where}: invariants broken: {broken}"
    # Per-user order: a message waiting for its retry holds its user's later messages.
    unheld = await fetch(
        pool,
        "SELECT o.message_id FROM telecom.outbox o WHERE o.published_at IS NULL "
        "AND o.cancel_key LIKE 'retry:%' AND NOT EXISTS (SELECT 1 FROM telecom.holds h "
        "WHERE h.user_id = o.user_id AND h.blocker = o.message_id AND h.state = 'retrying')",
    )
    assert not unheld, f"{where}: a retry without its hold: {unheld}"
    counted = {
        r["message_id"]: r["attempts"]
        for r in await fetch(pool, "SELECT message_id, attempts FROM telecom.attempts")
    }
    for message_id, failures in model.failures.items():
        assert counted.get(message_id, 0) == failures, f"{where}: {message_id} count"
    accounted = {
        r["m"]
        for r in await fetch(
            pool,
            "SELECT message_id AS m FROM telecom.inbox UNION SELECT message_id FROM telecom.parked "
            "UNION SELECT message_id FROM telecom.outbox WHERE published_at IS NULL "
            "UNION SELECT message_uuid FROM telecom.dead_letters",
        )
    }
    assert model.delivered <= accounted, f"{where}: lost {model.delivered - accounted}"
    applied = {r["message_id"] for r in await fetch(pool, "SELECT message_id FROM telecom.inbox")}
    for user in model.users:
        expected = sum(
            2**m for m, mid in enumerate(model.ids) if mid in applied and model.user_of(m) == user
        )
        rows = await fetch(
            pool, "SELECT unbilled_upload FROM telecom.queue_users WHERE user_id = $1", user
        )
        assert (rows[0]["unbilled_upload"] if rows else 0) == expected, f"{where}: billed twice?"


@hypothesis.settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scenario=steps)
@example(  # buried, then a copy of it fails and waits for a retry, then the operator discards it
    scenario=[
        ("deliver", [(0, "permanent", {}), (0, "handler", {}), (1, "ok", {})]),
        ("discard", 0),
    ]
)
async def test_every_interleaving_keeps_the_failure_paths_invariants_and_counts_each_failure_once(
    pool: asyncpg.Pool, scenario: list[tuple[Any, ...]]
) -> None:
    async with pool.acquire() as conn:  # each example starts from an empty database
        await conn.execute(
            "DELETE FROM telecom.holds; DELETE FROM telecom.parked; DELETE FROM telecom.outbox;"
            "DELETE FROM telecom.attempts; DELETE FROM telecom.dead_letters;"
            "DELETE FROM telecom.inbox; DELETE FROM telecom.queue_users;"
        )
    model = Model([uuid4(), uuid4()], [uuid4() for _ in range(MESSAGES)])
    policy = RetryPolicy(max_attempts=3, backoff=lambda _: 60.0)
    pipe = DeliveryPipeline(
        pool, USAGE_RECORD, handler_for(model), policy, max_body_bytes=2**20, trusted_publisher=PKGQ
    )
    for number, step in enumerate(scenario):
        await run_step(pool, pipe, model, step)
        await check(pool, model, f"step {number} {step[0]}")
