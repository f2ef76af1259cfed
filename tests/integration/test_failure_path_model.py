"""The failure path against a model: arbitrary interleavings of deliveries (with hostile
headers), duplicates, failures of every kind (handler, permanent, domain rule, a transient
blip), expiries, relayed retries, replays, discards and drains, run through the real pipeline
and writer on the test's own database; and an outsider (another broker user) who sends copies
of the honest publisher's message_ids, for the same user or another, with any of pkgq's own
headers, garbage under those ids claiming a user, and whose dead letters an operator discards
or replays like any other. After every step:

- every invariant `pkgq doctor` checks holds (with no grace: nothing here is in flight), so no
  hold is without a bounded way out;
- a message waiting for its retry holds its user (per-user order);
- every failure of a message (by its identity: events/identity.py) moved its count by exactly
  one (since its last replay): no header value, and no other publisher's copy, plays a part;
- every message the honest publisher delivered so far is applied, pending in the outbox,
  parked or dead-lettered: nothing the outsider does loses it;
- what was applied was applied once: each message bills its own power of two, and the user's
  unbilled upload is the sum over the messages in the inbox.

PKGQ_MODEL_EXAMPLES scales it (CI runs the default).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
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
    H_ADDRESS,
    H_ATTEMPT,
    H_EXPIRES_AT,
    H_PRIORITY,
    H_PUBLISHER,
    H_REPLAY_GENERATION,
    H_SCHEMA_VERSION,
    H_USER_ID,
    publisher_of,
)
from events.identity import message_key
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.postgres import invariants
from tests.support.observing import fetch

EXAMPLES = int(os.environ.get("PKGQ_MODEL_EXAMPLES", "20"))
MESSAGES = 6
PKGQ = "pkgq"
HONEST = "billing"
OUTSIDER = "mallory"
USERS = 2
NO_GRACE = invariants.Graces(outbox_s=0.0, attempts_s=0.0)

Behaviour = str  # ok | handler | permanent | rule | blip
FAILING = ("handler", "permanent", "rule")


@dataclass
class Model:
    users: list[UUID]
    ids: list[UUID]
    plan: dict[UUID, list[Behaviour]] = field(default_factory=dict)
    """How the handler behaves on each message's next runs (by key), in order (then `ok`)."""
    failures: Counter[UUID] = field(default_factory=Counter)
    """Failures the handler raised per message (by key) since its last replay."""
    delivered: set[UUID] = field(default_factory=set)
    """Keys of the messages the honest publisher delivered."""
    uploads: dict[UUID, int] = field(default_factory=dict)
    """What each message (by key) bills when applied, and for which user: its own power of two."""
    users_of: dict[UUID, UUID] = field(default_factory=dict)

    def user_of(self, m: int) -> UUID:
        return self.users[m % len(self.users)]

    def honest_key(self, m: int) -> UUID:
        key = message_key(self.ids[m], HONEST, self.user_of(m))
        self.uploads[key], self.users_of[key] = 2**m, self.user_of(m)
        return key

    def outsider_key(self, m: int, t: int) -> UUID:
        """The outsider's copy of message m for user t: a message of its own."""
        key = message_key(self.ids[m], OUTSIDER, self.users[t])
        self.uploads[key], self.users_of[key] = 2 ** (MESSAGES + m * USERS + t), self.users[t]
        return key


def handler_for(model: Model) -> Any:
    async def handler(ctx: HandlerContext, body: RecordUsage) -> None:
        envelope = ctx.envelope
        key = message_key(envelope.message_id, envelope.publisher, envelope.user_id)
        planned = model.plan.get(key)
        behaviour = planned.pop(0) if planned else "ok"
        if behaviour == "blip":
            raise asyncpg.exceptions.DeadlockDetectedError("deadlock detected (injected)")
        if behaviour in FAILING:
            model.failures[key] += 1
            if behaviour == "handler":
                raise RuntimeError("billing backend refused (injected)")
            if behaviour == "permanent":
                raise asyncpg.exceptions.NumericValueOutOfRangeError("bigint out of range")
            raise Bury("refused_by_model")
        await usage_record.handle(ctx, body)

    return handler


