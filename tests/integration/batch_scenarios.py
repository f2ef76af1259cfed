"""The batch-equivalence property's scenarios and runs (tests/integration/test_batch_equivalence.py
says what it proves): generated steps of messages, the two databases they run in, and the state
compared between them."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

import asyncpg
from hypothesis import strategies as st

from consumers.delivery import DeliveryPipeline
from consumers.registry import HANDLERS
from consumers.retry_policy import RetryPolicy
from domain.model import ExpiryReason
from events.decoding import RawDelivery
from events.models import (
    AdjustQuota,
    AllPackageExpiredEvent,
    CancelPackage,
    PackageActivateEvent,
    PackageExpiringEvent,
    PackageQueuePushEvent,
    PurchasePackage,
    RecordUsage,
    WireModel,
)
from events.routes import (
    ALL_EXPIRED,
    PACKAGE_ACTIVATE,
    PACKAGE_CANCEL,
    PACKAGE_EXPIRING,
    PACKAGE_PURCHASE,
    PACKAGE_QUEUING,
    QUOTA_ADJUST,
    ROUTES,
    USAGE_RECORD,
)
from infra.postgres import catalog
from tests.support.deliveries import raw_for

EXAMPLES = int(os.environ.get("PKGQ_PROPERTY_EXAMPLES", "40"))
USERS = 3
CATALOG: tuple[tuple[int, timedelta | None], ...] = (
    (10, timedelta(hours=1)),  # lasts the whole test: consumed by traffic, or cancelled
    (5, None),  # never expires by time
    (0, None),  # used up as soon as it is activated
    (10, timedelta(0)),  # its time is up as soon as it is activated
)
NAMES_AN_ITEM = {
    PACKAGE_QUEUING.name,
    PACKAGE_EXPIRING.name,
    PACKAGE_CANCEL.name,
    QUOTA_ADJUST.name,
    PACKAGE_ACTIVATE.name,
}
DELTAS = (1, -1, 3, -3, 8, -8, 2**62)
"""Quota changes; 2**62 twice on one item overflows its bigint column: the batch's write-back
fails, the pipeline falls back to one transaction per delivery, and the message is buried
holding its user (max_attempts=1), so that later ones are parked."""
ROWS = {
    "dead_letters": "SELECT route, consumer, message_id, reason, error_type, attempts, "
    "status::text FROM telecom.dead_letters WHERE user_id = $1 ORDER BY id",
    "holds": "SELECT consumer, blocker, state, attempts FROM telecom.holds "
    "WHERE user_id = $1 ORDER BY consumer",
    "parked": "SELECT consumer, message_id, route FROM telecom.parked "
    "WHERE user_id = $1 ORDER BY id",
}
"""A user's rows compared as they are, in order."""
TIMESTAMPS = {"pushed_at", "activated_at", "expired_at", "due_at", "cancelled_at"}
"""Clock times in message bodies: the two runs apply at different moments."""


@dataclass(frozen=True)
class Msg:
    """One message, in terms both runs share: user index, k-th item of that user."""

    user: int
    item: int = 0
    package: int = 0
    amount: int = 1
    upload: int = 0
    download: int = 0
    delta: int = 0
    reason: ExpiryReason = ExpiryReason.USAGE

    def __repr__(self) -> str:
        fields = [f"u{self.user}"] + [
            f"{f.name}={getattr(self, f.name)!s}"
            for f in dataclasses.fields(self)[1:]
            if getattr(self, f.name) != f.default
        ]
        return f"Msg({', '.join(fields)})"


@dataclass(frozen=True)
class Step:
    route: str
    messages: tuple[Msg, ...]
    redelivered: tuple[int, ...] = ()
    """Messages (index modulo their number) delivered again at the end of the step: the
    same message_id and body, as after a crash before the ack."""


