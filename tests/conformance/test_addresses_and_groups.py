"""rsqueue's addresses and groups, its contract in its own words, checked on the real services.

- Addressed work: "If you attempt to push work with a duplicate address into the queue, you'll
  receive the error queue.ErrDuplicateAddressedPut." "PollAddress … when the addressed work item
  is removed from the queue (due to completion, deletion, or failure), a result (error or nil) is
  returned."
- Groups: "When the record count of queued work for the group id is zero (0), the group is
  considered complete, and the 'end' work is inserted into the queue." "If you push work flagged
  with QUEUE_GROUP_CANCEL … any remaining work for this queue group is immediately deleted … When
  the group is empty, we then push a QUEUE_GROUP_ABORT work item."

In pkgq an address is `publish(address=…)` and `wait()` / `pkgq wait`; a group is
`publish_group(…, on_complete=…, on_abort=…)`, `pkgq group cancel` and `pkgq grant`.
Permits (heartbeats, takeover) are in test_worker_permits.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from events.models import AdjustQuota
from events.routes import QUOTA_ADJUST, USAGE_RECORD
from infra.jobs import DuplicateAddress, Jobs, end_message
from infra.rabbit.tap import Tap
from infra.route_config import RouteSettings
from infra.settings import Settings
from tests.conformance.jobs_support import BURY, Recorder, recording_pipeline, usage
from tests.support.deliveries import add_package
from tests.support.in_process import StartApp
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, cli

pytestmark = pytest.mark.e2e


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
                "SELECT count(*) FROM telecom.inbox WHERE sent_as = ANY($1::uuid[])",
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
