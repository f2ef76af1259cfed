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
from collections.abc import AsyncIterator
from pathlib import Path
from uuid import uuid4

import pytest

from events.models import PurchasePackage, RecordUsage
from events.routes import PACKAGE_PURCHASE, QUOTA_ADJUST, ROUTES, USAGE_RECORD
from infra.postgres.pool import create_pool
from infra.rabbit.connection import connect
from infra.rabbit.topology import declare_all
from tests.chaos.ha_chaos_steps import (
    Chaos,
    _all_dead_letters_filed_once,
    _each_users_events_in_order,
    _expiring,
    _interleaved,
    _resume_times,
    _send,
    _tap,
    _tapped,
    _victim,
)
from tests.e2e.workload import Workload
from tests.support.deliveries import add_package
from tests.support.ha_lab import Lab, lab
from tests.support.processes import pkgq

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

USERS = int(os.environ.get("PKGQ_CHAOS_USERS", "8"))
NODE_KILLS = int(os.environ.get("PKGQ_CHAOS_NODE_KILLS", "2"))
EXPIRING = int(os.environ.get("PKGQ_CHAOS_EXPIRING", "10"))
"""Commands published with a short TTL to a queue nobody consumes, before each node kill."""
CONSUMED = [r.short_name for r in ROUTES.values() if r is not QUOTA_ADJUST]
"""quota_adjust has no consumer here: its expired messages are the broker's dead letters."""


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
