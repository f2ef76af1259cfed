"""Versioned SQL migrations: `migrations/NNNN_name.sql`, applied once each, in order.

A session advisory lock makes concurrent `pkgq migrate` runs (one per replica at start-up) safe;
it is polled for, not waited on (see `migrate`).

Expand, then contract: a release's migrations only add (tables, nullable or defaulted columns,
indexes built concurrently on a table that can be large), so the previous release keeps running
on the new schema during a rolling update; a removal waits for a later release
(tests/integration/test_migrations.py checks the new migrations and that they yield schema.sql).
A migration whose first line is `-- pkgq: no-transaction` runs outside a transaction, one
statement at a time (statements end with `;` at the end of a line): CREATE INDEX CONCURRENTLY
needs that. It must be safe to run again (IF NOT EXISTS), since it is recorded only at the end.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources

import asyncpg
import structlog
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_fixed

from infra.postgres import route_partitions
from infra.postgres.pool import connect
from infra.settings import mask_url
from infra.tls import parse_postgres_dsn

log = structlog.get_logger(__name__)

MIGRATION_LOCK = 0x706B6771  # "pkgq"


NO_TRANSACTION = "-- pkgq: no-transaction"


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def transactional(self) -> bool:
        return not self.sql.startswith(NO_TRANSACTION)

    def statements(self) -> list[str]:
        """The statements of a no-transaction migration, one by one."""
        parts = re.split(r";[ \t]*$", self.sql, flags=re.MULTILINE)
        found = []
        for part in parts:
            code = "\n".join(
                line for line in part.splitlines() if not line.strip().startswith("--")
            ).strip()
            if code:
                found.append(code)
        return found


def available_migrations() -> list[Migration]:
    folder = resources.files("infra.postgres") / "migrations"
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            version, _, rest = entry.name.partition("_")
            found.append(Migration(int(version), rest.removesuffix(".sql"), entry.read_text()))
    return sorted(found, key=lambda m: m.version)


async def ensure_database(dsn: str) -> bool:
    """Create the DSN's database if it does not exist. Returns True if it was created. The
    DSN may name several hosts (`h1:5432,h2:5432/pkgq?target_session_attrs=read-write`) or
    name its database by `dbname=`."""
    name = parse_postgres_dsn(dsn).database
    if not name:
        raise ValueError(f"the DSN {mask_url(dsn)} names no database")
    try:
        conn = await connect(dsn, setting="PKGQ_MIGRATE_DSN")
    except asyncpg.InvalidCatalogNameError:
        pass
    else:
        await conn.close()
        return False
    admin = await connect(dsn, setting="PKGQ_MIGRATE_DSN", database="postgres")
    try:
        quoted = name.replace('"', '""')
        await admin.execute(f'CREATE DATABASE "{quoted}"')
    except asyncpg.DuplicateDatabaseError:
        # Made by a concurrent `pkgq migrate`, or already there on the primary while a
        # standby listed first has not replayed it: wait until the DSN finds it all the same.
        await _until_visible(dsn)
        return False
    finally:
        await admin.close()
    log.info("database_created", database=name, dsn=mask_url(dsn))
    await _until_visible(dsn)
    return True


async def _until_visible(dsn: str, within: float = 30.0) -> None:
    """Wait until a connection through `dsn` finds the new database. With several hosts, a
    standby listed before the primary replays CREATE DATABASE a moment after the primary
    commits it (a synchronous standby has the WAL, not yet applied), and asyncpg gives up on
    its "does not exist" instead of trying the next host: without this wait the migration that
    follows fails right after the database was made."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(asyncpg.InvalidCatalogNameError),
        stop=stop_after_delay(within),
        wait=wait_fixed(0.1),
        reraise=True,
    ):
        with attempt:
            conn = await connect(dsn, setting="PKGQ_MIGRATE_DSN")
            await conn.close()


class RuntimeRoleMissingError(Exception):
    """PKGQ_RUNTIME_ROLE names a role that does not exist (create it first:
    docs/how-to/provisioning.md)."""


PartitionsToRecord = Callable[[bool], Mapping[str, int]]
"""Given whether the deployment is new, the partition map to record for routes without one
(Settings.partitions_to_record)."""


