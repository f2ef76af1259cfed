"""`pkgq demo`: real relay and consumer processes, sample users, every transition shown live.

Scenario (three users run at once):
- alice buys 2 x 1 MiB; usage consumes the first, the second activates, more usage consumes
  it, and access ends (all_expired);
- bob buys a 3-second package; it expires by time and access ends;
- carol buys 2 x 1 MiB; the active one is cancelled, the next activates, an admin lowers its
  quota below zero so it is consumed at once, and access ends;
- a malformed usage record is stored as a dead letter with its reason while everything else
  flows;
- then the job-queue options: dave's purchase is put through the outbox with priority 2, a
  2-second delay and an address, and the demo waits on the address; erin, frank and gina get a
  bulk grant as one group, followed to completion; `pkgq stats` closes the show.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from uuid import UUID, uuid4

from aio_pika.abc import AbstractRobustConnection
from rich.console import Console
from rich.table import Table

from consumers import publishing
from consumers.cli import exit_codes
from consumers.job_stats import STATES, route_stats
from devtools.bench.support import stop_processes
from events.envelope import H_DEAD_REASON, H_SCHEMA_VERSION
from events.models import (
    AdjustQuota,
    CancelPackage,
    PurchasePackage,
    RecordUsage,
    WireModel,
)
from events.partitioning import route_of_key
from events.routes import (
    ALL_EXPIRED,
    ALL_ROUTES,
    PACKAGE_ACTIVATE,
    PACKAGE_CANCEL,
    PACKAGE_EXPIRING,
    PACKAGE_PURCHASE,
    PACKAGE_QUEUING,
    QUOTA_ADJUST,
    USAGE_RECORD,
    Route,
)
from infra.jobs import Jobs
from infra.postgres import catalog, dead_letters, queue_repo
from infra.postgres.pool import create_pool, database
from infra.rabbit.connection import open_amqp
from infra.rabbit.publisher import Publisher, build_message
from infra.rabbit.tap import Tap, Tapped
from infra.rabbit.topology import declare_all, routing_key_for
from infra.settings import Settings


@functools.cache
def console() -> Console:
    """The demo's terminal, made when it first prints (from the environment it runs in)."""
    return Console(soft_wrap=True)


MIB = 2**20