_user = st.integers(0, USERS - 1)
_item = st.integers(0, 4)
_MESSAGES: dict[str, st.SearchStrategy[Msg]] = {
    PACKAGE_PURCHASE.name: st.builds(
        # package len(CATALOG) is not in the catalog: dead-lettered in the middle of a batch
        Msg,
        user=_user,
        package=st.integers(0, len(CATALOG)),
        amount=st.integers(1, 3),
    ),
    USAGE_RECORD.name: st.builds(
        Msg, user=_user, upload=st.integers(0, 6), download=st.integers(0, 6)
    ),
    PACKAGE_QUEUING.name: st.builds(Msg, user=_user, item=_item),
    PACKAGE_EXPIRING.name: st.builds(
        Msg, user=_user, item=_item, reason=st.sampled_from(ExpiryReason)
    ),
    PACKAGE_CANCEL.name: st.builds(Msg, user=_user, item=_item),
    QUOTA_ADJUST.name: st.builds(Msg, user=_user, item=_item, delta=st.sampled_from(DELTAS)),
    PACKAGE_ACTIVATE.name: st.builds(Msg, user=_user, item=_item),
    ALL_EXPIRED.name: st.builds(Msg, user=_user),
}


def _step(route: str) -> st.SearchStrategy[Step]:
    messages = st.lists(_MESSAGES[route], min_size=1, max_size=6).map(tuple)
    again = st.lists(st.integers(0, 5), max_size=2).map(tuple)
    return st.builds(Step, st.just(route), messages, again)


scenarios = st.tuples(
    _step(PACKAGE_PURCHASE.name),
    st.lists(
        st.sampled_from([PACKAGE_PURCHASE.name, *_MESSAGES]).flatmap(_step), min_size=1, max_size=8
    ),
).map(lambda steps: [steps[0], *steps[1]])


class Run:
    """One of the two databases, with its catalog and its pipelines."""

    def __init__(self, pool: asyncpg.Pool, packages: list[int]) -> None:
        self.pool = pool
        self.packages = packages
        """Catalog ids in CATALOG order."""
        self.pipelines: dict[str, DeliveryPipeline] = {}

    def __repr__(self) -> str:
        return f"Run(packages={self.packages})"

    def pipeline(self, route: str) -> DeliveryPipeline:
        if route not in self.pipelines:
            self.pipelines[route] = DeliveryPipeline(
                self.pool,
                ROUTES[route],
                HANDLERS[route],
                RetryPolicy(max_attempts=1, backoff=lambda _: 0.0),
                max_body_bytes=2**20,
            )
        return self.pipelines[route]


async def new_run(pool: asyncpg.Pool) -> Run:
    async with pool.acquire() as conn:
        ids = [
            (await catalog.add_package(conn, f"p{n}", traffic, duration)).id
            for n, (traffic, duration) in enumerate(CATALOG)
        ]
    return Run(pool, ids)


async def _queues(run: Run, users: Sequence[UUID]) -> dict[UUID, list[tuple[int, int]]]:
    """Each user's items as (id, package id), in queue order."""
    async with run.pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT user_id, id, package_id FROM telecom.package_queue "
            "WHERE user_id = ANY($1::uuid[]) ORDER BY created_at, id",
            list(users),
        )
    queues: dict[UUID, list[tuple[int, int]]] = {u: [] for u in users}
    for r in rows:
        queues[r["user_id"]].append((r["id"], r["package_id"]))
    return queues


def _body(route: str, msg: Msg, user: UUID, item: tuple[int, int], run: Run) -> WireModel:
    item_id, package_id = item
    if route == PACKAGE_PURCHASE.name:
        package = run.packages[msg.package] if msg.package < len(CATALOG) else 2**31
        return PurchasePackage(user_id=user, package_id=package, amount=msg.amount)
    if route == USAGE_RECORD.name:
        return RecordUsage(user_id=user, upload=msg.upload, download=msg.download)
    if route == PACKAGE_QUEUING.name:
        return PackageQueuePushEvent(
            user_id=user, item_ids=[item_id], package_id=package_id, pushed_at=1
        )
    if route == PACKAGE_EXPIRING.name:
        return PackageExpiringEvent(
            user_id=user, item_id=item_id, package_id=package_id, expired_at=1, reason=msg.reason
        )
    if route == PACKAGE_CANCEL.name:
        return CancelPackage(user_id=user, item_id=item_id)
    if route == QUOTA_ADJUST.name:
        return AdjustQuota(user_id=user, item_id=item_id, delta=msg.delta)
    if route == PACKAGE_ACTIVATE.name:
        return PackageActivateEvent(
            user_id=user, item_id=item_id, package_id=package_id, activated_at=1
        )
    assert route == ALL_EXPIRED.name, route
    return AllPackageExpiredEvent(user_id=user, expired_at=1)


