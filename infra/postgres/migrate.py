"""Versioned SQL migrations: `migrations/NNNN_name.sql`, applied once each, in order.

A session advisory lock makes concurrent `pkgq migrate` runs (one per replica at start-up) safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from urllib.parse import unquote, urlsplit

import asyncpg
import structlog

from infra.settings import mask_url

log = structlog.get_logger(__name__)

MIGRATION_LOCK = 0x706B6771  # "pkgq"


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def available_migrations() -> list[Migration]:
    folder = resources.files("infra.postgres") / "migrations"
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            version, _, rest = entry.name.partition("_")
            found.append(Migration(int(version), rest.removesuffix(".sql"), entry.read_text()))
    return sorted(found, key=lambda m: m.version)


async def ensure_database(dsn: str) -> bool:
    """Create the DSN's database if it does not exist. Returns True if it was created."""
    name = unquote(urlsplit(dsn).path.lstrip("/"))
    if not name:
        raise ValueError(f"the DSN {mask_url(dsn)} names no database")
    try:
        conn = await asyncpg.connect(dsn)
    except asyncpg.InvalidCatalogNameError:
        pass
    else:
        await conn.close()
        return False
    admin = await asyncpg.connect(dsn, database="postgres")
    try:
        quoted = name.replace('"', '""')
        await admin.execute(f'CREATE DATABASE "{quoted}"')
    except asyncpg.DuplicateDatabaseError:
        return False
    finally:
        await admin.close()
    log.info("database_created", database=name, dsn=mask_url(dsn))
    return True


async def migrate(conn: asyncpg.Connection, target: int | None = None) -> list[int]:
    """Apply every migration not yet recorded, up to version `target` (None: all). Returns the
    versions applied by this call. A target lets a test build an older schema, fill it in the
    old shape and then migrate it forward."""
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK)
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
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO telecom.schema_migrations (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )
            log.info("migration_applied", version=migration.version, name=migration.name)
            applied.append(migration.version)
        return applied
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK)
