"""`pkgq migrate` through a multi-host DSN that lists the standby first (as it does after a
failover): the database it creates on the primary is found through the DSN before it migrates,
though the standby replays the creation a moment later."""

from __future__ import annotations

import asyncpg
import pytest

from infra.postgres.migrate import available_migrations
from infra.settings import Settings
from tests.support.ha_lab import Lab, lab
from tests.support.observing import eventually
from tests.support.processes import cli

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]


async def test_migrate_creates_and_migrates_a_database_through_a_dsn_listing_the_standby_first(
    the_lab: Lab, namespace: str
) -> None:
    primary = int(await lab("pg-primary"))
    standby = 5434 if primary == 5433 else 5433
    hosts = f"127.0.0.1:{standby},127.0.0.1:{primary}"
    dsn = f"postgresql://pkgq_owner@{hosts}/{namespace}?target_session_attrs=read-write"
    settings = Settings(postgres_dsn=dsn, migrate_dsn=dsn, runtime_role="pkgq_runtime")
    done = await cli(settings, "migrate", PKGQ_POSTGRES_DSN=dsn)
    assert done.returncode == 0, done.stdout + done.stderr
    conn = await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{primary}/{namespace}")
    try:
        applied = await conn.fetchval("SELECT count(*) FROM telecom.schema_migrations")
        in_recovery = await conn.fetchval("SELECT pg_is_in_recovery()")
    finally:
        await conn.close()
    assert applied == len(available_migrations())
    assert in_recovery is False

    # The standby has it too, once replayed: the same database on both servers.
    async def on_standby() -> bool:
        try:
            c = await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{standby}/{namespace}")
        except asyncpg.InvalidCatalogNameError:
            return False
        await c.close()
        return True

    await eventually(on_standby, within=5)
