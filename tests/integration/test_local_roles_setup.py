"""The dev box's role setup (deploy/local/roles.sql and handover.sql, run by
ensure-services.sh): it creates both roles, is idempotent, and hands a database migrated before
roles existed to the owner, who can then migrate it and grant the runtime role."""

from __future__ import annotations

import subprocess
from pathlib import Path
from uuid import uuid4

import asyncpg
import pytest

from infra.postgres.migrate import migrate
from infra.settings import Settings
from tests.support import pg_roles

LOCAL = Path(__file__).resolve().parents[2] / "deploy" / "local"


def _psql(dsn: str, script: str, **variables: str) -> None:
    args = ["psql", "-d", dsn, "-v", "ON_ERROR_STOP=1", "-qAt", "-f", str(LOCAL / script)]
    for name, value in variables.items():
        args += ["-v", f"{name}={value}"]
    subprocess.run(args, check=True, capture_output=True, timeout=60)


async def test_the_dev_box_setup_creates_the_roles_and_hands_an_older_database_to_the_owner(
    settings: Settings,
) -> None:
    server = settings.postgres_dsn.rsplit("/", 1)[0]
    name = f"pkgq_t_setup_{uuid4().hex[:8]}"
    owner, runtime = f"{name}_owner", f"{name}_rt"
    admin = await asyncpg.connect(f"{server}/postgres")
    try:
        await admin.execute(f"CREATE DATABASE {name}")
        old = await asyncpg.connect(f"{server}/{name}")  # as before roles: all superuser
        try:
            await migrate(old)
        finally:
            await old.close()

        for _ in range(2):  # ensure-services runs on every `make`
            _psql(f"{server}/postgres", "roles.sql", owner=owner, runtime=runtime, db=name)
            _psql(f"{server}/{name}", "handover.sql", owner=owner)

        as_owner = await asyncpg.connect(pg_roles.as_role(f"{server}/{name}", owner))
        try:
            assert await migrate(as_owner, runtime_role=runtime) == []
        finally:
            await as_owner.close()
        as_runtime = await asyncpg.connect(pg_roles.as_role(f"{server}/{name}", runtime))
        try:
            await as_runtime.execute(
                "INSERT INTO telecom.queue_users (user_id) VALUES ($1)", uuid4()
            )
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await as_runtime.execute("CREATE TABLE telecom.intruder (id int)")
        finally:
            await as_runtime.close()
        flags = await admin.fetch(
            "SELECT rolname, rolsuper, rolcreatedb FROM pg_roles WHERE rolname = ANY($1)",
            [owner, runtime],
        )
        assert {r["rolname"]: (r["rolsuper"], r["rolcreatedb"]) for r in flags} == {
            owner: (False, True),  # a dev box's `pkgq migrate` creates the database
            runtime: (False, False),
        }
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.execute(f"DROP ROLE IF EXISTS {runtime}")
        await admin.execute(f"DROP ROLE IF EXISTS {owner}")
        await admin.close()
