"""Chaos on the replicated profile: real `pkgq run` and `pkgq relay` processes on a 3-node
RabbitMQ cluster (quorum queues; the consumers on the node list, the relay through haproxy as
through a Kubernetes Service) and a PostgreSQL primary with a synchronous
standby (a multi-host DSN), with a foreign client's traffic flowing, while:
1. the RabbitMQ node leading the dead-letter queue is SIGKILLed and brought back, then another
   node, with messages being dead-lettered by the broker (TTL) during each outage;
2. the PostgreSQL primary crashes, a fresh pkgq process starts while no primary answers, and
   the standby is promoted;
3. pkgq processes are SIGKILLed meanwhile.
Afterwards: no command lost or applied twice (the end state is the reference model's, traffic
conserved), at most one active item per user and FIFO activation (`pkgq doctor`), each user's
lifecycle events in order, and every broker dead letter filed exactly once.

Small by default (CI); scale up with PKGQ_CHAOS_USERS, PKGQ_CHAOS_NODE_KILLS and
PKGQ_CHAOS_EXPIRING. The resume times are printed and written to $PKGQ_CHAOS_REPORT if set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import aio_pika
import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from consumers import publishing
from events.envelope import H_SEQ
from events.models import AdjustQuota, PurchasePackage, RecordUsage, WireModel
from events.routes import (
    ALL_EXPIRED,
    PACKAGE_ACTIVATE,
    PACKAGE_EXPIRING,
    PACKAGE_PURCHASE,
    PACKAGE_QUEUING,
    QUOTA_ADJUST,
    ROUTES,
    USAGE_RECORD,
    Route,
)
from infra.postgres.pool import create_pool
from infra.rabbit.connection import connect
from infra.rabbit.topology import declare_all, routing_key_for
from infra.settings import Settings
from tests.e2e.workload import Workload
from tests.support.deliveries import add_package
from tests.support.ha_lab import Lab, lab
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, pkgq

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

USERS = int(os.environ.get("PKGQ_CHAOS_USERS", "8"))
NODE_KILLS = int(os.environ.get("PKGQ_CHAOS_NODE_KILLS", "2"))
EXPIRING = int(os.environ.get("PKGQ_CHAOS_EXPIRING", "10"))
"""Commands published with a short TTL to a queue nobody consumes, before each node kill."""
LIFECYCLE = (PACKAGE_QUEUING, PACKAGE_ACTIVATE, PACKAGE_EXPIRING, ALL_EXPIRED)
CONSUMED = [r.short_name for r in ROUTES.values() if r is not QUOTA_ADJUST]
"""quota_adjust has no consumer here: its expired messages are the broker's dead letters."""


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


@pytest.fixture
async def chaos(the_lab: Lab, namespace: str, tmp_path: Path) -> AsyncIterator[Chaos]:
    chaos = Chaos(the_lab, namespace)
    await chaos.migrate()
    yield chaos
    for i, process in enumerate(chaos.processes):
        if process.proc.poll() is None:
            process.kill()
        (tmp_path / f"{i:02d}-{process.args[0]}.log").write_text(process.logs())
    print(f"chaos: the pkgq processes' logs are in {tmp_path}")
    # A test that failed midway may have left a node down or no primary: repair the lab (up
    # restarts what is stopped and rebuilds a stale standby) for the tests after it.
    await asyncio.to_thread(Lab.up)


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