def delivery(
    model: Model,
    m: int,
    body: bytes,
    headers: dict[str, Any],
    publisher: str,
    content_type: str = CONTENT_TYPE,
) -> RawDelivery:
    """A delivery under message m's id."""
    return RawDelivery(
        body=body,
        message_id=str(model.ids[m]),
        message_type=USAGE_RECORD.message_type,
        content_type=content_type,
        timestamp=None,
        headers=headers,
        publisher=publisher,
    )


def usage_body(user: UUID, upload: int) -> bytes:
    return RecordUsage(user_id=user, upload=upload, download=0).model_dump_json().encode()


VERSION = {H_SCHEMA_VERSION: USAGE_RECORD.schema_version}


def raw(model: Model, m: int, headers: dict[str, Any], publisher: str) -> RawDelivery:
    """Message m, for its user, billing its own power of two."""
    user = model.user_of(m)
    claims = {**VERSION, H_USER_ID: str(user), **headers}
    return delivery(model, m, usage_body(user, 2**m), claims, publisher)


def outsiders(model: Model, m: int, t: int, headers: dict[str, Any]) -> RawDelivery:
    """The outsider's copy of message m's id, for user t, billing its own power of two."""
    key = model.outsider_key(m, t)
    body = usage_body(model.users[t], model.uploads[key])
    return delivery(model, m, body, {**VERSION, **headers}, OUTSIDER)


def garbage(model: Model, m: int, t: int, headers: dict[str, Any]) -> RawDelivery:
    """Garbage under message m's id, claiming user t in its header."""
    claims = {H_USER_ID: str(model.users[t]), **headers}
    return delivery(model, m, b"not json", claims, OUTSIDER, "text/plain")