async def deliveries(
    run: Run, step: Step, users: Sequence[UUID], ids: Sequence[UUID], seqs: Sequence[int]
) -> list[tuple[int, RawDelivery]]:
    """The step's deliveries in this database, with their message indexes, redeliveries last;
    a message naming an item its user does not have (yet) is left out."""
    queues = await _queues(run, users)
    raws: list[tuple[int, RawDelivery]] = []
    for index, msg in enumerate(step.messages):
        queue = queues[users[msg.user]]
        item = (1, run.packages[0])  # unused by routes that name no item
        if step.route in NAMES_AN_ITEM:
            if msg.item >= len(queue):
                continue
            item = queue[msg.item]
        body = _body(step.route, msg, users[msg.user], item, run)
        seq = seqs[index] if step.route in (PACKAGE_ACTIVATE.name, ALL_EXPIRED.name) else None
        raw = raw_for(ROUTES[step.route], body, seq=seq)
        raws.append((index, dataclasses.replace(raw, message_id=str(ids[index]))))
    sent = dict(raws)
    again = [j % len(ids) for j in step.redelivered]
    return raws + [(j, sent[j]) for j in again if j in sent]


def _normal_body(body: bytes, users: dict[UUID, int], pos: dict[int, int], run: Run) -> Any:
    out: dict[str, Any] = {}
    for key, value in json.loads(body).items():
        if key == "user_id":
            out[key] = users[UUID(value)]
        elif key == "item_id":
            out[key] = pos.get(value, f"foreign {value}")
        elif key == "item_ids":
            out[key] = [pos.get(v, f"foreign {v}") for v in value]
        elif key == "package_id":
            out[key] = run.packages.index(value)
        elif key not in TIMESTAMPS:
            out[key] = value
    return out


async def state_of(run: Run, users: Sequence[UUID], message_ids: Sequence[UUID]) -> dict[str, Any]:
    """Everything the two runs must agree on, free of ids and clock times."""
    index = {u: n for n, u in enumerate(users)}
    state: dict[str, Any] = {}
    async with run.pool.acquire() as conn:
        for n, user in enumerate(users):
            items = await conn.fetch(
                "SELECT id, package_id, status::text AS status, upload, download, adjust_quota, "
                "activated_at IS NOT NULL AS activated, expire_at IS NOT NULL AS expires "
                "FROM telecom.package_queue WHERE user_id = $1 ORDER BY created_at, id",
                user,
            )
            pos = {r["id"]: k for k, r in enumerate(items)}
            state[f"u{n}.items"] = [
                (run.packages.index(r["package_id"]), *tuple(r.values())[2:]) for r in items
            ]
            row = await conn.fetchrow(
                "SELECT unbilled_upload, unbilled_download, has_access, seq "
                "FROM telecom.queue_users WHERE user_id = $1",
                user,
            )
            state[f"u{n}.user"] = tuple(row.values()) if row is not None else None
            row = await conn.fetchrow(
                "SELECT granted, item_id, package_id, remaining, expire_at IS NOT NULL, seq "
                "FROM telecom.access WHERE user_id = $1",
                user,
            )
            state[f"u{n}.access"] = (
                None
                if row is None
                else (
                    row["granted"],
                    pos.get(row["item_id"]) if row["item_id"] is not None else None,
                    None if row["package_id"] is None else run.packages.index(row["package_id"]),
                    *tuple(row.values())[3:],
                )
            )
            outbox = await conn.fetch(
                "SELECT route, seq, body, cancel_key IS NOT NULL AS timer, "
                "published_at IS NULL AS pending FROM telecom.outbox "
                "WHERE user_id = $1 ORDER BY id",
                user,
            )
            state[f"u{n}.outbox"] = [
                (r["route"], r["seq"], _normal_body(r["body"], index, pos, run), r[3], r[4])
                for r in outbox
            ]
            for name, query in ROWS.items():
                state[f"u{n}.{name}"] = [tuple(r.values()) for r in await conn.fetch(query, user)]
        inbox = await conn.fetch(
            "SELECT consumer, sent_as FROM telecom.inbox WHERE sent_as = ANY($1::uuid[]) "
            "ORDER BY consumer, sent_as",
            list(message_ids),
        )
        state["inbox"] = [tuple(r.values()) for r in inbox]
    return state


def differences(batched: dict[str, Any], alone: dict[str, Any]) -> str:
    return "\n".join(
        f"  {key}:\n    batched:      {batched[key]!r}\n    one at a time: {alone[key]!r}"
        for key in batched
        if batched[key] != alone[key]
    )
