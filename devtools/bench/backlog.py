"""`pkgq bench`'s backlog phases: pkgq's consuming hot path against the consumers it is held
against (devtools/bench/baselines.py).

- ratio_vs_simple_consumer, ratio_vs_faststream: a backlog of usage records (B records over N
  users, each user with an active package its usage never uses up) is published to the route's
  queue before any consumer starts, then drained three times from the same state (the bench's
  reset, the users seeded, the backlog queued again): by a consumer written the obvious way
  with aio-pika and asyncpg in this process (one transaction per message: inbox claim, lock the
  user's row, add the usage to the active item; commit, ack; one message at a time, like a
  pkgq lane, with pkgq's prefetch), by a FastStream subscriber doing the same per message with
  FastStream's defaults, and by a real `pkgq run telecom.usage_record` with the configured
  batching. Each is timed from its consumer's start (for `pkgq run`: its subscription seen on
  the queue) until every record is in the inbox; each ratio is pkgq's records/s over the
  baseline's.
- ratio_usage_vs_broker_consume: pkgq's records/s over RabbitMQ's own rate of consuming and
  acking as many messages of the same size, already queued, with no database.
- statements_per_batch: the SQL statements (BEGIN and COMMIT included) that pkgq's delivery
  pipeline runs for one batch of 32 usage records from 32 distinct users with active packages,
  counted in this process by an asyncpg query logger.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING
from uuid import UUID, uuid4

import asyncpg
from aio_pika.abc import AbstractRobustConnection

from consumers.delivery import DeliveryPipeline
from consumers.registry import HANDLERS
from consumers.retry_policy import RetryPolicy
from devtools.bench.baselines import (
    broker_consume_ack,
    faststream_broker,
    simple_consumer,
    usage_bodies,
)
from devtools.bench.drain import POLL, DrainResult, exited, next_check_in, records_per_s
from devtools.bench.support import (
    backlog_rounds,
    child_env,
    cpu_seconds,
    in_turns,
    peak_rss_mb,
    spawn,
    statement_kinds,
    stop_processes,
)
from devtools.postgres import bench_data
from devtools.postgres.statements import StatementLog
from events.decoding import RawDelivery
from events.envelope import CONTENT_TYPE, H_ATTEMPT, H_SCHEMA_VERSION, H_USER_ID
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.postgres import catalog
from infra.postgres.pool import create_pool
from infra.rabbit.management import passive_figures
from infra.rabbit.topology import route_queues

if TYPE_CHECKING:
    from devtools.bench.scenario import Bench

LIMIT = 10**15
"""The backlog package's traffic limit: far more than any backlog uses."""
UPLOAD = 1000
DOWNLOAD = 500
STATEMENT_BATCH = 32