@pytest.mark.timeout(300 + 10 * USERS + 60 * NODE_KILLS)  # scaled up, it takes longer
async def test_node_kills_a_postgres_failover_and_killed_processes_lose_and_double_nothing(
    chaos: Chaos,
) -> None:
    settings = chaos.settings
    pool = await create_pool(settings.postgres_dsn, min_size=1, max_size=4)
    amqp = await connect(settings.amqp_url, "pkgq-chaos-client")  # the foreign client
    rng = random.Random(23)
    sender: asyncio.Task[None] | None = None
    try:
        workload = await Workload.create(pool, seed=23, users=USERS)
        probe_package = await add_package(pool, 10_000)
        channel = await amqp.channel()
        await declare_all(channel, settings)  # provisioned first, as an operator does
        await channel.close()
        tap = await _tap(amqp, settings)
        # The relay reaches the cluster through haproxy (as through a Kubernetes Service), the
        # consumers through the node list: both ways of finding a live node are under test.
        relay = chaos.spawn("relay", PKGQ_AMQP_URL=chaos.lab.amqp_lb)
        consumers = chaos.spawn("run", *CONSUMED, "--ingest")
        for plan in workload.plans:
            for package, amount in plan.purchases:
                body = PurchasePackage(user_id=plan.user, package_id=package, amount=amount)
                await _send(settings, amqp, PACKAGE_PURCHASE, body, uuid4())
        await workload.wait_all_queued(pool, within=120)

        # Usage flows, paced, through all the chaos below.
        usage = [(p.user, u) for p in workload.plans for u in p.usages]
        order = _interleaved(usage, rng)

        async def send_usage() -> None:
            for user, (up, down) in order:
                body = RecordUsage(user_id=user, upload=up, download=down)
                await _send(settings, amqp, USAGE_RECORD, body, uuid4())
                await asyncio.sleep(0.05)

        sender = asyncio.create_task(send_usage())
        expected_dead: set[str] = set()
        killed: list[int] = []
        for round_ in range(NODE_KILLS):
            victim = await _victim(chaos.lab, settings, killed)
            expected_dead |= await _expiring(settings, amqp, EXPIRING)
            await lab("rabbit-kill", str(victim))
            killed.append(victim)
            for process in (relay, consumers):  # each rode out the node losses so far
                assert process.proc.poll() is None, process.logs()[-3000:]
            if round_ == 0:
                consumers.kill()  # and a pkgq process dies meanwhile
                consumers = chaos.spawn("run", *CONSUMED, "--ingest")
            chaos.resumed[f"rabbit node {victim} killed"].append(
                await _resume_times(chaos, pool, amqp, probe_package)
            )
            await asyncio.sleep(2)  # the expired ones are dead-lettered while it is down
            await lab("rabbit-start", str(victim))

        # PostgreSQL: the primary crashes; a fresh pkgq process starts while none answers.
        await lab("pg-crash")
        assert relay.proc.poll() is None, relay.logs()[-3000:]
        relay.kill()
        relay = chaos.spawn("relay", PKGQ_AMQP_URL=chaos.lab.amqp_lb)
        await asyncio.sleep(3)
        await lab("pg-promote")
        chaos.resumed["postgres primary crashed, standby promoted"].append(
            await _resume_times(chaos, pool, amqp, probe_package)
        )
        await lab("pg-rebuild-standby")

        await asyncio.wait_for(sender, timeout=300)
        await workload.wait_end_state(pool, within=180)
        await _all_dead_letters_filed_once(pool, expected_dead, chaos.lab, settings)
        events = await _tapped(amqp, tap)
        _each_users_events_in_order(events)
        doctor = await asyncio.to_thread(pkgq, settings, "doctor", **chaos.env())
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        for process in (consumers, relay):
            assert process.proc.poll() is None, process.logs()[-3000:]
            assert process.terminate() == 0, process.logs()[-3000:]
    finally:
        if sender is not None and not sender.done():
            sender.cancel()  # the test failed midway: stop publishing
            with contextlib.suppress(BaseException):
                await sender
        await amqp.close()
        await pool.close()
    report = {
        "users": USERS,
        "node_kills": NODE_KILLS,
        "postgres_failovers": 1,
        "purchases": sum(len(p.purchases) for p in workload.plans),
        "usage_records": len(order),
        "broker_dead_letters": len(expected_dead),
        "lifecycle_events_tapped": len(events),
        "resumed": chaos.resumed,
    }
    print("chaos:", json.dumps(report))
    if os.environ.get("PKGQ_CHAOS_REPORT"):
        await asyncio.to_thread(
            Path(os.environ["PKGQ_CHAOS_REPORT"]).write_text, json.dumps(report, indent=2)
        )


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
