"""Real processes under least privilege: `pkgq run`, `pkgq relay` and `pkgq dlq` connect as
the runtime role, and a grant revoked under a running consumer makes its route wait and say so
loudly, burying nothing, until the grant is back."""

from __future__ import annotations

import json
from collections.abc import Callable
from uuid import uuid4

import asyncpg
import pytest

from infra.settings import Settings
from tests.support import pg_roles
from tests.support.deliveries import add_package
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, cli

pytestmark = pytest.mark.e2e


async def _backend_roles(pool: asyncpg.Pool, database: str) -> set[str]:
    rows = await pool.fetch(
        "SELECT DISTINCT usename FROM pg_stat_activity "
        "WHERE datname = $1 AND application_name LIKE 'pkgq:%'",
        database,
    )
    return {r["usename"] for r in rows}


async def test_run_relay_and_dlq_connect_as_the_runtime_role_never_as_the_owner(
    settings: Settings, pool: asyncpg.Pool, spawn: Callable[..., PkgqProcess]
) -> None:
    database = settings.postgres_dsn.rsplit("/", 1)[1]
    run = spawn("run")
    relay = spawn("relay")

    async def both_registered() -> bool:
        count = await pool.fetchval("SELECT count(*) FROM telecom.workers WHERE stopped_at IS NULL")
        return bool(count == 2)

    await eventually(both_registered, within=60)
    assert await _backend_roles(pool, database) == {pg_roles.RUNTIME}
    listed = await cli(settings, "dlq", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []
    assert relay.terminate() == 0, relay.logs()
    assert run.terminate() == 0, run.logs()


async def test_a_revoked_grant_makes_a_running_consumer_wait_and_log_an_error_not_bury(
    settings: Settings, pool: asyncpg.Pool, spawn: Callable[..., PkgqProcess]
) -> None:
    package_id = await add_package(pool, 1024)
    await pool.execute(f"REVOKE INSERT, UPDATE ON telecom.package_queue FROM {pg_roles.RUNTIME}")
    run = spawn("run", "package_purchase")
    user = uuid4()
    body = {"user_id": str(user), "package_id": package_id, "amount": 1}
    published = await cli(settings, "publish", "package_purchase", json.dumps(body))
    assert published.returncode == 0, published.stderr

    async def waiting_loudly() -> bool:
        lines = [json.loads(x) for x in run.logs().splitlines() if x.startswith("{")]
        return any(
            e.get("event") == "infrastructure_unavailable"
            and e.get("level") == "error"
            and "InsufficientPrivilegeError" in e.get("error", "")
            for e in lines
        )

    await eventually(waiting_loudly, within=60)
    assert await pool.fetchval("SELECT count(*) FROM telecom.dead_letters") == 0
    assert await pool.fetchval("SELECT count(*) FROM telecom.inbox") == 0

    await pool.execute(f"GRANT INSERT, UPDATE ON telecom.package_queue TO {pg_roles.RUNTIME}")

    async def applied() -> bool:
        count = await pool.fetchval(
            "SELECT count(*) FROM telecom.package_queue WHERE user_id = $1", user
        )
        return bool(count == 1)

    await eventually(applied, within=60)
    assert await pool.fetchval("SELECT count(*) FROM telecom.dead_letters") == 0
    assert run.terminate() == 0, run.logs()
