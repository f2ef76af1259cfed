"""How a command runs: its settings (with logging set up), its one event loop, and the
short-lived connections it works through. Errors that mean the broker or the database is not
as pkgq needs it end the command with exit status 6, and one that cannot be reached with
status 9 and one line naming it, whichever command met them."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar
from uuid import UUID

import asyncpg
from aiormq.exceptions import AMQPError

from consumers import publishing
from consumers.cli import exit_codes
from events.models import WireModel
from events.routes import Route
from infra import event_loop, faults
from infra.jobs import Jobs
from infra.logging import configure_logging
from infra.postgres import route_partitions
from infra.postgres.migrate import RuntimeRoleMissingError
from infra.postgres.pool import Conn, create_pool, database
from infra.rabbit.connection import open_amqp
from infra.rabbit.topology import TopologyMismatchError
from infra.settings import Settings
from infra.settings.replicated import PartitionMapMismatchError
from infra.tls import TlsError
from infra.transient import is_outage

T = TypeVar("T")


def load_settings(*, logs_to_stdout: bool = False) -> Settings:
    """Settings, with logging set up: to stdout for long-running processes, else stderr; and
    the crash tests' faults enabled, if PKGQ_FAULTS names any."""
    settings = Settings.load()
    faults.configure(settings.faults)
    event_loop.choose(settings.event_loop)
    configure_logging(
        settings.log_format, settings.log_level, sys.stdout if logs_to_stdout else sys.stderr
    )
    return settings


def load_routing_settings(*, logs_to_stdout: bool = False) -> Settings:
    """load_settings() with the deployment's recorded partition map (one SELECT): for the
    commands that publish or read a route's queues, so that they use the map every process of
    the deployment uses (a map configured here that disagrees ends the command, status 6)."""
    settings = load_settings(logs_to_stdout=logs_to_stdout)
    return on_database(
        settings, lambda conn: route_partitions.with_recorded_partitions(conn, settings)
    )


def run(work: Coroutine[Any, Any, T]) -> T:
    """Run a command's async work to its end on the chosen event loop (infra/event_loop.py):
    the one way the CLI runs async code."""
    try:
        with asyncio.Runner(loop_factory=event_loop.loop_factory()) as runner:
            return runner.run(work)
    except (TopologyMismatchError, RuntimeRoleMissingError, PartitionMapMismatchError) as exc:
        exit_codes.fail(exit_codes.MISMATCH, exc)
    except TlsError as exc:  # one line that says what to check, no traceback
        exit_codes.fail(exit_codes.USAGE, exc)
    except Exception as exc:
        if not is_outage(exc):
            raise
        exit_codes.fail(exit_codes.UNREACHABLE, unreachable(exc))


def unreachable(exc: BaseException) -> str:
    """One line for a service that did not answer: which one (as far as the error tells), what
    it said, and where to look."""
    if isinstance(exc, AMQPError):
        return (
            f"RabbitMQ did not answer ({exc}): check that it runs and that PKGQ_AMQP_URL "
            "points at it"
        )
    if isinstance(exc, asyncpg.PostgresError | asyncpg.InterfaceError):
        return (
            f"PostgreSQL did not answer ({exc}): check that it runs and that PKGQ_POSTGRES_DSN "
            "points at it"
        )
    return (
        f"RabbitMQ or PostgreSQL did not answer ({exc}): check that both run and that "
        "PKGQ_AMQP_URL and PKGQ_POSTGRES_DSN point at them"
    )


async def connected(settings: Settings, call: Callable[[Conn], Awaitable[T]]) -> T:
    """`call` on a short-lived connection to the pkgq database, as the runtime role."""
    async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
        return await call(conn)


def on_database(settings: Settings, call: Callable[[Conn], Awaitable[T]]) -> T:
    """Run one read or write (`call`) on a short-lived connection of its own."""
    return run(connected(settings, call))


def with_jobs(settings: Settings, work: Callable[[Jobs], Awaitable[T]]) -> T:
    """Run `work` with the publishing API on a small pool (one command's worth)."""

    async def go() -> T:
        pool = await create_pool(
            settings.postgres_dsn, min_size=1, max_size=2, session=settings.postgres_session()
        )
        try:
            return await work(Jobs(pool))
        finally:
            await pool.close()

    return run(go())


async def publish(
    settings: Settings,
    route: Route,
    body: WireModel,
    *,
    message_id: UUID | None = None,
    schema_version: int | None = None,
) -> UUID:
    """Publish one message straight to the exchange, with a confirm; its message_id.
    `schema_version`: the version `body` is of (None: the route's current one)."""
    conn = await open_amqp(settings, "pkgq-cli")
    try:
        return await publishing.publish(
            settings, conn, route, body, message_id=message_id, schema_version=schema_version
        )
    finally:
        await conn.close()