class BacklogBench:
    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.scenario = bench.scenario
        self.users = [uuid4() for _ in range(self.scenario.backlog_users)]
        self.package_id = 0

    @property
    def db(self) -> asyncpg.Connection:
        assert self.bench.db is not None
        return self.bench.db

    @property
    def amqp(self) -> AbstractRobustConnection:
        assert self.bench.amqp is not None
        return self.bench.amqp

    @property
    def prefetch(self) -> int:
        """pkgq's: the broker sends at least a batch ahead."""
        return max(self.scenario.prefetch, self.scenario.batch_size)

    async def seed(self, users: list[UUID]) -> None:
        """Give each user an active package (with its access row), as after its activation."""
        if not self.package_id:
            self.package_id = (await catalog.add_package(self.db, "bench-big", LIMIT, None)).id
        await bench_data.seed_active_users(self.db, users, self.package_id, LIMIT)

    async def prepare(self) -> None:
        """The same state before each drain: the bench's reset, the users, the backlog queued."""
        await self.bench.reset(self.scenario.small_rows)
        await self.seed(self.users)
        await self.bench.settle()
        channel = await self.amqp.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(self.bench.settings.exchange)
        for size in backlog_rounds(len(self.users), self.scenario.backlog_records):
            await self.bench.send_round(
                exchange,
                (
                    RecordUsage(user_id=u, upload=UPLOAD, download=DOWNLOAD)
                    for u in self.users[:size]
                ),
                USAGE_RECORD,
            )
        await channel.close()

    async def wait_applied(self, failure: Callable[[], str | None]) -> None:
        """Until every record of the backlog is in the inbox; `failure` says why to give up.
        Gives up when nothing has moved for the scenario's timeout (a large backlog may take
        longer than that in all). While the route's queues still hold messages not yet sent
        to the consumer, only their depth is asked (of the broker, cheaply), less often the
        more there are (next_check_in): counting the inbox costs Postgres a scan of it each
        time, which the consumer under test would pay for, so it is counted only for the last
        prefetch's worth, every POLL."""
        target = self.scenario.backlog_records
        last, moved = (-1, -1), time.monotonic()
        queues = [name for name, _ in route_queues(self.bench.settings, USAGE_RECORD.name)]
        previous: tuple[int, float] | None = None
        fastest = 0.0
        while True:
            figures = await passive_figures(self.amqp, queues)
            waiting = sum(f[0] for f in figures.values() if f is not None)
            checked = time.monotonic()
            done = 0
            if not waiting:
                done = await bench_data.count_processed(self.db, USAGE_RECORD.short_name)
                if done >= target:
                    return
            if (why := failure()) is not None:
                raise RuntimeError(why)
            if (waiting, done) != last:
                last, moved = (waiting, done), time.monotonic()
            elif time.monotonic() - moved > self.scenario.timeout:
                raise TimeoutError(f"backlog stuck at {done}/{target}, {waiting} queued")
            if previous is not None and previous[0] > waiting and checked > previous[1]:
                fastest = max(fastest, (previous[0] - waiting) / (checked - previous[1]))
            previous = (waiting, checked)
            pause = next_check_in(waiting, fastest)
            await asyncio.sleep(pause)

    async def check_applied(self, users: list[UUID], records: int) -> None:
        """Every record's usage is on its user's active item, once."""
        applied = await bench_data.active_usage(self.db, users)
        expected = (len(users), records * UPLOAD, records * DOWNLOAD)
        if applied != expected:
            raise RuntimeError(f"usage applied {applied}, expected {expected}")

    async def drain_simple(self) -> DrainResult:
        await self.prepare()
        queues = [name for name, _ in route_queues(self.bench.settings, USAGE_RECORD.name)]
        # asyncpg's defaults otherwise, as the obvious consumer would have them: on a server
        # with TLS on, libpq's `prefer` (pkgq itself connects to this host as `allow`).
        pool = await asyncpg.create_pool(
            self.bench.settings.postgres_dsn, min_size=len(queues), max_size=len(queues)
        )
        try:
            started = time.perf_counter()
            tasks = [
                asyncio.create_task(simple_consumer(self.amqp, name, pool, self.prefetch))
                for name in queues
            ]

            def failure() -> str | None:
                crashed = [t for t in tasks if t.done()]
                return f"simple consumer stopped: {crashed[0]!r}" if crashed else None

            try:
                await self.wait_applied(failure)
                seconds = time.perf_counter() - started
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await pool.close()
        await self.check_applied(self.users, self.scenario.backlog_records)
        return DrainResult("simple", self.scenario.backlog_records, seconds)

    async def drain_faststream(self) -> DrainResult:
        """The FastStream consumer (baselines.faststream_broker) on the same backlog, timed
        from its broker's start (connected before) until every record is in the inbox."""
        await self.prepare()
        queues = [name for name, _ in route_queues(self.bench.settings, USAGE_RECORD.name)]
        # asyncpg's default pool (10 connections, libpq's `prefer` TLS on a server with TLS
        # on), as a FastStream app's startup would make it.
        pool = await asyncpg.create_pool(self.bench.settings.postgres_dsn)
        errors: list[BaseException] = []
        broker = faststream_broker(self.bench.settings, queues, pool, errors)
        try:
            await broker.connect()
            started = time.perf_counter()
            await broker.start()
            await self.wait_applied(
                lambda: f"FastStream handler failed: {errors[0]!r}" if errors else None
            )
            seconds = time.perf_counter() - started
        finally:
            await broker.stop()
            await pool.close()
        await self.check_applied(self.users, self.scenario.backlog_records)
        return DrainResult("faststream", self.scenario.backlog_records, seconds)

    async def drain_broker(self) -> DrainResult:
        """RabbitMQ alone (baselines.broker_consume_ack): as many messages as the backlog, of
        the same size, in a queue of the bench's namespace, consumed with pkgq's prefetch; no
        database."""
        bodies = usage_bodies(self.users, self.scenario.backlog_records, UPLOAD, DOWNLOAD)
        async with asyncio.timeout(self.scenario.timeout):
            seconds, cpu = await broker_consume_ack(
                self.amqp, f"{self.bench.settings.queue_prefix}.consume", bodies, self.prefetch
            )
        return DrainResult("broker", len(bodies), seconds, cpu_seconds=cpu)

    async def drain_pkgq(self) -> DrainResult:
        await self.prepare()
        env = child_env(
            self.bench.settings,
            batch_size=self.scenario.batch_size,
            prefetch=self.scenario.prefetch,
            batch_max=self.scenario.batch_max,
        )
        process = spawn(["run", "--no-ingest", USAGE_RECORD.name], env)
        try:
            await self.wait_subscribed(process)
            started, cpu_started = time.perf_counter(), cpu_seconds(process.pid)
            await self.wait_applied(lambda: exited(process))
            seconds = time.perf_counter() - started
            cpu = cpu_seconds(process.pid) - cpu_started
            rss = peak_rss_mb(process.pid)
        finally:
            stop_processes([process])
        await self.check_applied(self.users, self.scenario.backlog_records)
        return DrainResult("pkgq", self.scenario.backlog_records, seconds, rss, cpu)

    async def wait_subscribed(self, process: subprocess.Popen[bytes]) -> None:
        """Until the process consumes from every queue of the route (checked every POLL s)."""
        queues = [name for name, _ in route_queues(self.bench.settings, USAGE_RECORD.name)]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            figures = await passive_figures(self.amqp, queues)
            if all(f is not None and f[1] for f in figures.values()):
                return
            if (why := exited(process)) is not None:
                raise RuntimeError(why)
            await asyncio.sleep(POLL / 2)
        raise TimeoutError("pkgq run did not subscribe within 60 s")

    async def best_of(self, drain: Callable[[], Awaitable[DrainResult]]) -> DrainResult:
        """The fastest of the scenario's `repeat` drains."""
        results = [await drain() for _ in range(self.scenario.repeat)]
        return max(results, key=lambda r: r.records_per_s)

    async def statements_per_batch(self) -> tuple[int, dict[str, int]]:
        """Statements of one batch of STATEMENT_BATCH usage records (after a warm-up batch)."""
        await self.bench.reset(0)
        users = [uuid4() for _ in range(2 * STATEMENT_BATCH)]
        warm, measured = users[:STATEMENT_BATCH], users[STATEMENT_BATCH:]
        await self.seed(users)
        log = StatementLog()
        # As the consumers' pool is made (consumers/runtime.services): no reset on release.
        pool = await create_pool(
            self.bench.settings.postgres_dsn, query_logger=log, reset_session=False
        )
        try:
            pipeline = DeliveryPipeline(
                pool, USAGE_RECORD, HANDLERS[USAGE_RECORD.name], RetryPolicy(), max_body_bytes=2**20
            )
            await pipeline.process_batch([_raw(u) for u in warm])
            await log.settled()
            log.clear()
            outcomes = await pipeline.process_batch([_raw(u) for u in measured])
            count = await log.settled()
            kinds = statement_kinds(log.statements)
        finally:
            await pool.close()
        try:
            await self.check_applied(measured, len(measured))
        except RuntimeError as error:
            raise RuntimeError(f"{error}; outcomes {outcomes}") from None
        return count, kinds


