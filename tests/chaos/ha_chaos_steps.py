"""The steps of the chaos test on the replicated profile (tests/chaos/test_ha_chaos.py): the
pkgq processes it runs on the HA lab, a foreign client's at-least-once publishing, the probe that
times how soon pkgq resumes after an outage, the tap that keeps every lifecycle event, and the
checks of the end: every broker dead letter filed once, each user's events in order."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter, defaultdict
from typing import Any
from uuid import UUID, uuid4

import aio_pika
import asyncpg
from aio_pika.abc import AbstractRobustConnection

from consumers import publishing
from events.envelope import H_SEQ
from events.models import AdjustQuota, PurchasePackage, WireModel
from events.routes import (
    ALL_EXPIRED,
    PACKAGE_ACTIVATE,
    PACKAGE_EXPIRING,
    PACKAGE_PURCHASE,
    PACKAGE_QUEUING,
    QUOTA_ADJUST,
    USAGE_RECORD,
    Route,
)
from infra.rabbit.topology import routing_key_for
from infra.settings import Settings
from tests.support.ha_lab import Lab
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, pkgq

LIFECYCLE = (PACKAGE_QUEUING, PACKAGE_ACTIVATE, PACKAGE_EXPIRING, ALL_EXPIRED)


class Chaos:
    """The lab, the test's namespace on it, and the pkgq processes it runs."""

    def __init__(self, the_lab: Lab, ns: str) -> None:
        self.lab = the_lab
        self.database = ns
        self.settings = Settings(
            postgres_dsn=the_lab.dsn(ns, "postgres"),
            migrate_dsn=the_lab.dsn(ns, "pkgq_owner"),
            runtime_role="pkgq_runtime",
            amqp_url=the_lab.amqp_nodes,
            exchange=f"{ns}.telecom",
            queue_prefix=f"{ns}.pkgq",
            queue_type="quorum",
            # A partition map of its own, so that its first `pkgq migrate` records it rather than
            # a new deployment's default (16 for usage and purchase): this lab runs every route
            # on one queue, as the foreign client here publishes.
            partitions={USAGE_RECORD.name: 1},
        )
        self.processes: list[PkgqProcess] = []
        self.resumed: dict[str, list[dict[str, float]]] = defaultdict(list)

    def env(self) -> dict[str, str]:
        return {
            "PKGQ_POSTGRES_DSN": self.lab.dsn(self.database, "pkgq_runtime"),
            "PKGQ_MANAGEMENT_URL": self.lab.management,
            "PKGQ_QUEUE_TYPE": "quorum",
            "PKGQ_RELAY_POLL_INTERVAL": "0.5",
            "PKGQ_STARTUP_WAIT": "120",
        }

    def spawn(self, *args: str, **env: str) -> PkgqProcess:
        process = PkgqProcess(self.settings, *args, **{**self.env(), **env})
        self.processes.append(process)
        return process

    async def migrate(self) -> None:
        done = await asyncio.to_thread(pkgq, self.settings, "migrate", **self.env())
        assert done.returncode == 0, done.stdout + done.stderr


async def _send(
    settings: Settings, amqp: AbstractRobustConnection, route: Route, body: WireModel, mid: UUID
) -> None:
    """A foreign publisher's at-least-once publish: confirmed, else retried with the same
    message_id (a nack or a lost connection while a node dies says nothing about the message)."""
    for attempt in range(240):
        try:
            await publishing.publish(settings, amqp, route, body, message_id=mid)
        except Exception:
            if attempt == 239:
                raise
            await asyncio.sleep(0.25)
        else:
            return


async def _expiring(settings: Settings, amqp: AbstractRobustConnection, n: int) -> set[str]:
    """n quota adjustments with a 1.5 s TTL on a queue no one consumes: the broker dead-letters
    them while the node about to be killed is down."""
    sent: set[str] = set()
    key = routing_key_for(settings, QUOTA_ADJUST.name, None)
    while len(sent) < n:
        mid = str(uuid4())
        body = AdjustQuota(user_id=uuid4(), item_id=1, delta=1).model_dump_json().encode()
        for _ in range(120):
            try:
                channel = await amqp.channel()
                exchange = await channel.get_exchange(settings.exchange)
                await exchange.publish(
                    aio_pika.Message(body, message_id=mid, expiration=1.5, user_id="guest"), key
                )
                await channel.close()
                break
            except Exception:  # noqa: BLE001
                await asyncio.sleep(0.25)
        sent.add(mid)
    return sent


async def _count(pool: asyncpg.Pool, sql: str, *args: Any) -> int | None:
    try:
        async with pool.acquire(timeout=2) as conn:
            value: int = await conn.fetchval(sql, *args, timeout=2)
            return value
    except Exception:  # noqa: BLE001  (Postgres is failing over: not known yet)
        return None


