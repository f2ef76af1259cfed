"""A rolling upgrade: the previous release's `pkgq relay` and `pkgq run` (its commit checked out
as a git worktree, run by a virtualenv of its own) work on the newest schema, first alone, then
beside this release's processes, then this release alone, as pods are replaced one by one.

Every route is split into two partitions, and the two releases' consumers are replicas 0/2 and
1/2, so while both run, both apply messages (each owns a partition; a route's queues are
single-active-consumer). The previous release's pods are stopped while messages are still on
their way, so this release takes over their partitions mid-stream. Every user's lifecycle ends
exactly as on one release, each message applied once, and nothing is buried.

Expand, then contract: the newest schema only adds to the previous release's, so its SQL runs
unchanged; the message formats it writes (version N-1) are still applied here.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from events.envelope import H_SCHEMA_VERSION, H_USER_ID
from events.models import PurchasePackage
from events.routes import PACKAGE_PURCHASE, ROUTES, USAGE_RECORD
from infra.rabbit.connection import connect
from infra.rabbit.management import queue_figures
from infra.rabbit.publisher import Publisher, build_message
from infra.rabbit.topology import declare_all, delete_all, route_queues, routing_key_for
from infra.settings import Settings
from tests.support import releases
from tests.support.deliveries import Sending, add_package
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess

pytestmark = [pytest.mark.e2e, pytest.mark.serial]

PACKAGES = 3
TRAFFIC = 100


@pytest.fixture(scope="module")
def previous() -> Iterator[tuple[str, Path]]:
    """(git ref, python) of the previous release, checked out and ready to run."""
    ref = releases.previous_release()
    root = Path(tempfile.mkdtemp(prefix="pkgq-previous-release-"))
    worktree = releases.checkout(ref, root / "code")
    try:
        yield ref, releases.venv_for(worktree, root / "venv")
    finally:
        releases.remove(worktree)
        subprocess.run(["rm", "-rf", str(root)], check=False)


@pytest.fixture
async def parted(settings: Settings, amqp: AbstractRobustConnection) -> AsyncIterator[Settings]:
    """The test's namespace with every route in two partitions (removed at the end)."""
    two = settings.model_copy(update={"partitions": dict.fromkeys(ROUTES, 2), "standby_delay": 1.0})
    channel = await amqp.channel()
    await declare_all(channel, two)
    await channel.close()
    yield two
    connection = await connect(two.amqp_url, "pkgq-test-cleanup")
    try:
        await delete_all(await connection.channel(), two)
    finally:
        await connection.close()


