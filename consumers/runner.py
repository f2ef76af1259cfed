"""`pkgq run`: one consumer per route (and the dead-letter ingester), sharing a pool and a
connection, in one process."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import structlog

from consumers.breaker import Breaker
from consumers.delivery import DeliveryPipeline
from consumers.handlers import package_purchase
from consumers.ingest import ingester
from consumers.rebalance import ElasticRoute, Rebalancer
from consumers.registry import HANDLERS
from consumers.retry_policy import RetryPolicy, policy_for
from consumers.route_pauses import PauseWatch
from consumers.runtime import (
    STARTUP_FIRST_PAUSE_S,
    STARTUP_LONGEST_PAUSE_S,
    start_status_server,
)
from consumers.unit_of_work import Handler
from consumers.worker import Services
from events.routes import PACKAGE_PURCHASE, Route
from infra.rabbit.consumer import Processor, QueueConsumer
from infra.rabbit.publisher import Publisher
from infra.rabbit.route_consumer import route_consumer
from infra.rabbit.setting_up import through_outages
from infra.rabbit.topology import declare_exchanges
from infra.settings import Settings
from infra.systemd_notify import Notifier
from infra.transient import OutagePauses, StoppingError, is_transient

log = structlog.get_logger(__name__)


def handler_for(settings: Settings, route: Route) -> Handler:
    """The route's handler, with the settings it takes: the purchase's cap on a user's live
    items (PKGQ_MAX_QUEUED_ITEMS), handed to the domain as a plain number."""
    if route.name == PACKAGE_PURCHASE.name:
        return functools.partial(
            package_purchase.handle, max_queued_items=settings.max_queued_items
        )
    return HANDLERS[route.name]


def pipeline_for(
    settings: Settings, svc: Services, route: Route, policy: RetryPolicy | None = None
) -> DeliveryPipeline:
    return DeliveryPipeline(
        svc.pool,
        route,
        handler_for(settings, route),
        policy or policy_for(settings, route.name),
        max_body_bytes=settings.max_body_bytes,
        ttr=settings.ttr_for(route.name),
        trusted_publisher=settings.amqp_user,
        usage_dedup_days=settings.usage_dedup_days,
        # Twice what the route's consumers can hold unacknowledged at once: a delivery still
        # buffered is never forgotten before its batch (infra/rabbit/consumer.py).
        ahead_limit=2
        * settings.partitions_for(route.name)
        * max(settings.prefetch_for(route.name), settings.batch_max_for(route.name)),
    )


async def run_consumers(
    settings: Settings,
    svc: Services,
    routes: Iterable[Route],
    stop: asyncio.Event,
    *,
    ingest: bool = True,
    pipelines: dict[str, DeliveryPipeline] | None = None,
    rebalance: bool = True,
) -> int:
    """Consume until `stop` is set (exit code 0) or a consumer's worker dies (exit code 1).

    `ingest`: also run the dead-letter ingester. `pipelines`: per-route overrides (tests).
    `rebalance`: a partitioned route's partitions are shared with the route's other live
    replicas (consumers/rebalance.py), unless this replica is pinned (`--replica I/N`).
    """
    try:
        # A RabbitMQ connection lost during start-up is waited out, as once running: only a
        # broker's refusal (the topology declared otherwise) ends the process.
        await through_outages(svc.amqp, lambda: _declare(settings, svc), stop, what="exchanges")
        dead_letters = await through_outages(
            svc.amqp,
            lambda: Publisher.open(svc.amqp, settings.dlx, user_id=settings.amqp_user),
            stop,
            what="dead-letter publisher",
        )
    except StoppingError:
        return 0
    consumers: list[QueueConsumer] = []
    standby: list[QueueConsumer] = []
    resume_after: dict[str, float] = {}
    """Routes whose breaker resumes them by itself: after how many seconds."""
    elastic: list[ElasticRoute] = []
    for route in routes:
        pipeline = (pipelines or {}).get(route.name) or pipeline_for(settings, svc, route)
        processor: Processor = pipeline.process_batch
        breaker = settings.breaker_for(route.name)
        if breaker is not None:
            worker = f"{socket.gethostname()}:{os.getpid()}"
            processor = Breaker(svc.pool, route.name, breaker, worker).wrap(processor)
            if breaker.resume_after_s is not None:
                resume_after[route.name] = breaker.resume_after_s
        partitions = settings.partitions_for(route.name)
        make = functools.partial(
            route_consumer,
            route,
            settings,
            svc.amqp,
            processor,
            dead_letters,
            idle=pipeline.drain_parked,
            ahead=pipeline.take_ahead,
        )
        if rebalance and settings.replica is None and partitions > 1:
            elastic.append(ElasticRoute(route.name, partitions, _by_partition(make)))
            continue
        for partition in range(partitions):
            consumer = make(partition=partition)
            (consumers if settings.preferred(partition) else standby).append(consumer)
    if ingest:
        consumers.append(ingester(settings, svc.pool, svc.amqp))
    started: list[QueueConsumer] = []
    """The consumers started so far: the pause watch's (it reads the list each round)."""
    pauses = PauseWatch(svc.pool, started, settings.pause_poll, resume_after)
    if not await _first_read(pauses, stop):  # a paused route's consumers start paused
        await dead_letters.close()
        return 0
    fixed: list[str] = []
    """The queues this process consumes whatever the other replicas do."""

    async def record(keys: list[str]) -> None:
        await svc.set_routes([*fixed, *keys])

    rebalancer = Rebalancer(svc.pool, svc.worker_id, elastic, started, pauses, record=record)
    rebalancing: asyncio.Task[None] | None = None

    def ready() -> bool:
        """Consuming from every assigned queue (the status port adds that Postgres answers)."""
        return (
            all(c in started for c in consumers)
            and all(c.consuming for c in started)
            and (not elastic or rebalancer.ready())
        )

    status = await start_status_server(settings, ready, svc)
    watch: asyncio.Task[None] | None = None
    systemd = Notifier()
    systemd.start_watchdog()

    async def start_all() -> None:
        for consumer in consumers:
            await consumer.start(paused=pauses.holds(consumer))
            started.append(consumer)

    try:
        if not await _unless_stopped(start_all(), stop):
            return 0
        watch = asyncio.create_task(pauses.run(), name="pause-watch")
        fixed.extend(c.name for c in consumers)
        if elastic:
            rebalancing = asyncio.create_task(rebalancer.run(stop), name="rebalance")
            if not await _unless_stopped(_first_rebalance(rebalancer, rebalancing), stop):
                return 0
        log.info(
            "ready",
            routes=[c.name for c in consumers],
            elastic=[r.name for r in elastic],
            partitions=rebalancer.keys(),
            paused=sorted(pauses.paused),
        )
        await record(rebalancer.keys())
        systemd.ready(f"consuming {len(consumers)} queue(s)")
        if standby:
            # Single-active-consumer makes the first subscriber of a queue its consumer: the
            # replicas that prefer a partition subscribe first, the others stand by for it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=settings.standby_delay)
            with contextlib.suppress(Exception):  # else as last read: the watch corrects it
                await pauses.read()
            for consumer in standby:
                if stop.is_set():
                    break
                if not await _unless_stopped(consumer.start(paused=pauses.holds(consumer)), stop):
                    await consumer.stop()  # its half-made channel
                    break
                consumers.append(consumer)
                started.append(consumer)
            log.info("standing_by", routes=[c.name for c in standby])
        waiters: list[asyncio.Future[Any]] = [
            asyncio.ensure_future(stop.wait()),
            asyncio.ensure_future(rebalancer.failed.wait()),
        ]
        waiters += [asyncio.ensure_future(c.failed.wait()) for c in consumers]
        if rebalancing is not None:
            waiters.append(rebalancing)
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
        return 0 if stop.is_set() else 1
    finally:
        if watch is not None:
            watch.cancel()
        if rebalancing is not None:
            rebalancing.cancel()
        systemd.stopping()
        if status is not None:
            status.draining = True
        await asyncio.gather(
            rebalancer.close(), *(c.stop() for c in consumers), return_exceptions=True
        )
        with contextlib.suppress(Exception):  # bounded: the broker may be down
            await asyncio.wait_for(dead_letters.close(), timeout=2)
        log.info("stopped", processed={c.name: c.processed for c in consumers})
        if status is not None:
            await status.stop()
        await systemd.stop_watchdog()