class Demo:
    def __init__(self, settings: Settings, amqp: AbstractRobustConnection) -> None:
        self.settings = settings
        self.amqp = amqp
        self.names: dict[str, str] = {}
        self.started = time.monotonic()
        self.tap = Tap(self._show)

    def _show(self, t: Tapped) -> None:
        elapsed = time.monotonic() - self.started
        try:
            body = t.json()
        except ValueError:
            body = {}
        who = self.names.get(str(body.get("user_id", "")), "?")
        if t.exchange == self.settings.dlx:
            reason = t.headers.get(H_DEAD_REASON, "?")
            console().print(
                f"[dim]{elapsed:6.2f}s[/dim] [red]DEAD LETTER[/red] {t.routing_key} reason={reason}"
            )
            return
        detail = {k: v for k, v in body.items() if k != "user_id"}
        seq = f" seq={t.seq}" if t.seq is not None else ""
        console().print(
            f"[dim]{elapsed:6.2f}s[/dim] [bold cyan]{t.routing_key:<26}[/bold cyan] "
            f"[bold]{who:<6}[/bold]{seq} {detail}"
        )

    async def send(self, route: Route, body: WireModel) -> None:
        await publishing.publish(self.settings, self.amqp, route, body)

    def _has(self, route: Route, user: UUID, **fields: object) -> bool:
        for t in self.tap.on(route.name):
            body = t.json()
            if body.get("user_id") == str(user) and all(
                body.get(k) == v for k, v in fields.items()
            ):
                return True
        return False

    async def expect(self, route: Route, user: UUID, within: float = 30, **fields: object) -> None:
        try:
            await self.tap.wait_for(lambda _: self._has(route, user, **fields), within)
        except TimeoutError:
            raise DemoFailedError(
                f"no {route.name} for {self.names[str(user)]} {fields} within {within}s"
            ) from None

    def item_ids(self, user: UUID) -> list[int]:
        for t in self.tap.on(PACKAGE_QUEUING.name):
            body = t.json()
            if body["user_id"] == str(user):
                return list(body["item_ids"])
        raise DemoFailedError(f"no items queued for {self.names[str(user)]}")

    async def alice(self, user: UUID, small: int) -> None:
        await self.send(PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=small, amount=2))
        await self.expect(PACKAGE_QUEUING, user)
        first, second = self.item_ids(user)
        await self.expect(PACKAGE_ACTIVATE, user, item_id=first)
        await self.send(USAGE_RECORD, RecordUsage(user_id=user, upload=300_000, download=400_000))
        await self.send(USAGE_RECORD, RecordUsage(user_id=user, upload=100_000, download=400_000))
        await self.expect(PACKAGE_EXPIRING, user, item_id=first, reason="usage")
        await self.expect(PACKAGE_ACTIVATE, user, item_id=second)
        await self.send(USAGE_RECORD, RecordUsage(user_id=user, upload=0, download=2 * MIB))
        await self.expect(PACKAGE_EXPIRING, user, item_id=second, reason="usage")
        await self.expect(ALL_EXPIRED, user)

    async def bob(self, user: UUID, short: int) -> None:
        await self.send(PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=short))
        await self.expect(PACKAGE_QUEUING, user)
        (item,) = self.item_ids(user)
        await self.expect(PACKAGE_ACTIVATE, user, item_id=item)
        await self.expect(PACKAGE_EXPIRING, user, within=30, item_id=item, reason="time")
        await self.expect(ALL_EXPIRED, user)

    async def carol(self, user: UUID, small: int) -> None:
        await self.send(PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=small, amount=2))
        await self.expect(PACKAGE_QUEUING, user)
        first, second = self.item_ids(user)
        await self.expect(PACKAGE_ACTIVATE, user, item_id=first)
        await self.send(PACKAGE_CANCEL, CancelPackage(user_id=user, item_id=first))
        await self.expect(PACKAGE_ACTIVATE, user, item_id=second)
        await self.send(QUOTA_ADJUST, AdjustQuota(user_id=user, item_id=second, delta=-MIB))
        await self.expect(PACKAGE_EXPIRING, user, item_id=second, reason="usage")
        await self.expect(ALL_EXPIRED, user)

    async def malformed(self) -> None:
        publisher = await Publisher.open(
            self.amqp, self.settings.exchange, user_id=self.settings.amqp_user
        )
        message_id = uuid4()
        try:
            message = build_message(
                b'{"user_id": "not json',
                message_id=message_id,
                message_type=USAGE_RECORD.message_type,
                headers={H_SCHEMA_VERSION: USAGE_RECORD.schema_version},
            )
            # Its user is unreadable: partition 0 when the route is partitioned.
            key = routing_key_for(self.settings, USAGE_RECORD.name, None)
            await publisher.publish(message, key)
        finally:
            await publisher.close()
        async with database(self.settings.postgres_dsn, self.settings.postgres_session()) as conn:
            for _ in range(300):
                row = await dead_letters.find_by_message_id(conn, str(message_id))
                if row is not None:
                    elapsed = time.monotonic() - self.started
                    console().print(
                        f"[dim]{elapsed:6.2f}s[/dim] [red]DEAD LETTER[/red] {USAGE_RECORD.name} "
                        f"reason={row['reason']} ({row['error_message']}); "
                        f"see: pkgq dlq show {row['id']}",
                        highlight=False,
                    )
                    return
                await asyncio.sleep(0.1)
        raise DemoFailedError("the malformed message was not stored as a dead letter")


async def job_scenes(settings: Settings, small: int, users: dict[str, UUID]) -> None:
    """Addressed, delayed, prioritised work and a group, through the publishing API."""
    pool = await create_pool(
        settings.postgres_dsn, min_size=1, max_size=2, session=settings.postgres_session()
    )
    try:
        jobs = Jobs(pool)
        console().rule("job-queue options: priority, delay, address; then a group")
        dave = users["dave"]
        put = await jobs.publish(
            PACKAGE_PURCHASE,
            PurchasePackage(user_id=dave, package_id=small),
            priority=2,
            delay=2,
            address=f"demo:{dave}",
        )
        console().print(f"dave's purchase put with priority 2, delay 2 s, address demo:{dave}")
        started = time.monotonic()
        state = await jobs.wait(f"demo:{dave}", timeout=30)
        if state.state != "done":
            raise DemoFailedError(f"dave's purchase {state.state}: {state.error}")
        console().print(
            f"waited on the address: {state.state} after {time.monotonic() - started:.1f} s "
            f"(message {put.message_id})"
        )
        members = [users[n] for n in ("erin", "frank", "gina")]
        group = await jobs.publish_group(
            PACKAGE_PURCHASE,
            [PurchasePackage(user_id=u, package_id=small) for u in members],
            name="demo grant",
        )
        console().print(f"bulk grant to erin, frank and gina as group {group.group_id}")
        summary = None
        for _ in range(150):  # the group is polled from Postgres for up to 30 s
            summary = await jobs.group(group.group_id)
            if summary is None or summary["state"] != "open":
                break
            await asyncio.sleep(0.2)
        if summary is None or summary["state"] != "completed":
            raise DemoFailedError(f"group did not complete: {summary}")
        console().print(
            f"group completed: {summary['done']} done, {summary['failed']} failed "
            f"(pkgq group show {group.group_id})"
        )
        async with pool.acquire() as conn:
            table = await route_stats(settings, conn)
        view = Table("route", "R", "T", "W", "B", "Z", "D", "put", "take", "ack", "bury")
        for route, row in table.items():
            moves = row["transitions"]
            view.add_row(
                route.removeprefix("telecom."),
                *("?" if row[k] is None else str(row[k]) for k in STATES),
                *(str(moves[m]) for m in ("put", "take", "ack", "bury")),
            )
        console().rule("pkgq stats")
        console().print(view)
    finally:
        await pool.close()