PAST = "2000-01-01T00:00:00+00:00"
pkgq_headers = st.fixed_dictionaries(
    {},
    optional={
        H_EXPIRES_AT: st.just(PAST),
        H_PUBLISHER: st.sampled_from([HONEST, PKGQ]),
        H_ADDRESS: st.just("bill:1"),
        H_PRIORITY: st.integers(-1, 3),
        H_ATTEMPT: st.integers(-5, 30),
        H_REPLAY_GENERATION: st.integers(0, 9),
    },
)
"""What an outsider may write in pkgq's own headers."""


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
        st.tuples(
            st.just("copy"),
            st.integers(0, MESSAGES - 1),
            st.integers(0, USERS - 1),
            st.sampled_from(["ok", "handler", "permanent", "rule"]),
            pkgq_headers,
        ),
        st.tuples(
            st.just("garbage"),
            st.integers(0, MESSAGES - 1),
            st.integers(0, USERS - 1),
            pkgq_headers,
        ),
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
            key = model.honest_key(m)
            model.plan.setdefault(key, []).append(behaviour)
            model.delivered.add(key)
        await pipe.process_batch([raw(model, m, headers, HONEST) for m, _, headers in batch])
    elif kind == "copy":
        m, t, behaviour, headers = args
        model.plan.setdefault(model.outsider_key(m, t), []).append(behaviour)
        await pipe.process_batch([outsiders(model, m, t, headers)])
    elif kind == "garbage":
        m, t, headers = args
        await pipe.process_batch([garbage(model, m, t, headers)])
    elif kind == "relay":  # the relay publishes a pending retry or replay of the message id
        m, behaviour = args
        rows = await fetch(
            pool,
            "UPDATE telecom.outbox SET published_at = now() WHERE id = (SELECT min(id) "
            "FROM telecom.outbox WHERE message_id = $1 AND published_at IS NULL) "
            "RETURNING headers, body, user_id",
            model.ids[m],
        )
        if rows:
            headers = dict(rows[0]["headers"])
            key = message_key(model.ids[m], publisher_of(headers, PKGQ), rows[0]["user_id"])
            model.plan.setdefault(key, []).append(behaviour)
            # as the relay sends it: the row's body and headers
            copy = delivery(model, m, bytes(rows[0]["body"]), {**VERSION, **headers}, PKGQ)
            await pipe.process_batch([copy])
    elif kind == "expire":  # pkgq's copy of the honest message, taken after its TTL
        (m,) = args
        model.delivered.add(model.honest_key(m))
        await pipe.process_batch([raw(model, m, {H_EXPIRES_AT: PAST, H_PUBLISHER: HONEST}, PKGQ)])
    elif kind in ("replay", "discard"):  # whichever letter filed under the id, anyone's
        (m,) = args
        buried = await fetch(
            pool,
            "SELECT id, message_key FROM telecom.dead_letters "
            "WHERE message_uuid = $1 AND status = 'buried' ORDER BY id",
            model.ids[m],
        )
        if buried:
            async with pool.acquire() as conn, conn.transaction():
                if kind == "replay":
                    await operations.replay_batch(conn, [buried[0]["id"]], "model", pkgq_user=PKGQ)
                    if buried[0]["message_key"] is not None:
                        model.failures[buried[0]["message_key"]] = 0  # it starts over
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
        "WHERE h.user_id = o.user_id AND h.state = 'retrying' AND o.cancel_key = "
        "'retry:' || h.consumer || ':' || telecom.blocker_key(h.consumer, h.user_id, h.blocker, "
        "h.blocker_key, h.blocker_key_of))",
    )
    assert not unheld, f"{where}: a retry without its hold: {unheld}"
    counted = {
        r["message_id"]: r["attempts"]
        for r in await fetch(pool, "SELECT message_id, attempts FROM telecom.attempts")
    }
    for key, failures in model.failures.items():
        assert counted.get(key, 0) == failures, f"{where}: {key} count"
    accounted = {
        r["k"]
        for r in await fetch(
            pool,
            "SELECT message_id AS k FROM telecom.inbox UNION SELECT message_id FROM telecom.parked "
            "UNION SELECT telecom.message_key(message_id, headers ->> 'x-pkgq-publisher', user_id) "
            "FROM telecom.outbox WHERE published_at IS NULL "
            "UNION SELECT message_key FROM telecom.dead_letters",
        )
    }
    assert model.delivered <= accounted, f"{where}: lost {model.delivered - accounted}"
    applied = {r["message_id"] for r in await fetch(pool, "SELECT message_id FROM telecom.inbox")}
    for user in model.users:
        expected = sum(model.uploads[k] for k in applied if model.users_of.get(k) == user)
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
@example(  # the outsider's expired copy and its garbage under a retrying message's id, discarded
    scenario=[
        ("deliver", [(0, "handler", {}), (2, "ok", {})]),
        ("copy", 0, 0, "ok", {H_EXPIRES_AT: PAST, H_PUBLISHER: HONEST}),
        ("garbage", 0, 0, {H_PUBLISHER: HONEST}),
        ("discard", 0),
        ("relay", 0, "ok"),
        ("drain",),
    ]
)
@example(  # the outsider's copy applied first, for the same user; the honest one still applies
    scenario=[("copy", 1, 1, "ok", {}), ("deliver", [(1, "ok", {})]), ("deliver", [(1, "ok", {})])]
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
    model = Model([uuid4() for _ in range(USERS)], [uuid4() for _ in range(MESSAGES)])
    policy = RetryPolicy(max_attempts=3, backoff=lambda _: 60.0)
    pipe = DeliveryPipeline(
        pool, USAGE_RECORD, handler_for(model), policy, max_body_bytes=2**20, trusted_publisher=PKGQ
    )
    for number, step in enumerate(scenario):
        await run_step(pool, pipe, model, step)
        await check(pool, model, f"step {number} {step[0]}")