def _by_partition(make: Callable[..., QueueConsumer]) -> Callable[[int], QueueConsumer]:
    """`make(partition=k)`, called as `f(k)`."""
    return lambda partition: make(partition=partition)


async def _first_rebalance(rebalancer: Rebalancer, rebalancing: asyncio.Task[None]) -> None:
    """Wait until the rebalance loop has read the live replicas once and subscribed to this
    replica's partitions (however long an outage makes that take), or has ended."""
    assigned = asyncio.ensure_future(rebalancer.assigned.wait())
    try:
        await asyncio.wait({assigned, rebalancing}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        assigned.cancel()


async def _declare(settings: Settings, svc: Services) -> None:
    channel = await svc.amqp.channel()
    try:
        await declare_exchanges(channel, settings)
    finally:
        with contextlib.suppress(Exception):  # bounded: the connection may be gone
            await asyncio.wait_for(channel.close(), timeout=2)


async def _first_read(pauses: PauseWatch, stop: asyncio.Event) -> bool:
    """Read the paused routes before any consumer starts, waiting out a Postgres outage (on
    pauses that end once the process's probe finds the database back). False: stopped first."""
    waits = OutagePauses(STARTUP_FIRST_PAUSE_S, STARTUP_LONGEST_PAUSE_S)
    while not stop.is_set():
        try:
            await pauses.read()
        except Exception as exc:
            if not is_transient(exc):
                raise
            log.warning("pause_watch_failed", error=repr(exc), retry_in_s=waits.current)
            await waits.wait(exc, stop)
        else:
            return True
    return False


async def _unless_stopped(work: Awaitable[None], stop: asyncio.Event) -> bool:
    """Run `work` to its end, unless `stop` is set first (then it is cancelled: a consumer
    that waits for RabbitMQ to come back while it starts never holds up a SIGTERM). Whether
    it ended; its error, if it raised."""
    doing = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({doing, stopping}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the caller was cancelled: so is the work
        doing.cancel()
        raise
    finally:
        stopping.cancel()
    if doing.done():
        doing.result()
        return True
    doing.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await doing
    return False
