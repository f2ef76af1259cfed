"""Seed 002 (rsqueue), its contract in its own words, checked on the real services.

- Addressed work: "If you attempt to push work with a duplicate address into the queue, you'll
  receive the error queue.ErrDuplicateAddressedPut." "PollAddress … when the addressed work item
  is removed from the queue (due to completion, deletion, or failure), a result (error or nil) is
  returned."
- Permits: "A permit has a heartbeat value that must be updated periodically. If a permit's
  heartbeat becomes stale, the permit will be canceled, and any work associated with the permit
  will become available for another worker to claim."
- Groups: "When the record count of queued work for the group id is zero (0), the group is
  considered complete, and the 'end' work is inserted into the queue." "If you push work flagged
  with QUEUE_GROUP_CANCEL … any remaining work for this queue group is immediately deleted … When
  the group is empty, we then push a QUEUE_GROUP_ABORT work item."

In pkgq an address is `publish(address=…)` and `wait()` / `pkgq wait`; a group is
`publish_group(…, on_complete=…, on_abort=…)`, `pkgq group cancel` and `pkgq grant`.

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
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from events.models import AdjustQuota, RecordUsage
from events.routes import QUOTA_ADJUST, USAGE_RECORD
from infra.jobs import DuplicateAddress, Jobs, end_message
from infra.postgres import workers
from infra.postgres.outbox import RELAY_LOCK_CLASS
from infra.rabbit.tap import Tap
from infra.route_config import RouteSettings
from infra.settings import Settings
from tests.conformance.jobs_support import BURY, Recorder, recording_pipeline, usage
from tests.support import pg_roles
from tests.support.deliveries import add_package, send
from tests.support.in_process import StartApp
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, cli

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
    hung_id = uuid4()
    user = uuid4()
    async with pool.acquire() as conn:
        await workers.register(conn, hung_id, "pkgq-relay@hung:1", "relay", "hung", 1)
        await conn.execute(
            "UPDATE telecom.workers SET heartbeat_at = now() - interval '1 hour' WHERE id = $1",
            hung_id,
        )
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
            listed = await workers_listed(settings)
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
        assert (await workers_listed(settings))[relay.proc.pid]["stop_reason"] == "exited"
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
    for i in range(12):
        sent.append(
            await send(
                settings,
                amqp,
                USAGE_RECORD,
                RecordUsage(user_id=users[i % 4], upload=10 + i, download=1),
            )
        )

    async def all_applied() -> bool:
        async with pool.acquire() as conn:
            n = await conn.fetchval(
                "SELECT count(*) FROM telecom.inbox "
                "WHERE consumer = $1 AND message_id = ANY($2::uuid[])",
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


async def test_a_duplicate_address_is_refused_while_queued_and_accepted_once_it_is_done(
    in_process: StartApp, settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    jobs = Jobs(pool)
    first = await jobs.publish(USAGE_RECORD, usage(uuid4(), 1), address="bill:42")
    with pytest.raises(DuplicateAddress) as refused:
        await jobs.publish(USAGE_RECORD, usage(uuid4(), 2), address="bill:42")
    assert refused.value.holder == first.message_id
    by_cli = await cli(
        settings, "publish", "usage_record", usage(uuid4(), 3).model_dump_json(),
        "--address", "bill:42",
    )  # fmt: skip
    assert by_cli.returncode == 4  # dropped or duplicate
    assert "duplicate address" in by_cli.stdout
    app = in_process(settings, pool, amqp)
    recorder = Recorder()
    await app.start_consumers(
        [USAGE_RECORD], pipelines={USAGE_RECORD.name: recording_pipeline(pool, recorder)}
    )
    await app.start_relay()
    assert (await jobs.wait("bill:42", timeout=20)).state == "done"
    again = await jobs.publish(USAGE_RECORD, usage(uuid4(), 4), address="bill:42")
    assert again.queued
    assert (await jobs.wait("bill:42", timeout=20)).message_id == again.message_id
    await app.close()
    assert recorder.applied == [first.message_id, again.message_id]


async def test_waiting_on_an_address_returns_done_or_failed_with_its_error(
    in_process: StartApp, settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    jobs = Jobs(pool)
    app = in_process(settings, pool, amqp)
    await app.start_consumers(
        [USAGE_RECORD], pipelines={USAGE_RECORD.name: recording_pipeline(pool, Recorder())}
    )
    await app.start_relay()
    await jobs.publish(USAGE_RECORD, usage(uuid4(), 1), address="ok")
    await jobs.publish(USAGE_RECORD, usage(uuid4(), BURY), address="doomed")
    await jobs.publish(USAGE_RECORD, usage(uuid4(), 1), address="later", delay=3600)
    done = await jobs.wait("ok", timeout=20)
    failed = await jobs.wait("doomed", timeout=20)
    ok_cli = await cli(settings, "wait", "ok", "--json")
    failed_cli = await cli(settings, "wait", "doomed")
    pending_cli = await cli(settings, "wait", "later", "--timeout", "1s")
    unknown_cli = await cli(settings, "wait", "never-published")
    await app.close()
    assert done.state == "done"
    assert done.error is None
    assert failed.state == "failed"
    assert failed.error is not None
    assert "needs_a_human" in failed.error
    assert ok_cli.returncode == 0
    assert json.loads(ok_cli.stdout)["state"] == "done"
    assert failed_cli.returncode == 1
    assert "needs_a_human" in failed_cli.stdout
    assert pending_cli.returncode == 5  # timeout
    assert unknown_cli.returncode == 3


# -- groups ------------------------------------------------------------------------------------


async def end_rows(pool: asyncpg.Pool, group_id: UUID, why: str) -> list[dict[str, Any]]:
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT message_id, route, published_at FROM telecom.outbox "
            "WHERE headers->>'x-pkgq-group-end' = $1",
            f"{group_id}:{why}",
        )
    return [dict(r) for r in rows]


async def test_a_groups_end_message_is_published_once_after_members_finish_concurrently(
    in_process: StartApp,
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    tap: Tap,
) -> None:
    lanes = RouteSettings(concurrency=4, batch_size=1)
    scoped = settings.model_copy(update={"route_settings": {USAGE_RECORD.name: lanes}})
    jobs = Jobs(pool)
    ops = uuid4()
    members = [usage(uuid4(), n) for n in range(24)]
    members[5] = usage(uuid4(), BURY)  # a failed member finishes too
    group = await jobs.publish_group(
        USAGE_RECORD,
        members,
        name="bulk",
        on_complete=end_message(QUOTA_ADJUST, AdjustQuota(user_id=ops, item_id=1, delta=1)),
    )
    recorder = Recorder(pause=0.05)
    app = in_process(scoped, pool, amqp)
    await app.start_consumers(
        [USAGE_RECORD], pipelines={USAGE_RECORD.name: recording_pipeline(pool, recorder)}
    )
    await app.start_relay()

    async def completed() -> bool:
        summary = await jobs.group(group.group_id)
        return summary is not None and summary["state"] == "completed"

    await eventually(completed, within=30)

    async def end_published() -> bool:
        return bool(tap.on(QUOTA_ADJUST.name))

    await eventually(end_published)
    await app.close()
    summary = await jobs.group(group.group_id)
    assert summary is not None
    assert (summary["total"], summary["done"], summary["failed"]) == (24, 23, 1)
    assert recorder.max_running > 1  # members really did finish concurrently
    (end,) = await end_rows(pool, group.group_id, "completed")
    assert end["message_id"] == summary["end_message_id"]
    assert [t.json()["user_id"] for t in tap.on(QUOTA_ADJUST.name)] == [str(ops)]


async def test_cancelling_a_group_deletes_queued_members_disarms_delivered_ones_and_aborts_once(
    in_process: StartApp, settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    jobs = Jobs(pool)
    ops = uuid4()
    group = await jobs.publish_group(
        USAGE_RECORD,
        [usage(uuid4(), n) for n in range(6)],
        name="to-cancel",
        delay=3600,
        on_abort=end_message(QUOTA_ADJUST, AdjustQuota(user_id=ops, item_id=1, delta=-1)),
    )
    delivered = group.message_ids[:3]
    async with pool.acquire() as conn:  # three of them fall due and reach the broker
        await conn.execute(
            "UPDATE telecom.outbox SET available_at = now() WHERE message_id = ANY($1::uuid[])",
            delivered,
        )
    recorder = Recorder()
    app = in_process(settings, pool, amqp)
    await app.start_relay()

    async def on_the_broker() -> bool:
        async with pool.acquire() as conn:
            published = await conn.fetchval(
                "SELECT count(*) FROM telecom.outbox WHERE message_id = ANY($1::uuid[]) "
                "AND published_at IS NOT NULL",
                delivered,
            )
        return int(published) == 3

    await eventually(on_the_broker)
    cancel = await cli(settings, "group", "cancel", str(group.group_id), "--yes")
    again = await cli(settings, "group", "cancel", str(group.group_id), "--yes")
    await app.start_consumers(
        [USAGE_RECORD], pipelines={USAGE_RECORD.name: recording_pipeline(pool, recorder)}
    )

    async def disarmed_ones_acked() -> bool:
        async with pool.acquire() as conn:
            claimed = await conn.fetchval(
                "SELECT count(*) FROM telecom.inbox WHERE message_id = ANY($1::uuid[])",
                delivered,
            )
        return int(claimed) == 3

    await eventually(disarmed_ones_acked)
    await app.close()
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert "3 unpublished member(s) deleted, 3 on the broker will be no-ops" in cancel.stdout
    assert again.returncode == 1
    assert "cancelled: nothing to cancel" in again.stdout
    assert recorder.started == []  # the delivered members were no-ops
    assert len(await end_rows(pool, group.group_id, "aborted")) == 1
    async with pool.acquire() as conn:
        left = await conn.fetchval(
            "SELECT count(*) FROM telecom.outbox WHERE message_id = ANY($1::uuid[])",
            group.message_ids[3:],
        )
        state = await conn.fetchval(
            "SELECT state FROM telecom.job_groups WHERE id = $1", group.group_id
        )
    assert left == 0
    assert state == "cancelled"


async def test_pkgq_grant_publishes_a_purchase_per_user_as_a_group_and_reports_completion(
    settings: Settings,
    pool: asyncpg.Pool,
    spawn: Callable[..., PkgqProcess],
    tmp_path: Path,
) -> None:
    package = await add_package(pool, 1000)
    users = [uuid4() for _ in range(5)]
    listing = tmp_path / "users.txt"
    listing.write_text("# bulk grant\n" + "\n".join(str(u) for u in users) + "\n")
    spawn("relay")
    spawn("run", "package_purchase", "--no-ingest")
    granted = await cli(
        settings, "grant", "--package", str(package), "--users", str(listing), "--timeout", "60s"
    )
    refused = await cli(
        settings, "grant", "--package", "999999", "--users", str(listing), "--timeout", "60s"
    )
    assert granted.returncode == 0, granted.stdout + granted.stderr
    assert "completed: 5 done, 0 failed" in granted.stdout
    assert refused.returncode == 1  # an unknown package breaks a domain rule for every member
    assert "completed: 0 done, 5 failed" in refused.stdout
    async with pool.acquire() as conn:
        queued = await conn.fetch(
            "SELECT user_id FROM telecom.package_queue WHERE package_id = $1", package
        )
    assert sorted(r["user_id"] for r in queued) == sorted(users)