def imported_from(python: Path) -> Path:
    """Where `python` imports pkgq's code from."""
    seen = subprocess.run(
        [str(python), "-c", "import events.routes as r; print(r.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    ).stdout.strip()
    return Path(seen)


class Pods:
    """The processes of both releases, stopped at the end whatever happens."""

    def __init__(self, settings: Settings, python: Path) -> None:
        self.settings = settings
        self.python = python
        self.started: list[PkgqProcess] = []

    def start(self, *args: str, old: bool) -> PkgqProcess:
        if old:
            # PYTHONSAFEPATH: the working directory (this checkout) is not put first on the path.
            process = PkgqProcess(self.settings, *args, python=str(self.python), PYTHONSAFEPATH="1")
        else:
            process = PkgqProcess(self.settings, *args)
        self.started.append(process)
        return process

    def logs(self) -> str:
        return "\n".join(f"--- {p.args}:\n{p.logs()[-3000:]}" for p in self.started)

    def lines_about(self, needles: list[str]) -> str:
        """Every line of every process's log that names one of `needles`."""
        return "\n".join(
            f"{p.args}: {line}"
            for p in self.started
            for line in p.logs().splitlines()
            if any(needle in line for needle in needles)
        )

    def stop_all(self) -> None:
        for process in self.started:
            try:
                process.terminate(timeout=20)
            except Exception:  # noqa: BLE001  (teardown must stop the rest)
                process.kill()


async def usage_v1(settings: Settings, amqp: AbstractRobustConnection, users: list[UUID]) -> None:
    """One usage record per user as the previous release's publishers write it (version 1),
    to the user's partition."""
    publisher = await Publisher.open(amqp, settings.exchange, user_id=settings.amqp_user)
    try:
        for user in users:
            body = json.dumps({"user_id": str(user), "upload": TRAFFIC, "download": 0})
            message = build_message(
                body.encode(),
                message_id=uuid4(),
                message_type=USAGE_RECORD.message_type,
                headers={H_SCHEMA_VERSION: 1, H_USER_ID: str(user)},
            )
            await publisher.publish(message, routing_key_for(settings, USAGE_RECORD.name, user))
    finally:
        await publisher.close()


async def finished(pool: asyncpg.Pool, users: list[UUID]) -> int:
    async with pool.acquire() as conn:
        count: int = await conn.fetchval(
            "SELECT count(*) FROM telecom.queue_users WHERE user_id = ANY($1::uuid[]) "
            "AND NOT has_access AND user_id IN (SELECT user_id FROM telecom.package_queue "
            "GROUP BY user_id HAVING count(*) FILTER (WHERE status = 'consumed') = $2)",
            users,
            PACKAGES,
        )
    return count


async def applied(pool: asyncpg.Pool, consumer: str) -> int:
    async with pool.acquire() as conn:
        count: int = await conn.fetchval(
            "SELECT count(*) FROM telecom.inbox WHERE consumer = $1", consumer
        )
    return count


async def start_lifecycles(
    settings: Settings,
    amqp: AbstractRobustConnection,
    pool: asyncpg.Pool,
    package: int,
    users: list[UUID],
) -> None:
    """Each user buys PACKAGES items, and the purchases are applied before this returns.

    Usage records are sent only then: the broker keeps no order between routes, and traffic
    applied before a user's purchase is kept as unbilled, then billed whole to the first item
    activated (domain/queue.py), which it would use up with room to spare, so a record of that
    traffic would no longer use up one item each (the cause of this test's stalls, seen twice).
    """
    async with Sending(settings, amqp) as sending:
        for user in users:
            body = PurchasePackage(user_id=user, package_id=package, amount=PACKAGES)
            await sending.send(PACKAGE_PURCHASE, body)

    async def purchased() -> bool:
        async with pool.acquire() as conn:
            count: int = await conn.fetchval(
                "SELECT count(DISTINCT user_id) FROM telecom.package_queue "
                "WHERE user_id = ANY($1::uuid[])",
                users,
            )
        return count == len(users)

    await eventually(purchased, within=60)


async def wait_finished(pool: asyncpg.Pool, users: list[UUID], pods: Pods) -> None:
    async def done() -> bool:
        return await finished(pool, users) == len(users)

    try:
        await eventually(done, within=90)
    except AssertionError as exc:
        stands, stuck = await _where_it_stands(pool, pods.settings, users)
        said = pods.lines_about([str(user) for user in stuck])
        raise AssertionError(f"{exc}\n{stands}\n{pods.logs()}\n{said}") from None


async def _where_it_stands(
    pool: asyncpg.Pool, settings: Settings, users: list[UUID]
) -> tuple[str, list[UUID]]:
    """For a stalled run: the database's busy sessions and what they wait on, the outbox rows
    not yet published, what each consumer applied, the holds, what the queues hold, and every
    row of the users not finished and every log line that names them."""
    async with pool.acquire() as conn:
        stuck = await conn.fetchval(
            "SELECT array_agg(user_id) FROM telecom.queue_users WHERE user_id = ANY($1::uuid[]) "
            "AND (has_access OR user_id IN (SELECT user_id FROM telecom.package_queue "
            "WHERE status <> 'consumed'))",
            users,
        )
        rows = await conn.fetch(
            "SELECT 'package' AS kind, user_id, format('%s %s up=%s', id, status, upload) AS what "
            "FROM telecom.package_queue WHERE user_id = ANY($1::uuid[]) "
            "UNION ALL SELECT 'user', user_id, format('seq=%s unbilled=%s access=%s', seq, "
            "unbilled_upload, has_access) FROM telecom.queue_users WHERE user_id = ANY($1::uuid[]) "
            "UNION ALL SELECT 'outbox', o.user_id, format('%s seq=%s %s published=%s applied=%s', "
            "o.route, o.seq, o.message_id, o.published_at, "
            "(SELECT string_agg(i.consumer, ',') FROM telecom.inbox i "
            " WHERE i.message_id = o.message_id)) "
            "FROM telecom.outbox o WHERE o.user_id = ANY($1::uuid[]) ORDER BY 2, 1, 3",
            stuck or [],
        )
        sessions = await conn.fetch(
            "SELECT pid, application_name, state, wait_event_type, wait_event, "
            "now() - xact_start AS in_transaction, left(query, 160) AS query "
            "FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND state <> 'idle'"
        )
        pending = await conn.fetch(
            "SELECT route, count(*) AS n, min(available_at) AS due FROM telecom.outbox "
            "WHERE published_at IS NULL GROUP BY route"
        )
        applied = await conn.fetch(
            "SELECT consumer, count(*) AS n FROM telecom.inbox GROUP BY consumer ORDER BY 1"
        )
        held = await conn.fetch("SELECT consumer, user_id, blocker, state FROM telecom.holds")
    parts = {"busy sessions": sessions, "unpublished": pending, "applied": applied, "holds": held}
    found = [f"--- {name}: {[dict(r) for r in rows]}" for name, rows in parts.items()]
    found.append("--- rows of the users not finished:")
    found.extend(f"{r['user_id']} {r['kind']}: {r['what']}" for r in rows)
    names = [name for route in ROUTES for name, _ in route_queues(settings, route)]
    figures = await queue_figures(settings, names)
    found.append(f"--- queues (ready, unacked, consumers): {figures}")
    return "\n".join(found), list(stuck or [])


async def test_the_previous_release_runs_beside_this_one_on_the_newest_schema_and_buries_nothing(
    parted: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    previous: tuple[str, Path],
) -> None:
    ref, python = previous
    where = await asyncio.to_thread(imported_from, python)
    assert where.is_relative_to(python.parents[2] / "code"), where  # the old code, not ours
    package = await add_package(pool, TRAFFIC, timedelta(days=1))
    pods = Pods(parted, python)
    try:
        # Before the rollout: the previous release alone, on the schema this release migrated.
        old = [pods.start("relay", old=True), pods.start("run", old=True)]
        alone = [uuid4() for _ in range(6)]
        await start_lifecycles(parted, amqp, pool, package, alone)
        for _ in range(PACKAGES):
            await usage_v1(parted, amqp, alone)
        await wait_finished(pool, alone, pods)
        applied_by_old_alone = await applied(pool, "usage_record")

        # During it: one consumer of each release, each owning one partition of every route,
        # and both relays on the same outbox.
        old[1].terminate()
        old[1] = pods.start("run", "--replica", "0/2", old=True)
        new = [pods.start("relay", old=False), pods.start("run", "--replica", "1/2", old=False)]
        during = [uuid4() for _ in range(16)]
        await start_lifecycles(parted, amqp, pool, package, during)
        await usage_v1(parted, amqp, during)

        async def half_applied() -> bool:
            return await applied(pool, "usage_record") >= applied_by_old_alone + len(during)

        await eventually(half_applied, within=60)
        # The previous release's pods go while the rest is still on its way: this release's
        # replica takes over their partitions and finishes every lifecycle.
        await usage_v1(parted, amqp, during)
        for process in old:
            assert process.terminate() == 0, process.logs()[-3000:]
        await usage_v1(parted, amqp, during)
        await wait_finished(pool, during, pods)

        # After it: this release alone.
        after = [uuid4() for _ in range(4)]
        await start_lifecycles(parted, amqp, pool, package, after)
        for _ in range(PACKAGES):
            await usage_v1(parted, amqp, after)
        await wait_finished(pool, after, pods)

        users = alone + during + after

        # A user is finished once access is gone; its AllExpired event, put in the outbox by
        # that transaction, may still be on its way to the consumer that logs it.
        async def every_all_expired_applied() -> bool:
            return await applied(pool, "all_expired") == len(users)

        await eventually(every_all_expired_applied, within=60)
        async with pool.acquire() as conn:
            letters = await conn.fetch("SELECT route, reason FROM telecom.dead_letters")
            counts = {
                r["consumer"]: r["n"]
                for r in await conn.fetch(
                    "SELECT consumer, count(*) AS n FROM telecom.inbox GROUP BY consumer"
                )
            }
            billed = await conn.fetchval(
                "SELECT (SELECT sum(upload) FROM telecom.package_queue "
                "        WHERE user_id = ANY($1::uuid[])) "
                "     + (SELECT sum(unbilled_upload) FROM telecom.queue_users "
                "        WHERE user_id = ANY($1::uuid[]))",
                users,
            )
        assert [dict(r) for r in letters] == [], f"buried beside {ref}:\n{pods.logs()}"
        assert counts["usage_record"] == PACKAGES * len(users)
        assert counts["package_purchase"] == len(users)
        assert counts["all_expired"] == len(users)
        assert billed == PACKAGES * TRAFFIC * len(users)  # each record billed once, somewhere
        # Both releases applied messages while both ran: each consumer logged its own.
        assert '"event": "processed"' in old[1].logs(), old[1].logs()[-3000:]
        assert '"event": "processed"' in new[1].logs(), new[1].logs()[-3000:]
        for process in new:
            assert process.proc.poll() is None, process.logs()[-3000:]
    finally:
        pods.stop_all()