async def migrate(
    conn: asyncpg.Connection,
    target: int | None = None,
    runtime_role: str = "",
    partitions: PartitionsToRecord | None = None,
    recorded_by: str = "pkgq migrate",
) -> list[int]:
    """Apply every migration not yet recorded, up to version `target` (None: all). Returns the
    versions applied by this call. A target lets a test build an older schema, fill it in the
    old shape and then migrate it forward.

    `runtime_role` (when not empty, and not the migrating role itself) is granted what pkgq's
    processes need, on every run, once migration 0007 is in (telecom.grant_runtime): so tables
    added later are always covered.

    `partitions` (`pkgq migrate` passes it; a test's template records nothing, so each test's
    settings keep their own map): once migration 0029 is in, record the deployment's partition
    map for every route that has none (route_partitions.record_missing, never overwriting).
    The deployment is new when this call found no migration applied before it: its schema
    did not exist, so no process and no publisher can have used a partition map on it yet.
    Data is not the test: a deployment that was migrated and started but has had no traffic
    yet already has its queues and its publishers' map."""
    # Polled rather than waited for: a session blocked in pg_advisory_lock holds a snapshot,
    # which a concurrent migrate's CREATE INDEX CONCURRENTLY would wait for (a deadlock).
    while not await conn.fetchval(  # noqa: ASYNC110  (a server-side lock: polled by design)
        "SELECT pg_try_advisory_lock($1)", MIGRATION_LOCK
    ):
        await asyncio.sleep(0.2)
    said = _Said()
    conn.add_log_listener(said)
    try:
        await conn.execute(
            """
            CREATE SCHEMA IF NOT EXISTS telecom;
            CREATE TABLE IF NOT EXISTS telecom.schema_migrations (
                version    integer PRIMARY KEY,
                name       text        NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            );
            """
        )
        rows = await conn.fetch("SELECT version FROM telecom.schema_migrations")
        done = {r["version"] for r in rows}
        applied = []
        for migration in available_migrations():
            if migration.version in done:
                continue
            if target is not None and migration.version > target:
                break
            said.running = migration
            if not migration.transactional:
                # An index build interrupted before (a crash, a cancel) leaves an invalid index
                # that IF NOT EXISTS would skip: drop it so the statement builds it again.
                for name in await conn.fetch(_INVALID_INDEXES):
                    await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name['name']}")
                for statement in migration.statements():
                    await conn.execute(statement)
            async with conn.transaction():
                if migration.transactional:
                    await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO telecom.schema_migrations (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )
            log.info("migration_applied", version=migration.version, name=migration.name)
            applied.append(migration.version)
        said.running = None
        if partitions is not None and (target is None or target >= ROUTE_PARTITIONS_VERSION):
            await _record_partitions(conn, partitions(not done), recorded_by)
        if runtime_role:
            await _grant_runtime(conn, runtime_role)
        return applied
    finally:
        conn.remove_log_listener(said)
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK)


ROUTE_PARTITIONS_VERSION = 29
"""The migration that adds telecom.route_partitions."""


async def _record_partitions(
    conn: asyncpg.Connection, partitions: Mapping[str, int], by: str
) -> None:
    added = await route_partitions.record_missing(conn, partitions, by)
    if added:
        log.info("partitions_recorded", recorded=added, by=by)


class _Said:
    """Logs what the migration being applied says (its NOTICEs: a repair's counts, say)."""

    def __init__(self) -> None:
        self.running: Migration | None = None

    def __call__(self, _: object, message: asyncpg.PostgresLogMessage) -> None:
        if self.running is not None:
            log.info(
                "migration_said",
                version=self.running.version,
                name=self.running.name,
                message=message.message,
            )


_INVALID_INDEXES = """
    SELECT format('%I.%I', n.nspname, c.relname) AS name
    FROM pg_index x
    JOIN pg_class c ON c.oid = x.indexrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'telecom' AND NOT x.indisvalid
"""


async def _grant_runtime(conn: asyncpg.Connection, role: str) -> None:
    if not await conn.fetchval("SELECT to_regprocedure('telecom.grant_runtime(name)') IS NOT NULL"):
        return  # a target below 0007: the grants come with it
    if role == await conn.fetchval("SELECT current_user"):
        return  # one role for everything: it owns the schema already
    if not await conn.fetchval("SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = $1)", role):
        raise RuntimeRoleMissingError(
            f"the runtime role {role!r} (PKGQ_RUNTIME_ROLE) does not exist: create it first "
            f"(docs/how-to/provisioning.md), or set PKGQ_RUNTIME_ROLE='' to grant nothing"
        )
    async with conn.transaction():
        await conn.execute("SELECT telecom.grant_runtime($1)", role)
    log.info("runtime_role_granted", role=role)
