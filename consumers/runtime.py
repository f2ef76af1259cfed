"""Start-up and shutdown shared by the long-running processes (`pkgq run`, `pkgq relay`).

Every such process is a registered worker (rsqueue's permits, infra/postgres/workers.py): it
has a row in telecom.workers, its Postgres connections carry `application_name = 'pkgq:<id>'`,
and a background task heartbeats that row and reaps stale peers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import structlog
from aio_pika.abc import AbstractRobustConnection

from consumers.worker import Services, WorkerHeartbeat
from events.routes import ROUTES
from infra import tracing
from infra.dependencies import POSTGRES, RABBITMQ, dependencies
from infra.observability import (
    CRITICAL_OBJECTIVE,
    DEAD_LETTERS,
    HELD_USERS,
    JOB_STATES,
    JOB_TRANSITIONS,
    OUTBOX_OLDEST,
    OUTBOX_PENDING,
    QUEUE_CONSUMERS,
    QUEUE_READY,
    RECONNECTS,
    StatusServer,
)
from infra.postgres import route_partitions, stats, transitions, workers
from infra.postgres.pool import (
    answers,
    create_pool,
    database,
    forget_if_demoted,
    watch_for_recovery,
)
from infra.rabbit.connection import open_amqp
from infra.rabbit.management import passive_figures
from infra.rabbit.topology import route_queues
from infra.settings import Settings
from infra.tls import TlsError
from infra.transient import OutagePauses, is_transient

log = structlog.get_logger(__name__)
T = TypeVar("T")

STARTUP_FIRST_PAUSE_S = 0.5
STARTUP_LONGEST_PAUSE_S = 5.0
"""The pauses between start-up attempts (each ended early by the database's probe)."""


async def _when_up(step: Callable[[], Awaitable[T]], seconds: float, *, postgres: bool = True) -> T:
    """`step()`, tried again after each transient failure until `seconds` have passed (then
    the last failure is raised; one that is not transient at once). The pauses grow from
    STARTUP_FIRST_PAUSE_S to STARTUP_LONGEST_PAUSE_S and end as soon as the process's probe
    finds the database back (infra/transient.OutagePauses): a process started while no host
    of a multi-host DSN takes writes starts within a probe interval of the new primary's
    promotion. `postgres=False`: a step that does not talk to Postgres (the probe would not
    tell when to try it again)."""
    deadline = time.monotonic() + seconds
    pauses = OutagePauses(STARTUP_FIRST_PAUSE_S, STARTUP_LONGEST_PAUSE_S, probed=postgres)
    while True:
        try:
            return await step()
        except Exception as exc:
            left = deadline - time.monotonic()
            if not is_transient(exc) or left <= 0:
                raise
            if isinstance(exc, TlsError):
                # A certificate not accepted is waited out like an outage, but said at once,
                # in one line: it does not clear by itself unless an operator fixes the
                # certificates or the settings.
                retry_in_s = round(min(pauses.current, left), 1)
                log.error("tls_failed", error=str(exc), retry_in_s=retry_in_s)  # noqa: TRY400
            await pauses.wait(exc, at_most=left)


async def with_partition_map(settings: Settings, wait_seconds: float | None = None) -> Settings:
    """`settings` with the deployment's recorded partition map (infra/postgres/route_partitions
    .py), read once at start-up on a connection of its own, waiting up to `wait_seconds`
    (default: the startup_wait setting) for Postgres. A map configured here that disagrees
    with it raises PartitionMapMismatchError at once. Every process that routes or consumes
    starts with it, so all of a deployment's processes use one map."""
    wait_seconds = settings.startup_wait if wait_seconds is None else wait_seconds

    async def read() -> Settings:
        async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
            return await route_partitions.with_recorded_partitions(conn, settings)

    # Before services() sets up the database's probe: these pauses end on their own timer.
    return await _when_up(read, wait_seconds, postgres=False)


@asynccontextmanager
async def services(
    settings: Settings, role: str, wait_seconds: float | None = None
) -> AsyncIterator[Services]:
    """Connect to Postgres and RabbitMQ, waiting up to `wait_seconds` (default: the
    startup_wait setting) for them to come up, and register this process as a worker that
    heartbeats until the block exits (then it is marked stopped). A TLS failure that outlasts
    the wait raises TlsError, whose text is the one line to show."""
    wait_seconds = settings.startup_wait if wait_seconds is None else wait_seconds
    worker_id = uuid.uuid4()
    host, pid = socket.gethostname(), os.getpid()
    name = f"pkgq-{role}@{host}:{pid}"
    tracing.configure_tracing(role)
    dependencies().service = role
    # What this process probes while it waits for Postgres, now and in every outage later.
    watch_for_recovery(
        settings.postgres_dsn, workers.application_name(worker_id), settings.dead_peer_timeout
    )
    pool = await _when_up(
        lambda: create_pool(
            settings.postgres_dsn,
            min_size=settings.pool_min_size,
            max_size=settings.pool_max_size,
            application_name=workers.application_name(worker_id),
            session=settings.postgres_session(),
            # Nothing on this pool keeps session state (tests/unit/test_session_state.py), so
            # a release skips asyncpg's reset: a round trip less per batch. An open
            # transaction is still rolled back.
            reset_session=False,
            dead_peer_timeout=settings.dead_peer_timeout,
        ),
        wait_seconds,
    )
    try:

        async def register() -> None:
            async with pool.acquire() as conn:
                try:
                    await workers.register(conn, worker_id, name, role, host, pid)
                except Exception as exc:
                    await forget_if_demoted(pool, exc)  # a read-only server: connect afresh
                    raise

        await _when_up(register, wait_seconds)
        dependencies().up(POSTGRES)
        amqp = await _when_up(lambda: open_amqp(settings, name), wait_seconds, postgres=False)
        amqp.reconnect_callbacks.add(lambda *_: RECONNECTS.inc())
        dependencies().up(RABBITMQ)
        svc = Services(pool, amqp, worker_id)
        heartbeat = WorkerHeartbeat(settings, svc, name, role, host, pid)
        beating = asyncio.create_task(heartbeat.run(), name="worker-heartbeat")
        reason = "exited"
        try:
            log.info(
                "connected",
                role=role,
                worker=name,
                worker_id=str(worker_id),
                postgres=settings.safe_postgres_dsn(),
                amqp=settings.safe_amqp_url(),
            )
            yield svc
        except BaseException as exc:
            reason = f"exited: {type(exc).__name__}"
            raise
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating
            await heartbeat.stop(reason)
            await amqp.close()
    finally:
        await pool.close()
        tracing.shutdown_tracing()


def consumed_queues(settings: Settings) -> list[str]:
    """Every queue pkgq's processes consume: each partition of each route (subscriber routes'
    queues are read by outside systems, if at all) and the dead-letter queue."""
    names = [name for route in ROUTES for name, _ in route_queues(settings, route)]
    return [*names, settings.dead_letter_queue]


async def refresh_queue_figures(settings: Settings, amqp: AbstractRobustConnection) -> None:
    """pkgq_queue_consumers and pkgq_queue_ready_messages (-1: the queue is missing)."""
    figures = await passive_figures(amqp, consumed_queues(settings))
    for name, found in figures.items():
        ready, consumers = found if found is not None else (-1, -1)
        QUEUE_READY.labels(queue=name).set(ready)
        QUEUE_CONSUMERS.labels(queue=name).set(consumers)


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT (the start of a graceful drain)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _request_stop, stop, sig)
    return stop