async def _resume_times(
    chaos: Chaos, pool: asyncpg.Pool, amqp: AbstractRobustConnection, package: int
) -> dict[str, float]:
    """Seconds from now until a probe purchase is applied (consumers) and its lifecycle events
    are published (relay)."""
    start = time.monotonic()
    user = uuid4()
    await _send(
        chaos.settings,
        amqp,
        PACKAGE_PURCHASE,
        PurchasePackage(user_id=user, package_id=package),
        uuid4(),
    )

    async def applied() -> bool:
        sql = "SELECT count(*) FROM telecom.package_queue WHERE user_id = $1"
        return bool(await _count(pool, sql, user))

    async def published() -> bool:
        sql = "SELECT count(*) FROM telecom.outbox WHERE user_id = $1 AND published_at IS NOT NULL"
        return bool(await _count(pool, sql, user))

    await eventually(applied, within=180, every=0.2)
    consumers = time.monotonic() - start
    await eventually(published, within=180, every=0.2)
    return {"consumers_s": round(consumers, 1), "relay_s": round(time.monotonic() - start, 1)}


async def _tap(amqp: AbstractRobustConnection, settings: Settings) -> str:
    """A quorum queue of the test's own that keeps every lifecycle event, to check order."""
    channel = await amqp.channel()
    name = f"{settings.queue_prefix}.chaos-tap"
    queue = await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
    for route in LIFECYCLE:
        await queue.bind(settings.exchange, routing_key=f"{route.name}.#")
    await channel.close()
    return name


async def _tapped(amqp: AbstractRobustConnection, name: str) -> list[tuple[str, str, int]]:
    """(user, route, seq) of every tapped event, in queue order, once no more arrive."""
    found: list[tuple[str, str, int]] = []
    channel = await amqp.channel()
    queue = await channel.declare_queue(name, passive=True)
    async with queue.iterator() as messages:
        while True:
            try:
                message = await asyncio.wait_for(messages.__anext__(), timeout=3)
            except TimeoutError:
                break
            body = json.loads(message.body)
            seq = message.headers[H_SEQ]
            assert isinstance(seq, int)
            found.append((str(body["user_id"]), message.routing_key or "", seq))
            await message.ack()
    await queue.delete(if_unused=False, if_empty=False)
    await channel.close()
    return found


def _interleaved(
    usage: list[tuple[UUID, tuple[int, int]]], rng: random.Random
) -> list[tuple[UUID, tuple[int, int]]]:
    """Users interleaved at random, each user's own records in order."""
    lists: dict[UUID, list[tuple[int, int]]] = defaultdict(list)
    for user, record in usage:
        lists[user].append(record)
    out = []
    while lists:
        user = rng.choice(list(lists))
        out.append((user, lists[user].pop(0)))
        if not lists[user]:
            del lists[user]
    return out


async def _victim(the_lab: Lab, settings: Settings, killed: list[int]) -> int:
    """The node leading the dead-letter queue, unless killed before; else the one leading most
    of the test's queues among those not killed yet."""
    leaders = await the_lab.leaders(f"{settings.queue_prefix}.")
    dead_letters = leaders.get(settings.dead_letter_queue)
    if dead_letters is not None and dead_letters not in killed:
        return dead_letters
    for node, _ in Counter(leaders.values()).most_common():
        if node not in killed:
            return node
    return next(n for n in (1, 2, 3) if n not in killed[-1:])


async def _all_dead_letters_filed_once(
    pool: asyncpg.Pool, expected: set[str], the_lab: Lab, settings: Settings
) -> None:
    """Every broker dead letter is filed, once. The broker re-sends one whose confirm was lost
    with a node after the lab's dead_letter_worker_publisher_confirm_timeout (15 s,
    deploy/rabbitmq/advanced.config), so two minutes is ample; a miss names what is missing and
    what the broker's queues hold."""

    async def filed() -> bool:
        return await _count(
            pool,
            "SELECT count(DISTINCT message_id) FROM telecom.dead_letters "
            "WHERE message_id = ANY($1::text[])",
            list(expected),
        ) == len(expected)

    try:
        await eventually(filed, within=120, every=0.5)
    except AssertionError:
        async with pool.acquire() as conn:
            found = await conn.fetch(
                "SELECT message_id FROM telecom.dead_letters WHERE message_id = ANY($1::text[])",
                list(expected),
            )
        missing = sorted(expected - {r["message_id"] for r in found})
        try:
            queues: Any = await the_lab.queue_states(f"{settings.queue_prefix}.")
        except Exception as exc:  # noqa: BLE001  (the miss is the news, not the listing)
            queues = f"not listed: {exc!r}"
        raise AssertionError(
            f"{len(missing)} of {len(expected)} broker dead letters not filed in 120 s: "
            f"{missing}; the broker's queues: {queues}"
        ) from None
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT message_id, count(*) AS n, min(reason) AS reason FROM telecom.dead_letters "
            "WHERE message_id = ANY($1::text[]) GROUP BY message_id",
            list(expected),
        )
    assert {r["message_id"] for r in rows} == expected
    assert all(r["n"] == 1 for r in rows), [dict(r) for r in rows if r["n"] != 1]
    assert {r["reason"] for r in rows} == {"expired"}


def _each_users_events_in_order(events: list[tuple[str, str, int]]) -> None:
    """Per user, the first copy of each event comes in sequence order (a redelivered copy may
    follow, and the consumers' inbox drops it)."""
    assert events, "no lifecycle event was tapped"
    seen: dict[str, list[int]] = defaultdict(list)
    for user, _, seq in events:
        if seq not in seen[user]:
            seen[user].append(seq)
    for user, seqs in seen.items():
        assert seqs == sorted(seqs), (user, seqs)
