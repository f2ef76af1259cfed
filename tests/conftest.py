"""Shared fixtures: every test gets its own database and its own RabbitMQ names.

The database is copied from a migrated template (fast), the exchange and queues carry a unique
prefix, and both are removed afterwards, so tests never see each other's data or messages.
"""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import AsyncIterator, Iterator
from uuid import uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection
from hypothesis import settings as hypothesis_settings

from infra.postgres.migrate import migrate
from infra.postgres.pool import create_pool
from infra.rabbit import wire
from infra.rabbit.connection import connect
from infra.rabbit.tap import Tap
from infra.rabbit.topology import declare_all
from infra.settings import Settings
from tests.support import pg_roles
from tests.support.broker_cleanup import BrokerCleanup
from tests.support.broker_users import delete_namespaces
from tests.support.in_process import InProcess, StartApp
from tests.support.test_databases import TestDatabases

PG_SERVER = os.environ.get("PKGQ_TEST_PG_SERVER", "postgresql://postgres@127.0.0.1:5432")
AMQP_URL = os.environ.get("PKGQ_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
TEMPLATE = f"pkgq_test_template_{uuid4().hex[:8]}"
"""One per test session, so that two sessions on one machine never drop each other's."""

# No property test has a deadline. Hypothesis's default (200 ms per example) is a timing
# assertion, and on a loaded 2-core machine one example can stall past it: it failed a
# test_frame_decode run once ("Unreliable test timings", 264 ms, then 0.2 ms). A test's own
# @settings keeps its example count and inherits this.
hypothesis_settings.register_profile("pkgq", deadline=None)
hypothesis_settings.load_profile("pkgq")


async def _admin() -> asyncpg.Connection:
    return await asyncpg.connect(f"{PG_SERVER}/postgres")


async def _build_template() -> None:
    """The session's roles, then the template: owned by the owner role and migrated by it, as
    `pkgq migrate` does, granting the runtime role. Databases copied from it keep the grants."""
    admin = await _admin()
    try:
        await admin.execute(pg_roles.CREATE_SQL)
        await admin.execute(f"CREATE DATABASE {TEMPLATE} OWNER {pg_roles.OWNER}")
    finally:
        await admin.close()
    conn = await asyncpg.connect(pg_roles.as_role(f"{PG_SERVER}/{TEMPLATE}", pg_roles.OWNER))
    try:
        await migrate(conn, runtime_role=pg_roles.RUNTIME)
    finally:
        await conn.close()


async def _drop_template() -> None:
    admin = await _admin()
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
        for role in (pg_roles.RUNTIME, pg_roles.OWNER):
            try:
                await admin.execute(f"DROP ROLE IF EXISTS {role}")
            except asyncpg.DependentObjectsStillExistError as exc:
                # A database a test left behind still holds grants to it: keep the role.
                warnings.warn(f"role {role} kept: {exc}", stacklevel=1)
    finally:
        await admin.close()


_NAMESPACES: set[str] = set()
"""The namespaces this session's tests used (this worker's, under xdist)."""


@pytest.fixture(scope="session", autouse=True)
def wire_accelerator() -> bool:
    """PKGQ_WIRE_ACCELERATOR decides, once per process, whether aiormq runs with pkgq's wire
    accelerator (infra/rabbit/wire/): decided here, before any test connects, so a run with
    it set to false (run-suite.sh runs the delivery tests that way too) never installs it."""
    return wire.install(Settings().wire_accelerator)


@pytest.fixture(scope="session", autouse=True)
def broker_leftovers() -> Iterator[None]:
    """At the end of the session, whatever the tests declared under a queue prefix or a
    partition count they switched to (a test's own clean-up deletes its settings' names)."""
    yield
    if _NAMESPACES:
        asyncio.run(delete_namespaces(_NAMESPACES))


@pytest.fixture(scope="session")
def template_db() -> Iterator[str]:
    asyncio.run(_build_template())
    yield TEMPLATE
    asyncio.run(_drop_template())


def _broker_names(namespace: str) -> dict[str, object]:
    return {"exchange": f"{namespace}.telecom", "queue_prefix": f"{namespace}.pkgq"}


def make_settings(namespace: str, **overrides: object) -> Settings:
    """The test's settings. `postgres_dsn` is the superuser's, for fixtures that arrange and
    inspect; the `pkgq` processes a test spawns connect as the runtime role instead
    (tests/support/processes.py, settings_env), and migrate as the owner."""
    values: dict[str, object] = {
        "postgres_dsn": f"{PG_SERVER}/{namespace}",
        "migrate_dsn": pg_roles.as_role(f"{PG_SERVER}/{namespace}", pg_roles.OWNER),
        "runtime_role": pg_roles.RUNTIME,
        "amqp_url": AMQP_URL,
        **_broker_names(namespace),
        "relay_poll_interval": 0.2,
        "drain_timeout": 10.0,
        "log_format": "json",
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]  # keys are Settings fields


@pytest.fixture(scope="session")
def databases(template_db: str) -> Iterator[TestDatabases]:
    """This worker's maker of test databases (tests/support/test_databases.py)."""
    # WAL_LOG (PostgreSQL 15's default) writes the template's pages to the WAL; FILE_COPY
    # copies its files, faster alone (0.18 s against 0.30 s here) but it forces two
    # checkpoints, which flush every other test's dirty pages too: with 4 workers the
    # parallel part took 345 and 351 s with WAL_LOG, 359 s with FILE_COPY (same tree, one
    # machine, back to back). PKGQ_TEST_DB_STRATEGY picks the other to measure again.
    strategy = os.environ.get("PKGQ_TEST_DB_STRATEGY", "WAL_LOG")
    if strategy not in ("WAL_LOG", "FILE_COPY"):
        raise ValueError(f"PKGQ_TEST_DB_STRATEGY={strategy!r}: WAL_LOG or FILE_COPY")

    def create_sql(name: str) -> str:
        return (
            f"CREATE DATABASE {name} TEMPLATE {template_db} OWNER {pg_roles.OWNER} "
            f"STRATEGY {strategy}"
        )

    # Made here: the clean-up's thread must not build Settings, which reads os.environ while
    # pytest changes PYTEST_CURRENT_TEST in it (a KeyError now and then).
    base = make_settings("pkgq_t_none")
    cleanup = BrokerCleanup(AMQP_URL, lambda name: base.model_copy(update=_broker_names(name)))
    found = TestDatabases(f"{PG_SERVER}/postgres", create_sql, cleanup, cleanup.close)
    yield found
    found.close()


@pytest.fixture
async def settings(databases: TestDatabases) -> AsyncIterator[Settings]:
    """The test's own database (made while the previous test ran) and broker names, both
    removed after it off the test's path."""
    namespace = databases.take()
    yield make_settings(namespace)
    databases.give_back(namespace)
    _NAMESPACES.add(namespace)  # the rest goes at the end of the session (broker_leftovers)


@pytest.fixture
async def pool(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(settings.postgres_dsn, min_size=1, max_size=5)
    yield pool
    await pool.close()


@pytest.fixture
async def amqp(settings: Settings) -> AsyncIterator[AbstractRobustConnection]:
    conn = await connect(settings.amqp_url, "pkgq-test")
    channel = await conn.channel()
    await declare_all(channel, settings)
    await channel.close()
    yield conn
    await conn.close()


@pytest.fixture
async def tap(settings: Settings, amqp: AbstractRobustConnection) -> AsyncIterator[Tap]:
    """Everything published to the test's exchange and dead-letter exchange."""
    tap = Tap()
    await tap.attach(amqp, settings.exchange, settings.dlx)
    yield tap
    await tap.close()


@pytest.fixture
async def in_process(pool: asyncpg.Pool, amqp: AbstractRobustConnection) -> AsyncIterator[StartApp]:
    """Build InProcess apps (consumers and relay in the test's loop); each one the test has not
    closed is closed after it, before the pool and the connection. (It takes `pool` and `amqp`
    for that order; an app may run on other settings, pools or connections.)"""
    apps: list[InProcess] = []

    def start(settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection) -> InProcess:
        app = InProcess(settings, pool, amqp)
        apps.append(app)
        return app

    yield start
    for app in reversed(apps):
        await app.close()
