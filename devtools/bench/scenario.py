"""`pkgq bench`: the standard scenario through real processes, against baselines in the same run.

The scenario: U users buy K packages each (one purchase of amount K), wait until the first is
active, then send K usage records that each use up one package, so every user goes through K
activations and K expirations to all_expired. A real `pkgq relay` and `pkgq run` do the work,
in a database and broker namespace of their own (`pkgq_bench`, `bench.*`).

Measured, all in one run:
- raw broker round trip: publish with confirms, consume, ack, messages of the same size, no
  database (the ceiling for anything that goes through RabbitMQ);
- pkgq naive: batch 1, prefetch 1;
- pkgq: the configured batching, with 10,000 and with 1,000,000 rows already in package_queue
  (two databases, taking turns: devtools/bench/run.table_sizes);
- latency (outbox insert -> the consuming transaction) with usage paced at half of the
  measured maximum rate, and peak RSS of each process.
- a backlog of usage records drained by a consumer written the obvious way (a transaction per
  message), by a FastStream consumer doing the same, and by `pkgq run`; RabbitMQ's own
  consume-and-ack rate on as many messages; and the SQL statements one batch costs
  (devtools/bench/backlog.py, devtools/bench/baselines.py).
Absolute numbers on a shared machine are noise; the ratios are the result.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from uuid import uuid4

import aio_pika
import asyncpg
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from devtools.bench.support import (
    TABLES,
    TRAFFIC,
    RunResult,
    Scenario,
    child_env,
    fastest,
    in_turns,
    message,
    peak_rss_mb,
    spawn,
    status_port_env,
    stop_processes,
)
from devtools.postgres import bench_data
from events.models import PurchasePackage, RecordUsage, WireModel
from events.routes import ALL_EXPIRED, PACKAGE_PURCHASE, USAGE_RECORD, Route
from infra.postgres import catalog
from infra.postgres.migrate import ensure_database, migrate
from infra.postgres.pool import clock
from infra.rabbit.connection import open_amqp
from infra.rabbit.topology import declare_all, delete_all, route_queues, routing_key_for
from infra.settings import Settings

__all__ = ["Bench", "Scenario"]


class Bench:
    def __init__(self, settings: Settings, scenario: Scenario) -> None:
        self.settings = settings
        self.scenario = scenario
        self.amqp: AbstractRobustConnection | None = None
        self.db: asyncpg.Connection | None = None
        self.package_id = 0

    async def open(self) -> None:
        # As the owner: the bench migrates and truncates its own database.
        await ensure_database(self.settings.owner_dsn())
        self.db = await asyncpg.connect(self.settings.owner_dsn())
        await migrate(self.db, runtime_role=self.settings.grantee())
        self.amqp = await open_amqp(self.settings, "pkgq-bench")

    async def close(self) -> None:
        if self.amqp is not None:
            channel = await self.amqp.channel()
            await delete_all(channel, self.settings)
            await self.amqp.close()
        if self.db is not None:
            await self.db.close()

    # -- the raw broker baseline ------------------------------------------------------------

    async def raw_broker(self) -> RunResult:
        """Publish with confirms, consume, ack: same message size, same windowing, no DB."""
        assert self.amqp is not None
        count = self.scenario.raw_messages
        body = RecordUsage(user_id=uuid4(), upload=TRAFFIC, download=0).model_dump_json().encode()
        channel = await self.amqp.channel(publisher_confirms=True)
        queue = await channel.declare_queue(
            f"{self.settings.queue_prefix}.raw", durable=True, auto_delete=False
        )
        await queue.purge()
        done = asyncio.Event()
        received = 0

        async def on_message(delivery: AbstractIncomingMessage) -> None:
            nonlocal received
            await delivery.ack()
            received += 1
            if received >= count:
                done.set()

        consumer_channel = await self.amqp.channel()
        await consumer_channel.set_qos(prefetch_count=self.scenario.prefetch)
        consumer_queue = await consumer_channel.get_queue(queue.name)
        tag = await consumer_queue.consume(on_message)
        started = time.perf_counter()
        window = max(1, self.scenario.users)
        for first in range(0, count, window):
            await asyncio.gather(
                *(
                    channel.default_exchange.publish(
                        message(body, USAGE_RECORD, None), routing_key=queue.name
                    )
                    for _ in range(first, min(count, first + window))
                )
            )
        await asyncio.wait_for(done.wait(), timeout=self.scenario.timeout)
        seconds = time.perf_counter() - started
        await consumer_queue.cancel(tag)
        await queue.delete(if_unused=False, if_empty=False)
        await consumer_channel.close()
        await channel.close()
        return RunResult("raw broker round trip", count, seconds)

    # -- pkgq itself ------------------------------------------------------------------------

    async def reset(self, rows: int) -> None:
        """Empty pkgq's tables and queues; fill package_queue with `rows` finished items."""
        assert self.db is not None
        assert self.amqp is not None
        await bench_data.truncate(self.db, TABLES, restart_identity=True)
        channel = await self.amqp.channel()
        await delete_all(channel, self.settings)
        channel = await self.amqp.channel()
        await declare_all(channel, self.settings)
        await channel.close()
        if not self.package_id:
            self.package_id = (await catalog.add_package(self.db, "bench", TRAFFIC, None)).id
        await self.add_rows(rows)

    async def clear_scenario(self) -> None:
        """Remove what a scenario run left (its users, messages and queues), keeping the
        prepopulated rows (which belong to users with no queue_users row)."""
        assert self.db is not None
        assert self.amqp is not None
        await bench_data.delete_scenario_items(self.db)
        await bench_data.truncate(self.db, [t for t in TABLES if t != "package_queue"])
        await self.settle()
        channel = await self.amqp.channel()
        await delete_all(channel, self.settings)
        channel = await self.amqp.channel()
        await declare_all(channel, self.settings)
        await channel.close()

    async def lifecycle(self, label: str) -> RunResult:
        """One run of the scenario with the configured batching."""
        return await self.scenario_run(
            label,
            batch_size=self.scenario.batch_size,
            prefetch=self.scenario.prefetch,
            batch_max=self.scenario.batch_max,
        )

    async def raw_and_lifecycle(self, runs: int) -> tuple[RunResult, RunResult]:
        """The raw broker round trip and pkgq's lifecycle run taking turns (support.in_turns),
        `runs` of each; the best of each."""
        raws, lifecycles = await in_turns(
            runs, self.raw_broker, lambda: self.lifecycle("pkgq"), between=self.clear_scenario
        )
        return fastest(raws), fastest(lifecycles)

    async def add_rows(self, rows: int) -> None:
        """Other users' consumed items: the table a busy deployment has, not the scenario's."""
        assert self.db is not None
        await bench_data.add_finished_items(self.db, self.package_id, TRAFFIC, rows)
        await self.settle()

    async def settle(self) -> None:
        """Vacuum and analyze now, so autovacuum does not compete with the next run."""
        assert self.db is not None
        await bench_data.vacuum_analyze(self.db, TABLES)

    async def row_count(self) -> int:
        assert self.db is not None
        return await bench_data.count_items(self.db)

    async def scenario_run(
        self,
        label: str,
        *,
        batch_size: int,
        prefetch: int,
        batch_max: int | None = None,
        pace_eps: float | None = None,
    ) -> RunResult:
        """Drive the scenario through a real relay and consumer process; wait for the end."""
        assert self.db is not None
        assert self.amqp is not None
        env = child_env(
            self.settings, batch_size=batch_size, prefetch=prefetch, batch_max=batch_max
        )
        count = self.scenario.replicas
        processes = {"relay": spawn(["relay"], status_port_env(env, 0))}
        for i in range(count):
            replica = ["--replica", f"{i}/{count}"] if count > 1 else []
            processes[f"run{i}" if count > 1 else "run"] = spawn(
                ["run", "--no-ingest", *replica], status_port_env(env, 1 + i)
            )
        try:
            await self._wait_consuming()
            users = [uuid4() for _ in range(self.scenario.users)]
            started = time.perf_counter()
            channel = await self.amqp.channel(publisher_confirms=True)
            exchange = await channel.get_exchange(self.settings.exchange)
            await self.send_round(
                exchange,
                (
                    PurchasePackage(
                        user_id=u, package_id=self.package_id, amount=self.scenario.packages
                    )
                    for u in users
                ),
                PACKAGE_PURCHASE,
            )
            db = self.db
            await self._wait(lambda: bench_data.count_active(db, users), len(users))
            usage_started = await clock(db)
            # Paced: small slices spread evenly (a usage causes about 3 events: itself, its
            # expiring, the next activation), so latency is measured without bursts.
            step = max(1, len(users) // 20) if pace_eps else len(users)
            for _ in range(self.scenario.packages):
                for first in range(0, len(users), step):
                    slice_started = time.perf_counter()
                    await self.send_round(
                        exchange,
                        (
                            RecordUsage(user_id=u, upload=TRAFFIC, download=0)
                            for u in users[first : first + step]
                        ),
                        USAGE_RECORD,
                    )
                    if pace_eps:
                        pause = 3 * step / pace_eps - (time.perf_counter() - slice_started)
                        await asyncio.sleep(max(0.0, pause))
            await self._wait(
                lambda: bench_data.count_processed(db, ALL_EXPIRED.short_name), len(users)
            )
            seconds = time.perf_counter() - started
            await channel.close()
            events = await bench_data.count_processed(db)
            # The usage phase only: the purchase burst is not paced.
            latencies = await bench_data.latencies_ms(db, usage_started)
            rss = {name: peak_rss_mb(p.pid) for name, p in processes.items()}
            return RunResult(label, events, seconds, latencies, rss)
        finally:
            stop_processes(processes.values())

    async def _wait_consuming(self) -> None:
        """Until the consumer process has subscribed to every route's queue."""
        assert self.amqp is not None
        queues = [
            name
            for route in (PACKAGE_PURCHASE, USAGE_RECORD, ALL_EXPIRED)
            for name, _ in route_queues(self.settings, route.name)
        ]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            channel = await self.amqp.channel()
            try:
                counts = []
                for name in queues:
                    queue = await channel.declare_queue(name, passive=True)
                    counts.append(queue.declaration_result.consumer_count)
            finally:
                await channel.close()
            if all(counts):
                return
            await asyncio.sleep(0.2)
        raise TimeoutError("the consumer process did not subscribe within 60 s")

    async def send_round(
        self, exchange: aio_pika.abc.AbstractExchange, bodies: Iterable[WireModel], route: Route
    ) -> None:
        """One message per user, published concurrently with confirms (a user's messages are
        never in the same round, so each user's order is kept)."""
        await asyncio.gather(
            *(
                exchange.publish(
                    message(body.model_dump_json().encode(), route, body.user_id),
                    routing_key=routing_key_for(self.settings, route.name, body.user_id),
                    mandatory=True,
                )
                for body in bodies
            )
        )

    async def _wait(self, current: Callable[[], Awaitable[int]], target: int) -> None:
        deadline = time.monotonic() + self.scenario.timeout
        while (value := await current()) < target:
            if time.monotonic() > deadline:
                raise TimeoutError(f"stuck at {value}/{target}")
            await asyncio.sleep(0.05)