class DemoFailedError(Exception):
    pass


def _spawn(args: list[str], settings: Settings) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.setdefault("PKGQ_LOG_FORMAT", "json")
    env.setdefault("PKGQ_LOG_LEVEL", "warning")
    env.update(settings.child_env())
    return subprocess.Popen([sys.executable, "-m", "consumers", *args], env=env)  # noqa: S603


async def _catalog(settings: Settings) -> tuple[int, int]:
    """The demo's two packages, added on the first run and reused after."""
    wanted = {"demo 1 MiB": (MIB, None), "demo 3 s": (2**30, timedelta(seconds=3))}
    async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
        existing = {
            p.name: p.id
            for p in await catalog.list_packages(conn)
            if wanted.get(p.name) == (p.traffic_limit, p.duration)
        }
        for name, (limit, duration) in wanted.items():
            if name not in existing:
                existing[name] = (await catalog.add_package(conn, name, limit, duration)).id
        return existing["demo 1 MiB"], existing["demo 3 s"]


async def _final_state(settings: Settings, users: dict[str, UUID]) -> None:
    async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
        table = Table("user", "item", "package", "status", "used", "quota")
        for name, user in users.items():
            for item in await queue_repo.load_user_items(conn, user):
                table.add_row(
                    name,
                    str(item.id),
                    item.terms.package_name,
                    item.status.value,
                    str(item.used),
                    "unlimited" if item.quota is None else str(item.quota),
                )
        console().print(table)


def _routes_seen(tap: Tap, settings: Settings) -> set[str]:
    seen = {route_of_key(t.routing_key) for t in tap.seen if t.exchange == settings.exchange}
    missing = set(ALL_ROUTES) - seen
    if missing:
        raise DemoFailedError(f"routes never used: {sorted(missing)}")
    return seen


async def run_demo(settings: Settings, within: float) -> int:
    small, short = await _catalog(settings)
    amqp = await open_amqp(settings, "pkgq-demo")
    channel = await amqp.channel()
    await declare_all(channel, settings)
    await channel.close()
    demo = Demo(settings, amqp)
    await demo.tap.attach(amqp, settings.exchange, settings.dlx)
    users = {name: uuid4() for name in ("alice", "bob", "carol", "dave", "erin", "frank", "gina")}
    demo.names = {str(u): n for n, u in users.items()}
    console().rule("pkgq demo: starting the relay and the consumers of every route")
    processes = [_spawn(["relay"], settings), _spawn(["run"], settings)]
    code = exit_codes.OK
    try:
        async with asyncio.timeout(within):
            await asyncio.gather(
                demo.alice(users["alice"], small),
                demo.bob(users["bob"], short),
                demo.carol(users["carol"], small),
                demo.malformed(),
            )
            await job_scenes(settings, small, users)
        seen = _routes_seen(demo.tap, settings)
        console().rule("final state")
        await _final_state(settings, users)
        console().print(f"[green]every route at work: {len(seen)}/{len(ALL_ROUTES)}[/green]")
        for name, user in users.items():
            console().print(f"  inspect {name}: pkgq user show {user}")
    except DemoFailedError as exc:
        console().print(f"[red]demo failed:[/red] {exc}")
        code = exit_codes.FAILED
    except TimeoutError:
        console().print(f"[red]demo failed:[/red] not done within {within} s")
        code = exit_codes.TIMEOUT
    finally:
        stop_processes(processes)
        for proc in processes:
            if proc.returncode not in (0, -signal.SIGTERM):
                console().print(f"[red]{proc.args!r} exited with {proc.returncode}[/red]")
                code = exit_codes.FAILED
        await demo.tap.close()
        with contextlib.suppress(Exception):
            await amqp.close()
    return code
