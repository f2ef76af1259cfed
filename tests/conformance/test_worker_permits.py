"""rsqueue's permits, in its own words, checked on the real services: "A permit
has a heartbeat value that must be updated periodically. If a permit's heartbeat becomes stale,
the permit will be canceled, and any work associated with the permit will become available for
another worker to claim."

A permit is a row in telecom.workers that its process heartbeats. What a worker can claim, and
how a stale worker loses it:
- a relay's partition lease (a transaction-scoped advisory lock) and claimed rows (row locks of
  an open transaction): a live peer reaps the stale worker and terminates its Postgres backends
  (they carry `application_name = 'pkgq:<worker id>'`), which ends both;
- deliveries a consumer holds unacknowledged: the broker's AMQP heartbeat closes the stale
  connection, the deliveries are requeued and go to the standby replica (single active consumer).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.postgres import workers
from infra.postgres.outbox import RELAY_LOCK_CLASS
from infra.rabbit.tap import Tap
from infra.settings import Settings
from tests.support import pg_roles
from tests.support.deliveries import Sending
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, cli
from tests.support.workers import stale_worker

pytestmark = pytest.mark.e2e

FAST_PERMITS = {"PKGQ_HEARTBEAT_INTERVAL": "0.3", "PKGQ_WORKER_STALE_AFTER": "3"}
"""Heartbeats every 0.3 s, stale after 3 s: the same rules as the defaults, sooner."""


async def wait_logged(process: PkgqProcess, event: str, within: float = 30) -> None:
    async def logged() -> bool:
        return f'"event": "{event}"' in process.logs()

    logged.__qualname__ = f"{' '.join(process.args)} logged {event}"
    await eventually(logged, within=within)


async def workers_listed(settings: Settings) -> dict[int, dict[str, Any]]:
    """`pkgq workers --all --json`, by pid (the latest row of a pid)."""
    result = await cli(settings, "workers", "--all", "--json")
    assert result.returncode == 0, result.stderr
    listed: list[dict[str, Any]] = json.loads(result.stdout)
    by_pid: dict[int, dict[str, Any]] = {}
    for w in sorted(listed, key=lambda w: str(w["started_at"])):
        by_pid[int(w["pid"])] = w
    return by_pid


async def test_a_stale_relays_partition_lease_is_taken_over_and_its_rows_are_published(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, tap: Tap
) -> None:
    # A relay that hung in the middle of a round: registered, heartbeat long gone, and one of its
    # connections still in the round's transaction, holding the lease of a user's partition.
    hung_id = await stale_worker(pool, "pkgq-relay@hung:1", "relay", "hung", 1)
    user = uuid4()
    async with pool.acquire() as conn:
        partition = await conn.fetchval(
            "SELECT (hashtextextended($1::text, 0) & 63)::int", str(user)
        )
    hung = await asyncpg.connect(
        pg_roles.as_role(settings.postgres_dsn, pg_roles.RUNTIME),  # as a real relay connects
        server_settings={"application_name": workers.application_name(hung_id)},
    )
    try:
        await hung.execute("BEGIN")
        await hung.execute("SELECT pg_advisory_xact_lock($1, $2)", RELAY_LOCK_CLASS, partition)
        message_id = uuid4()
        body = RecordUsage(user_id=user, upload=1, download=2).model_dump_json().encode()
        async with pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO telecom.outbox (message_id, route, message_type, schema_version, "
                "user_id, body) VALUES ($1, $2, $3, $4, $5, $6)",
                message_id,
                USAGE_RECORD.name,
                USAGE_RECORD.message_type,
                USAGE_RECORD.schema_version,
                user,
                body,
            )
            assert (
                await conn.fetchval(
                    "SELECT partition FROM telecom.outbox WHERE message_id = $1", message_id
                )
                == partition
            )

        relay = PkgqProcess(settings, "relay", **FAST_PERMITS)
        try:

            async def published_at_recorded() -> datetime | None:
                async with pool.acquire() as conn:
                    found: datetime | None = await conn.fetchval(
                        "SELECT published_at FROM telecom.outbox WHERE message_id = $1",
                        message_id,
                    )
                return found

            async def published() -> bool:
                # On the broker, and marked published (the relay commits that after the
                # confirm, so the tap can see the message first).
                seen = any(m.message_id == str(message_id) for m in tap.seen)
                return seen and await published_at_recorded() is not None

            await eventually(published, within=60)
            published_at = await published_at_recorded()
            assert published_at is not None

            # The reaper ends the hung backend (which frees the lease at once) inside the
            # transaction that marks the worker stopped, and commits just after: the row can
            # be published before that commit is seen.
            listed: dict[int, dict[str, Any]] = {}

            async def reap_recorded() -> bool:
                listed.update(await workers_listed(settings))
                return bool(listed[1]["state"] == "stopped")

            await eventually(reap_recorded, within=30, every=0.5)  # a `pkgq workers` each
            the_hung = listed[1]
            the_relay = listed[relay.proc.pid]
            assert the_hung["id"] == str(hung_id)
            assert the_hung["state"] == "stopped"
            assert the_hung["stop_reason"].startswith("stale: no heartbeat for ")
            assert the_hung["stop_reason"].endswith(f"reaped by {the_relay['name']}")
            # Published only once the stale permit was cancelled, never while it was held.
            assert published_at >= datetime.fromisoformat(the_hung["stopped_at"])
            assert the_relay["state"] == "alive"
            assert the_relay["role"] == "relay"
            assert '"event": "worker_reaped"' in relay.logs()
            with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError)):
                await hung.fetchval("SELECT 1")  # its transaction was ended with its backend
        finally:
            assert relay.terminate() == 0, relay.logs()
        # Its logs say why, should its stop not have been recorded (worker_stop_not_recorded).
        stopped = (await workers_listed(settings))[relay.proc.pid]
        assert stopped["stop_reason"] == "exited", (stopped, relay.logs())
    finally:
        if not hung.is_closed():
            hung.terminate()


async def test_a_consumer_stopped_while_holding_deliveries_has_its_work_taken_over(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    env = {
        **FAST_PERMITS,
        # The broker closes a connection that misses its AMQP heartbeats (2 s): a frozen
        # consumer's unacknowledged deliveries are then requeued.
        "PKGQ_AMQP_URL": f"{settings.amqp_url}?heartbeat=2",
    }
    active = spawn("run", "usage_record", "--no-ingest", **env)
    await wait_logged(active, "ready")
    standby = spawn("run", "usage_record", "--no-ingest", **env)  # subscribes second: waits
    await wait_logged(standby, "ready")

    os.kill(active.proc.pid, signal.SIGSTOP)  # frozen: no heartbeat of either kind, no acks
    users = [uuid4() for _ in range(4)]
    sent: list[UUID] = []
    async with Sending(settings, amqp) as sending:
        for i in range(12):
            body = RecordUsage(user_id=users[i % 4], upload=10 + i, download=1)
            sent.append(await sending.send(USAGE_RECORD, body))

    async def all_applied() -> bool:
        async with pool.acquire() as conn:
            n = await conn.fetchval(
                "SELECT count(*) FROM telecom.inbox "
                "WHERE consumer = $1 AND sent_as = ANY($2::uuid[])",
                USAGE_RECORD.short_name,
                sent,
            )
        return bool(n == len(sent))

    # The frozen process cannot apply anything: whatever is applied, the standby applied.
    await eventually(all_applied, within=90, every=0.3)

    async def active_reaped() -> bool:
        return bool((await workers_listed(settings))[active.proc.pid]["state"] == "stopped")

    await eventually(active_reaped, within=30, every=0.5)
    listed = await workers_listed(settings)
    assert listed[active.proc.pid]["stop_reason"].startswith("stale: no heartbeat for ")
    assert listed[standby.proc.pid]["state"] == "alive"

    # Thawed, the old process finds its permit cancelled, registers again, and applies nothing
    # twice: its deliveries were requeued, and the inbox refuses what the standby applied.
    os.kill(active.proc.pid, signal.SIGCONT)
    await wait_logged(active, "worker_reregistered")
    active.terminate()
    standby.terminate()
    async with pool.acquire() as conn:
        totals = {
            r["user_id"]: (r["unbilled_upload"], r["unbilled_download"])
            for r in await conn.fetch(
                "SELECT user_id, unbilled_upload, unbilled_download FROM telecom.queue_users "
                "WHERE user_id = ANY($1::uuid[])",
                users,
            )
        }
    expected = {u: (sum(10 + i for i in range(12) if i % 4 == k), 3) for k, u in enumerate(users)}
    assert totals == expected


# -- addressed work ----------------------------------------------------------------------------