def _raw(user: UUID) -> RawDelivery:
    return RawDelivery(
        body=RecordUsage(user_id=user, upload=UPLOAD, download=DOWNLOAD).model_dump_json().encode(),
        message_id=str(uuid4()),
        message_type=USAGE_RECORD.message_type,
        content_type=CONTENT_TYPE,
        timestamp=None,
        headers={
            H_SCHEMA_VERSION: USAGE_RECORD.schema_version,
            H_USER_ID: str(user),
            H_ATTEMPT: 1,
        },
        routing_key=USAGE_RECORD.name,
    )


BACKLOG_PHASES = 4


async def backlog_phases(bench: Bench, say: Callable[[str], None]) -> dict[str, float | int]:
    """Run the backlog phases (BACKLOG_PHASES starts reported to `say`); their key=values."""
    backlog = BacklogBench(bench)
    scenario = bench.scenario
    say(
        f"simple consumer (a transaction per message): backlog of "
        f"{scenario.backlog_records:,} usage records, {scenario.backlog_users:,} users"
    )
    simple = await backlog.best_of(backlog.drain_simple)
    say(f"  {simple.records_per_s:,.0f} records/s ({simple.seconds:.1f} s)")

    say("FastStream consumer (a transaction per message, its defaults) on the same backlog")
    faststream = await backlog.best_of(backlog.drain_faststream)
    say(f"  {faststream.records_per_s:,.0f} records/s ({faststream.seconds:.1f} s)")

    say(
        f"pkgq run (batch {scenario.batch_size}, up to {scenario.batch_max} when buffered, "
        f"prefetch {scenario.prefetch}) on the same backlog, taking turns with the broker "
        f"consuming and acking alone ({scenario.backlog_records:,} messages, prefetch "
        f"{backlog.prefetch}, no database)"
    )
    pkgqs, brokers = await in_turns(scenario.repeat, backlog.drain_pkgq, backlog.drain_broker)
    pkgq = max(pkgqs, key=records_per_s)
    broker = max(brokers, key=records_per_s)
    say(
        f"  {pkgq.records_per_s:,.0f} records/s ({pkgq.seconds:.1f} s), rss {pkgq.rss_mb:.0f} MB, "
        f"{pkgq.cpu()}"
    )
    say(
        f"  broker alone {broker.records_per_s:,.0f} msg/s ({broker.seconds:.1f} s), "
        f"its client's {broker.cpu()}"
    )

    say(f"statements of one batch of {STATEMENT_BATCH} usage records, {STATEMENT_BATCH} users")
    statements, kinds = await backlog.statements_per_batch()
    say(f"  {statements}: " + ", ".join(f"{k} {v}" for k, v in kinds.items()))
    return {
        "ratio_vs_simple_consumer": round(pkgq.records_per_s / simple.records_per_s, 2),
        "ratio_vs_faststream": round(pkgq.records_per_s / faststream.records_per_s, 2),
        "faststream_records_per_s": round(faststream.records_per_s, 1),
        "ratio_usage_vs_broker_consume": round(pkgq.records_per_s / broker.records_per_s, 3),
        "broker_consume_ack_per_s": round(broker.records_per_s, 1),
        "statements_per_batch": statements,
    }