def _request_stop(stop: asyncio.Event, sig: signal.Signals) -> None:
    log.info("stopping", signal=sig.name)
    stop.set()


async def start_status_server(
    settings: Settings, ready: Callable[[], bool], svc: Services
) -> StatusServer | None:
    """The process's /metrics, /healthz and /readyz port, if `PKGQ_HTTP_PORT` is set.

    `ready`: the process's own state (consuming, publishing), without I/O. /readyz adds that
    Postgres answers, asked on a pool of the port's own, as the metrics refresh is: a probe
    never takes a connection a consumer's batch waits for, and a consumers' pool busy with a
    burst does not make the process look unready. The pool opens no connection before a
    probe or refresh needs one, and carries the worker's application_name (reaped with it).
    The refresh reads counters, indexes and statistics only (infra/postgres/stats.py), never a
    growing table row by row: every process runs it, every PKGQ_METRICS_REFRESH_INTERVAL.
    """
    if not settings.http_port:
        return None
    pool = await create_pool(
        settings.postgres_dsn,
        min_size=0,
        max_size=2,
        application_name=workers.application_name(svc.worker_id),
        command_timeout=10,  # the refresh is cut off after 10 s anyway
        dead_peer_timeout=settings.dead_peer_timeout,
    )

    async def readiness() -> bool:
        if not ready() or not dependencies().all_up():
            return False
        async with pool.acquire(timeout=2) as conn:
            return await answers(conn)

    async def refresh() -> None:
        async with pool.acquire(timeout=2) as conn:
            figures = await stats.backlog(conn)
        OUTBOX_PENDING.set(figures.outbox_pending)
        OUTBOX_OLDEST.set(figures.outbox_oldest_s)
        DEAD_LETTERS.clear()
        for route, count in figures.buried_by_route.items():
            DEAD_LETTERS.labels(route=route).set(count)
        HELD_USERS.clear()
        for (consumer, state), count in figures.held.items():
            HELD_USERS.labels(consumer=consumer, state=state).set(count)
        async with pool.acquire(timeout=2) as conn:
            per_route = await stats.per_route(conn)
            moves = await transitions.totals(conn)
        for route, found in per_route.counts.items():
            for state, value in {
                "ready": found.get("pending", 0),
                "waiting": found.get("scheduled", 0) + found.get("parked", 0),
                "buried": found.get("dead_letters", 0),
                "expired": found.get("expired", 0),
                "zombie": found.get("kept", 0),
            }.items():
                JOB_STATES.labels(route=route, state=state).set(value)
        for route, counted in moves.items():
            JOB_STATES.labels(route=route, state="done").set(counted.get("ack", 0))
            for move, value in counted.items():
                JOB_TRANSITIONS.labels(route=route, transition=move).set(value)
        await refresh_queue_figures(settings, svc.amqp)

    CRITICAL_OBJECTIVE.set(settings.critical_p99_objective_s)
    server = StatusServer(
        settings.http_host,
        settings.http_port,
        readiness,
        refresh,
        refresh_every=settings.metrics_refresh_interval,
        on_stop=pool.close,
    )
    try:
        await server.start()
    except BaseException:
        await pool.close()
        raise
    return server
